"""The sandbox server: sandboxes of a local backend, driven over HTTP by ``RemoteSandbox``.

    python -m sandboxes.server --port 8771 --token "$AGENTRL_SANDBOX_TOKEN"   # on the sandbox host
    sb = await make_sandbox("remote", url="http://host:8771", token=...)     # anywhere else

    POST   /sandboxes                      {name, options, request_id} -> {id, name, workdir, token}
    POST   /sandboxes/{id}/exec            {cmd, timeout_s, cwd, env, stdin_b64, request_id}
    POST   /sandboxes/{id}/read_file       {path} -> {data_b64}
    POST   /sandboxes/{id}/write_file      {path, data_b64, mode, request_id}
    POST   /sandboxes/{id}/upload?path=&is_dir=&request_id=    body: the file, or a tar of a dir
    POST   /sandboxes/{id}/download        {path} -> a tar of the file or directory
    POST   /sandboxes/{id}/pids            -> {used, limit} (null, null: the backend cannot tell)
    POST   /sandboxes/{id}/processes       {argv, cwd, env} -> {pid}; then .../{pid}/write|read|
                                           interrupt|kill   (long-lived shells, e.g. the bash tool)
    DELETE /sandboxes/{id}                 POST /sandboxes/sweep {prefix}    GET /health (no auth)

Before a body is read, ``HttpGuard`` (``agentrl.http.guard``) checks the bearer token (401),
the sandbox's own token in ``X-Session-Token`` on every ``/sandboxes/{id}/...`` request (403;
issued by the create, on by default, so a client cannot drive another's sandbox), and the
body cap (413; uploads have a larger one). Each server sandbox is a sandbox of ``backend`` (default "local": bubblewrap + cgroups); the
client's name is kept, so ``sweep(prefix)`` reaches it. A create is idempotent by request id: a
retry (e.g. after a lost response) gets the sandbox the first try made, waiting for it if it is
still being made, and another request asking for a name in use is refused (409). A create
without a request id and with the name of an existing sandbox gets that sandbox (older clients),
unless per-sandbox tokens are on (the default): then it is refused (409) like any other.
Clients may set only the config keys
in ``allowed_options`` (limits, by default; never paths); the operator sets the rest of the
backend's config with ``--sandbox-option KEY=JSON`` (e.g. ``disk_mb=8192``). Mutating calls carry a request id
and a retried id is answered from a cache, so a command never runs twice. Failures travel as
``{"error": {"type", "message"}}``: file errors keep their Python type (``file_not_found``,
``is_a_directory``, ``permission_denied``), sandbox failures are ``sandbox_error``. Sandboxes
idle longer than ``idle_ttl_s`` are closed; stopping the server closes them all.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import io
import json
import logging
import re
import secrets
import tarfile
import tempfile
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from fastapi import APIRouter, FastAPI, Request, Response
from pydantic import BaseModel, Field

from agentrl.errors import ConfigError, SandboxError
from agentrl.http import (
    NO_DOCS,
    SESSION_HEADER,
    ApiError,
    HttpGuard,
    Refusal,
    ReplayCache,
    header,
    install_error_handlers,
    tokens_equal,
)
from agentrl.sandbox import Sandbox, build_config, make_sandbox, new_name, sandbox_class, sweep
from sandboxes._files import extract_tar
from sandboxes._server_processes import PipedProcess, process_routes

logger = logging.getLogger(__name__)

T = TypeVar("T")
TOKEN_ENV = "AGENTRL_SANDBOX_TOKEN"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
_FILE_ERRORS = {
    FileNotFoundError: (404, "file_not_found"),
    IsADirectoryError: (409, "is_a_directory"),
    PermissionError: (403, "permission_denied"),
}


class CreateRequest(BaseModel):
    name: str = ""
    options: dict[str, Any] = Field(default_factory=dict)
    request_id: str = ""


class ExecRequest(BaseModel):
    cmd: str | list[str]
    timeout_s: float | None = None
    cwd: str | None = None
    env: dict[str, str] | None = None
    stdin_b64: str | None = None
    request_id: str = ""


class PathRequest(BaseModel):
    path: str


class SweepRequest(BaseModel):
    prefix: str


class WriteRequest(BaseModel):
    path: str
    data_b64: str
    mode: int | None = None
    request_id: str = ""


@dataclass(eq=False)
class Entry:
    sandbox: Sandbox
    cache: ReplayCache[Any]
    procs: dict[str, PipedProcess] = field(default_factory=dict)
    last_used: float = field(default_factory=time.monotonic)
    busy: int = 0
    request_id: str = ""  # of the create that made it
    token: str = field(default_factory=lambda: secrets.token_urlsafe(32))  # X-Session-Token


class SandboxServer:
    """Sandboxes of one backend, served over HTTP; see the module docstring."""

    @dataclass(kw_only=True)
    class Config:
        token: str = ""
        """Bearer token required on every route but /health ("" = none; loopback only)."""
        backend: str = "local"
        allowed_options: list[str] = field(
            default_factory=lambda: [
                "memory_mb",
                "pids_max",
                "cpu_time_s",
                "file_size_mb",
                "nofile",
                "exec_timeout_s",
                "max_output_bytes",
                "max_file_bytes",
            ]
        )
        """Backend config keys a client may set per sandbox (add "allow_network" to allow it)."""
        max_sandboxes: int = 64
        idle_ttl_s: float = 1800.0
        replay_cache: int = 64
        """exec/write answers kept per sandbox for retried request ids."""
        reap_interval_s: float = 10.0
        sandbox_tokens: bool = True
        """Issue a token with each sandbox and answer 403 to requests about the sandbox without
        it (``X-Session-Token``); off, any holder of the bearer token may use any sandbox."""
        max_body_bytes: int = 64 << 20
        """Largest request body (exec stdin, write_file data, base64); larger ones get 413."""
        max_upload_bytes: int = 1 << 30
        """Largest upload body (a file, or a tar of a directory; held in memory once)."""

    def __init__(self, config: Config | None = None, sandbox_config: object | None = None):
        self.config = config or SandboxServer.Config()
        self.sandbox_config = sandbox_config
        self.entries: dict[str, Entry] = {}
        self.creating: set[str] = set()  # names being created
        self.doomed: set[str] = set()  # names swept while being created: closed when made
        self.creates: OrderedDict[str, asyncio.Task[tuple[str, Sandbox]]] = OrderedDict()
        """Creates by request id; a retry awaits the first try's task (never cancelled with
        its request, so a client that hung up still finds its sandbox on retry)."""
        self._reaper: asyncio.Task[None] | None = None

    # --- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        if self._reaper is None:
            self._reaper = asyncio.get_running_loop().create_task(self._reap_loop())

    async def close(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            await asyncio.gather(self._reaper, return_exceptions=True)
            self._reaper = None
        await asyncio.gather(*self.creates.values(), return_exceptions=True)  # then close them
        await asyncio.gather(*(self.remove(sid) for sid in list(self.entries)))

    async def _reap_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.reap_interval_s)
            now = time.monotonic()
            for sid, e in list(self.entries.items()):
                if e.busy == 0 and now - e.last_used > self.config.idle_ttl_s:
                    logger.info(
                        "sandbox %s idle for over %.0fs; closing it",
                        e.sandbox.name,
                        self.config.idle_ttl_s,
                    )
                    await self.remove(sid)

    # --- sandboxes -------------------------------------------------------------------------
    async def create(self, req: CreateRequest) -> tuple[str, Sandbox]:
        if not req.request_id:
            return await self._create(req)
        task = self.creates.get(req.request_id)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._create(req))
            self.creates[req.request_id] = task
            task.add_done_callback(lambda t: self._forget_create(req.request_id, t))
        return await asyncio.shield(task)

    def _forget_create(self, request_id: str, task: asyncio.Task[tuple[str, Sandbox]]) -> None:
        """Failed creates are forgotten (a retry tries again); old answers past 4x
        ``max_sandboxes`` too."""
        failed = task.cancelled() or task.exception() is not None
        if failed and self.creates.get(request_id) is task:
            del self.creates[request_id]
        while len(self.creates) > 4 * self.config.max_sandboxes:
            oldest = next(iter(self.creates))
            if not self.creates[oldest].done():
                break
            del self.creates[oldest]

    async def _create(self, req: CreateRequest) -> tuple[str, Sandbox]:
        if len(self.entries) >= self.config.max_sandboxes:
            raise ApiError(
                503,
                "too_many_sandboxes",
                f"{len(self.entries)} sandboxes are open (max_sandboxes); close some first",
            )
        refused = sorted(set(req.options) - set(self.config.allowed_options))
        if refused:
            raise ApiError(
                403,
                "option_refused",
                f"this server does not let clients set "
                f"{refused}; allowed: {self.config.allowed_options}",
            )
        if req.name and not _NAME.fullmatch(req.name):
            raise ApiError(
                400, "bad_name", f"sandbox name {req.name!r} is not [A-Za-z0-9_.-]{{1,128}}"
            )
        for sid, e in self.entries.items():
            if e.sandbox.name != req.name:
                continue
            if req.request_id or self.config.sandbox_tokens:  # never hand out another's
                raise ApiError(
                    409,
                    "name_taken",
                    f"a sandbox named {req.name} exists already "
                    "(made by another request); pick another name",
                )
            return sid, e.sandbox  # no request id: a retried create from an older client
        if req.name in self.creating:
            raise ApiError(
                409,
                "busy",
                f"sandbox {req.name} is being created by another "
                "request; pick another name or retry shortly",
            )
        name = req.name or new_name()
        self.creating.add(name)
        try:
            sb = await make_sandbox(
                self.config.backend, self.sandbox_config, name=name, **req.options
            )
        except ConfigError as e:
            raise ApiError(400, "config_error", str(e)) from e
        except SandboxError as e:
            raise ApiError(503, "sandbox_error", str(e)) from e
        finally:
            self.creating.discard(name)
        if name in self.doomed:  # swept while it was being made (its client gave up on it)
            self.doomed.discard(name)
            await sb.close()
            raise ApiError(410, "swept", f"sandbox {name} was swept while it was being created")
        sid = uuid.uuid4().hex
        self.entries[sid] = Entry(
            sandbox=sb, cache=ReplayCache(self.config.replay_cache), request_id=req.request_id
        )
        return sid, sb

    def authorize(self, scope: Any) -> Refusal | None:
        """403 for a request about a sandbox without that sandbox's token (before the body)."""
        parts = str(scope["path"]).split("/")  # ["", "sandboxes", id, ...]
        if not self.config.sandbox_tokens or len(parts) < 3 or parts[1] != "sandboxes":
            return None
        e = self.entries.get(parts[2])
        if e is None or tokens_equal(header(scope, SESSION_HEADER.lower().encode()), e.token):
            return None  # unknown ids (and /sandboxes/sweep) are the app's to answer
        return Refusal(
            403,
            "wrong_sandbox_token",
            f"sandbox {parts[2]} was created by another client: send the token "
            f"its create returned in {SESSION_HEADER}",
        )

    async def remove(self, sid: str) -> bool:
        e = self.entries.pop(sid, None)
        if e is None:
            return False
        for p in e.procs.values():
            with contextlib.suppress(Exception):
                await p.kill()
        try:
            await e.sandbox.close()
        except Exception:
            logger.exception("closing sandbox %s failed", e.sandbox.name)
        return True

    async def use(self, sid: str, fn: Callable[[Entry], Awaitable[T]], request_id: str = "") -> T:
        """Run ``fn`` on a sandbox, mapping failures to structured errors."""
        e = self.entries.get(sid)
        if e is None:
            raise ApiError(
                404,
                "unknown_sandbox",
                f"no sandbox {sid!r}: it was closed or idle "
                f"longer than {self.config.idle_ttl_s:g}s",
            )
        e.busy += 1
        try:
            seen = e.cache.get(request_id)
            if seen is not None:
                return await asyncio.shield(seen)  # type: ignore[no-any-return]
            return await e.cache.run(request_id, lambda: fn(e))  # type: ignore[no-any-return]
        except tuple(_FILE_ERRORS) as err:
            status, kind = _FILE_ERRORS[type(err)]
            raise ApiError(status, kind, str(err)) from err
        except (SandboxError, OSError) as err:
            raise ApiError(500, "sandbox_error", str(err)) from err
        finally:
            e.busy -= 1
            e.last_used = time.monotonic()

    # --- HTTP ------------------------------------------------------------------------------
    def app(self) -> FastAPI:
        @contextlib.asynccontextmanager
        async def lifespan(_: FastAPI) -> AsyncIterator[None]:
            await self.start()
            try:
                yield
            finally:
                await self.close()

        app = FastAPI(title="agentrl sandbox server", lifespan=lifespan, **NO_DOCS)
        install_error_handlers(app)
        app.get("/health")(lambda: {"ok": True, "sandboxes": len(self.entries)})
        app.include_router(_router(self))
        c = self.config
        guard = HttpGuard.Config(
            token=c.token,
            max_body_bytes=c.max_body_bytes,
            route_caps={"/sandboxes/*/upload": c.max_upload_bytes},
            cap_hint="raise the server's --max-body-mb or --max-upload-mb",
        )
        app.add_middleware(HttpGuard, config=guard, authorize=self.authorize)
        return app


