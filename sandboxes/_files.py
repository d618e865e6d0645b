"""File transfer built on a backend's own command runner: ``cat``, ``head`` and ``tar`` run
inside the sandbox, as the sandbox user, so the host never resolves a sandbox path itself
(a symlink planted in the workspace cannot redirect a host-side read or write).

A backend subclasses ``ExecFileOps`` and provides ``_run(argv, *, stdin=..., stdout_file=...)``.
"""

from __future__ import annotations

import os
import shutil
import tarfile
import tempfile
from abc import abstractmethod
from pathlib import Path
from typing import IO

from agentrl.errors import SandboxError
from agentrl.sandbox import ExecResult, Sandbox


class ExecFileOps(Sandbox):
    """A ``Sandbox`` whose ``read_file``/``write_file``/``upload``/``download`` run commands."""

    max_file_bytes: int = 64 * 1024 * 1024

    @abstractmethod
    async def _run(
        self,
        argv: list[str],
        *,
        timeout_s: float | None = None,
        stdin: bytes | IO[bytes] | None = None,
        stdout_file: IO[bytes] | None = None,
    ) -> ExecResult:
        """Run ``argv``; stdin from bytes or a file; stdout into ``stdout_file`` if given."""

    async def read_file(self, path: str) -> bytes:
        path = self.resolve(path)
        limit = self.max_file_bytes
        script = ('[ -e "$1" ] || exit 3; [ -d "$1" ] && exit 4; [ -r "$1" ] || exit 5; '
                  f'exec head -c {limit + 1} -- "$1"')  # fmt: skip
        with tempfile.TemporaryFile() as f:
            r = await self._run(["/bin/sh", "-c", script, "sh", path], stdout_file=f)
            _raise_for_file(r, path, "read")
            f.seek(0)
            data = f.read()
        if len(data) > limit:
            raise SandboxError(f"{path} is larger than max_file_bytes={limit}; use download()")
        return data

    async def write_file(self, path: str, data: bytes | str, *, mode: int | None = None) -> None:
        path = self.resolve(path)
        script = 'mkdir -p -- "$(dirname -- "$1")" && cat > "$1"'
        if mode is not None:
            script += f' && chmod {mode:o} -- "$1"'
        blob = data.encode() if isinstance(data, str) else data
        r = await self._run(["/bin/sh", "-c", script, "sh", path], stdin=blob)
        _raise_for_file(r, path, "write")

    async def upload(self, local_path: str | os.PathLike[str], remote_path: str) -> None:
        """Copy a host file or directory to ``remote_path`` (streamed into the sandbox)."""
        src = Path(local_path)
        dst = self.resolve(remote_path)
        with tempfile.TemporaryFile() as f:
            if src.is_dir():
                with tarfile.open(fileobj=f, mode="w") as tar:
                    tar.add(src, arcname=".", recursive=True)
                script = 'mkdir -p -- "$1" && exec tar -x --no-same-owner -C "$1"'
            else:
                with open(src, "rb") as g:
                    shutil.copyfileobj(g, f)
                script = 'mkdir -p -- "$(dirname -- "$1")" && exec cat > "$1"'
            f.seek(0)
            r = await self._run(["/bin/sh", "-c", script, "sh", dst], stdin=f)
        _raise_for_file(r, dst, "upload to")

    async def download(self, remote_path: str, local_path: str | os.PathLike[str]) -> None:
        """Copy a sandbox file or directory to ``local_path`` (links stay inside it)."""
        src = self.resolve(remote_path)
        dst = Path(local_path)
        with tempfile.TemporaryFile() as f:
            script = '[ -e "$1" ] || [ -L "$1" ] || exit 3; cd "$(dirname -- "$1")" && exec tar -c -- "$(basename -- "$1")"'
            r = await self._run(["/bin/sh", "-c", script, "sh", src], stdout_file=f)
            _raise_for_file(r, src, "download")
            f.seek(0)
            with tempfile.TemporaryDirectory(dir=dst.parent) as tmp, tarfile.open(fileobj=f) as tar:
                try:
                    tar.extractall(tmp, filter="data")
                except tarfile.FilterError as e:
                    raise SandboxError(f"refusing to download {src}: {e}") from None
                (entry,) = Path(tmp).iterdir()
                if dst.is_dir() and entry.is_dir():
                    shutil.rmtree(dst)
                entry.replace(dst)


def _raise_for_file(r: ExecResult, path: str, what: str) -> None:
    if r.exit_code == 0 and not r.timed_out:
        return
    if r.exit_code == 3:
        raise FileNotFoundError(f"no such file in the sandbox: {path}")
    if r.exit_code == 4:
        raise IsADirectoryError(f"{path} is a directory, not a file")
    if r.exit_code == 5:
        raise PermissionError(f"{path} is not readable inside the sandbox")
    why = "timed out" if r.timed_out else (r.stderr.strip() or f"exit code {r.exit_code}")
    raise SandboxError(f"cannot {what} {path} in the sandbox: {why}")
