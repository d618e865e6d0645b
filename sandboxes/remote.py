"""RemoteSandbox: a sandbox that lives on a sandbox server (``sandboxes/server.py``), over HTTP.

    sb = await make_sandbox("remote", url="http://10.0.0.5:8771", token=t, options={"memory_mb": 512})
    r = await sb.exec("pytest -x", timeout_s=600)             # same API as any Sandbox

Each method is one HTTP request (``agentrl.http.ApiClient``: bearer token, a client
per event loop, transport failures retried); requests about the sandbox also carry the token
its create returned (``X-Session-Token``), without which the server answers 403. Mutating
requests (create, exec, write_file, upload) carry a fresh request id that a retry reuses, so a
command never runs twice and a create retried after a lost response gets the sandbox the first
try made. The server's structured errors come back as the exceptions a local sandbox raises:
``FileNotFoundError``, ``IsADirectoryError``, ``PermissionError``, else ``SandboxError``. ``start_process`` gives a
``RemoteProcess`` whose reads long-poll the server, so the bash tool works unchanged, its
fork-bomb recovery included (``pids_in_use`` asks the server).
Files and directories move as request bodies (a tar for directories and downloads; links
that leave the tree are refused on extraction, as locally).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import os
import shutil
import tarfile
import tempfile
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import httpx2

from agentrl.errors import ConfigError, SandboxError
from agentrl.http import SESSION_HEADER, ApiClient, api_error
from agentrl.sandbox import ExecResult, Sandbox, SandboxProcess, SweepReport, new_name
from sandboxes._files import extract_tar

TOKEN_ENV = "AGENTRL_SANDBOX_TOKEN"
URL_ENV = "AGENTRL_SANDBOX_URL"
_EXC: dict[str, type[Exception]] = {
    "file_not_found": FileNotFoundError,
    "is_a_directory": IsADirectoryError,
    "permission_denied": PermissionError,
    "broken_pipe": BrokenPipeError,
}


class RemoteSandbox(Sandbox):
    kind = "remote"

    @dataclass(kw_only=True)
    class Config:
        url: str = ""
        """The sandbox server, e.g. http://127.0.0.1:8771 ("" = AGENTRL_SANDBOX_URL)."""
        token: str = ""
        """Bearer token ("" = the AGENTRL_SANDBOX_TOKEN environment variable, if set)."""
        options: dict[str, Any] = field(default_factory=dict)
        """Backend config for the server's sandbox, e.g. {"memory_mb": 512}; the server
        accepts only the keys it allows (limits, by default)."""
        exec_timeout_s: float = 120.0
        """Command timeout when exec() is given none."""
        http_timeout_s: float = 60.0
        """HTTP timeout of requests other than exec (exec waits its own timeout + this)."""
        retries: int = 3
        retry_backoff_s: float = 0.5

    def __init__(
        self, config: Config, api: ApiClient, sid: str, name: str, workdir: str, token: str = ""
    ) -> None:
        self.config = config
        self.api = api
        self._headers = {SESSION_HEADER: token} if token else {}  # this sandbox's own token
        self.id = sid
        self.name = name
        self.workdir = workdir
        self._closed = False
        self._pids_route = True  # False once the server answered that it has none

    @classmethod
    def _api(cls, config: Config) -> ApiClient:
        url = config.url or os.environ.get(URL_ENV, "")
        if not url:
            raise ConfigError(
                f"RemoteSandbox.Config.url is empty and {URL_ENV} is not set; "
                "point it at a sandbox server, e.g. url='http://127.0.0.1:8771' "
                "(python -m sandboxes.server)"
            )
        token = config.token or os.environ.get(TOKEN_ENV, "")
        return ApiClient(
            url,
            token,
            timeout_s=config.http_timeout_s,
            retries=config.retries,
            backoff_s=config.retry_backoff_s,
        )

    @classmethod
    async def create(cls, config: object, *, name: str | None = None) -> Self:
        if not isinstance(config, RemoteSandbox.Config):
            raise ConfigError(
                f"RemoteSandbox expects RemoteSandbox.Config, got {type(config).__name__}"
            )
        api = cls._api(config)
        name = name or new_name()
        body = {"name": name, "options": config.options, "request_id": uuid.uuid4().hex}
        try:
            r = await api.send("POST", "/sandboxes", json=body, timeout_s=config.http_timeout_s * 5)
        except BaseException:  # cancelled or unreachable: the server may make it anyway
            await asyncio.shield(cls._forget(api, name))
            raise
        out = _json(r)
        return cls(config, api, out["id"], out["name"], out["workdir"], out.get("token") or "")

    @staticmethod
    async def _forget(api: ApiClient, name: str) -> None:
        """Have the server close ``name`` now or as soon as it exists (best effort)."""
        with contextlib.suppress(Exception):
            await api.send("POST", "/sandboxes/sweep", json={"prefix": name}, timeout_s=10)
        await api.aclose()

    async def _post(
        self, op: str, *, timeout_s: float | None = None, **kwargs: Any
    ) -> httpx2.Response:
        if self._closed:
            raise SandboxError(f"sandbox {self.name} is closed")
        r = await self.api.send(
            "POST",
            f"/sandboxes/{self.id}/{op}",
            timeout_s=timeout_s,
            headers=self._headers,
            **kwargs,
        )
        _check(r)
        return r

    async def exec(
        self,
        cmd: str | list[str],
        *,
        timeout_s: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | str | None = None,
    ) -> ExecResult:
        timeout = self.config.exec_timeout_s if timeout_s is None else timeout_s
        data = stdin.encode() if isinstance(stdin, str) else stdin
        body = {
            "cmd": cmd,
            "timeout_s": timeout,
            "cwd": cwd,
            "env": dict(env) if env else None,
            "stdin_b64": base64.b64encode(data).decode() if data is not None else None,
            "request_id": uuid.uuid4().hex,
        }
        r = await self._post("exec", json=body, timeout_s=timeout + self.config.http_timeout_s)
        return ExecResult(**r.json())

    async def read_file(self, path: str) -> bytes:
        r = await self._post("read_file", json={"path": path})
        return base64.b64decode(r.json()["data_b64"])

    async def write_file(self, path: str, data: bytes | str, *, mode: int | None = None) -> None:
        blob = data.encode() if isinstance(data, str) else data
        body = {
            "path": path,
            "data_b64": base64.b64encode(blob).decode(),
            "mode": mode,
            "request_id": uuid.uuid4().hex,
        }
        await self._post("write_file", json=body)

    async def upload(self, local_path: str | os.PathLike[str], remote_path: str) -> None:
        """Copy a host file or directory into the sandbox."""
        src = Path(local_path)
        if src.is_dir():
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w") as tar:
                tar.add(src, arcname=".", recursive=True)
            payload = buf.getvalue()
        else:
            payload = src.read_bytes()
        params = {"path": remote_path, "is_dir": src.is_dir(), "request_id": uuid.uuid4().hex}
        await self._post("upload", params=params, content=payload)

    async def download(self, remote_path: str, local_path: str | os.PathLike[str]) -> None:
        """Copy a sandbox file or directory to ``local_path`` (links stay inside it)."""
        r = await self._post("download", json={"path": remote_path})
        dst = Path(local_path)
        with tempfile.TemporaryDirectory(dir=dst.parent) as tmp:
            try:  # never follows a link in the archive (see _files.extract_tar)
                extract_tar(io.BytesIO(r.content), Path(tmp) / "x")
            except SandboxError as e:
                raise SandboxError(f"refusing to download {remote_path}: {e}") from None
            (entry,) = (Path(tmp) / "x").iterdir()
            if dst.is_dir() and entry.is_dir():
                shutil.rmtree(dst)
            entry.replace(dst)

    async def start_process(
        self, argv: list[str], *, cwd: str | None = None, env: Mapping[str, str] | None = None
    ) -> RemoteProcess:
        r = await self._post(
            "processes", json={"argv": argv, "cwd": cwd, "env": dict(env) if env else None}
        )
        return RemoteProcess(self, r.json()["pid"])

    async def pids_in_use(self) -> tuple[int, int] | None:
        """The server's sandbox's (processes in use, pids limit), so the bash tool's fork-bomb
        recovery works remotely; None when its backend cannot tell or the server is older
        than the ``pids`` route."""
        if self._closed:
            raise SandboxError(f"sandbox {self.name} is closed")
        if not self._pids_route:
            return None
        r = await self.api.send(
            "POST", f"/sandboxes/{self.id}/pids", json={}, headers=self._headers
        )
        if r.status_code in (404, 405) and api_error(r)[0] == "http":  # no such route there
            self._pids_route = False
            return None
        out = _json(r)
        return None if out.get("used") is None else (int(out["used"]), int(out["limit"]))

    async def is_alive(self) -> bool:
        return not self._closed and await super().is_alive()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):  # the server's idle TTL closes it anyway
            await self.api.send("DELETE", f"/sandboxes/{self.id}", headers=self._headers)
        await self.api.aclose()

    @classmethod
    async def sweep(cls, prefix: str, config: object | None = None) -> SweepReport:
        if not isinstance(config, RemoteSandbox.Config):
            config = RemoteSandbox.Config()
        if not (config.url or os.environ.get(URL_ENV)):
            return SweepReport()
        api = cls._api(config)
        try:
            r = await api.send("POST", "/sandboxes/sweep", json={"prefix": prefix})
            return SweepReport(dirs=int(_json(r)["closed"]))
        finally:
            await api.aclose()