def _router(srv: SandboxServer) -> APIRouter:
    r = APIRouter(prefix="/sandboxes")

    @r.post("")
    async def create(req: CreateRequest) -> dict[str, str]:
        sid, sb = await srv.create(req)
        e = srv.entries.get(sid)
        if e is None:
            raise ApiError(410, "swept", f"sandbox {sb.name} was closed as it was created")
        return {"id": sid, "name": sb.name, "workdir": sb.workdir, "token": e.token}

    @r.delete("/{sid}")
    async def remove(sid: str) -> dict[str, bool]:
        return {"closed": await srv.remove(sid)}

    @r.post("/{sid}/exec")
    async def exec_(sid: str, req: ExecRequest) -> dict[str, Any]:
        stdin = base64.b64decode(req.stdin_b64) if req.stdin_b64 is not None else None

        async def run(e: Entry) -> dict[str, Any]:
            res = await e.sandbox.exec(
                req.cmd, timeout_s=req.timeout_s, cwd=req.cwd, env=req.env, stdin=stdin
            )
            return {
                k: getattr(res, k)
                for k in (
                    "exit_code",
                    "stdout",
                    "stderr",
                    "timed_out",
                    "duration_s",
                    "truncated",
                    "oom_killed",
                )
            }

        return await srv.use(sid, run, req.request_id)

    @r.post("/{sid}/read_file")
    async def read_file(sid: str, req: PathRequest) -> dict[str, str]:
        data = await srv.use(sid, lambda e: e.sandbox.read_file(req.path))
        return {"data_b64": base64.b64encode(data).decode()}

    @r.post("/{sid}/write_file")
    async def write_file(sid: str, req: WriteRequest) -> dict[str, bool]:
        data = base64.b64decode(req.data_b64)
        await srv.use(
            sid, lambda e: e.sandbox.write_file(req.path, data, mode=req.mode), req.request_id
        )
        return {"ok": True}

    @r.post("/{sid}/pids")
    async def pids(sid: str) -> dict[str, int | None]:
        usage = await srv.use(sid, lambda e: e.sandbox.pids_in_use())
        return {"used": usage[0], "limit": usage[1]} if usage else {"used": None, "limit": None}

    _transfer_routes(r, srv)

    @r.post("/sweep")
    async def sweep_(req: SweepRequest) -> dict[str, int]:
        return {"closed": await _sweep(srv, req.prefix)}

    process_routes(r, srv)
    return r