class RemoteProcess(SandboxProcess):
    """A process in a remote sandbox; ``read`` long-polls the server."""

    def __init__(self, sandbox: RemoteSandbox, pid: str) -> None:
        self._sb = sandbox
        self._pid = pid
        self._alive = True
        self._offset = 0  # output bytes received so far

    async def _op(self, op: str, **body: Any) -> dict[str, Any]:
        r = await self._sb._post(
            f"processes/{self._pid}/{op}", json=body, timeout_s=self._sb.config.http_timeout_s + 30
        )
        out: dict[str, Any] = r.json()
        self._alive = bool(out.get("alive", self._alive))
        return out

    async def write(self, data: bytes) -> None:
        await self._op("write", data_b64=base64.b64encode(data).decode())

    async def read(self, n: int = 65536) -> bytes:
        while True:
            out = await self._op("read", offset=self._offset, n=n, wait_s=20.0)
            if out["eof"]:
                self._alive = False
                return b""
            if out["data_b64"]:
                data = base64.b64decode(out["data_b64"])
                self._offset += len(data)
                return data

    async def interrupt(self) -> None:
        await self._op("interrupt")

    async def kill(self) -> None:
        if not self._alive:
            return
        self._alive = False
        with contextlib.suppress(SandboxError, OSError):  # gone with its sandbox already
            await self._sb._post(f"processes/{self._pid}/kill", json={})

    @property
    def alive(self) -> bool:
        return self._alive


def _check(r: httpx2.Response) -> None:
    if r.status_code < 400:
        return
    kind, msg = api_error(r)
    if r.status_code == 401:
        raise SandboxError(
            f"the sandbox server refused the token ({msg}); set "
            f"RemoteSandbox.Config.token or {TOKEN_ENV}"
        )
    raise _EXC.get(kind, SandboxError)(msg if kind in _EXC else f"{kind}: {msg}")


def _json(r: httpx2.Response) -> Any:
    _check(r)
    return r.json()