def _transfer_routes(r: APIRouter, srv: SandboxServer) -> None:
    """upload (a file, or a tar of a directory, as the body) and download (a tar)."""

    @r.post("/{sid}/upload")
    async def upload(
        sid: str, request: Request, path: str, is_dir: bool = False, request_id: str = ""
    ) -> dict[str, bool]:
        body = await request.body()

        async def run(e: Entry) -> None:
            with tempfile.TemporaryDirectory(prefix="agentrl-upload-") as tmp:
                src = Path(tmp) / "payload"
                if is_dir:
                    try:  # never follows a link in the archive (see _files.extract_tar)
                        extract_tar(io.BytesIO(body), src)
                    except SandboxError as err:
                        raise SandboxError(f"refusing to upload {path}: {err}") from None
                else:
                    src.write_bytes(body)
                await e.sandbox.upload(src, path)

        await srv.use(sid, run, request_id)
        return {"ok": True}

    @r.post("/{sid}/download")
    async def download(sid: str, req: PathRequest) -> Response:
        async def run(e: Entry) -> bytes:
            with tempfile.TemporaryDirectory(prefix="agentrl-download-") as tmp:
                dst = Path(tmp) / Path(req.path).name
                await e.sandbox.download(req.path, dst)
                buf = io.BytesIO()
                with tarfile.open(fileobj=buf, mode="w") as tar:
                    tar.add(dst, arcname=dst.name, recursive=True)
                return buf.getvalue()

        return Response(await srv.use(sid, run), media_type="application/x-tar")


async def _sweep(srv: SandboxServer, prefix: str) -> int:
    if len(prefix) < 4:
        raise ApiError(400, "bad_prefix", f"sweep prefix {prefix!r} is too short")
    srv.doomed.update(n for n in srv.creating if n.startswith(prefix))
    victims = [sid for sid, e in srv.entries.items() if e.sandbox.name.startswith(prefix)]
    for sid in victims:
        await srv.remove(sid)
    await sweep(srv.config.backend, prefix, srv.sandbox_config)
    return len(victims)


def main(argv: list[str] | None = None) -> None:
    """``python -m sandboxes.server [--host H] [--port P] [--token T]``."""
    import os

    import uvicorn

    from agentrl.http import SERVER_LOOP, check_bind

    p = argparse.ArgumentParser(prog="python -m sandboxes.server", description=main.__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8771)
    p.add_argument("--token", default=os.environ.get(TOKEN_ENV, ""))
    p.add_argument("--backend", default="local")
    p.add_argument("--max-sandboxes", type=int, default=64)
    p.add_argument("--max-body-mb", type=float, default=64.0, help="largest request body")
    p.add_argument("--max-upload-mb", type=float, default=1024.0, help="largest upload body")
    p.add_argument(
        "--no-sandbox-tokens",
        action="store_true",
        help="no per-sandbox token: any holder of --token may use any sandbox",
    )
    p.add_argument(
        "--sandbox-option",
        action="append",
        default=[],
        metavar="KEY=JSON",
        help="the backend's config for every sandbox, e.g. disk_mb=8192 or "
        'seccomp=false or \'ro_paths=["/usr","/opt/venv"]\' (repeatable)',
    )
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    check_bind(a.host, a.token, token_env=TOKEN_ENV, serves="run commands in its sandboxes")
    cfg = SandboxServer.Config(
        token=a.token,
        backend=a.backend,
        max_sandboxes=a.max_sandboxes,
        max_body_bytes=int(a.max_body_mb * (1 << 20)),
        max_upload_bytes=int(a.max_upload_mb * (1 << 20)),
        sandbox_tokens=not a.no_sandbox_tokens,
    )
    sandbox_cfg = build_config(sandbox_class(a.backend), None, _options(a.sandbox_option))
    uvicorn.run(
        SandboxServer(cfg, sandbox_cfg).app(),
        host=a.host,
        port=a.port,
        log_level="warning",
        loop=SERVER_LOOP,
    )


def _options(items: list[str]) -> dict[str, Any]:
    """``KEY=JSON`` pairs (a value that is not JSON is taken as a string)."""
    out: dict[str, Any] = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise ConfigError(f"--sandbox-option {item!r} is not KEY=VALUE, e.g. disk_mb=8192")
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out


if __name__ == "__main__":
    main()
