"""File transfer built on a backend's own command runner: ``cat``, ``head`` and ``tar`` run
inside the sandbox, as the sandbox user, so the host never resolves a sandbox path itself
(a symlink planted in the workspace cannot redirect a host-side read or write).

A backend subclasses ``ExecFileOps`` and provides ``_run(argv, *, stdin=..., stdout_file=...)``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tarfile
import tempfile
from abc import abstractmethod
from pathlib import Path
from typing import IO

from agentrl.errors import SandboxError
from agentrl.sandbox import ExecResult, Sandbox
from sandboxes._disk import explain_no_space


class ExecFileOps(Sandbox):
    """A ``Sandbox`` whose ``read_file``/``write_file``/``upload``/``download`` run commands."""

    max_file_bytes: int = 64 * 1024 * 1024
    disk_mb: int = 0  # the writable space's cap, named in "no space" errors

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
        script = (
            '[ -e "$1" ] || exit 3; [ -d "$1" ] && exit 4; [ -r "$1" ] || exit 5; '
            f'exec head -c {limit + 1} -- "$1"'
        )
        with tempfile.TemporaryFile() as f:
            r = await self._run(["/bin/sh", "-c", script, "sh", path], stdout_file=f)
            _raise_for_file(r, path, "read", self.disk_mb)
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
        _raise_for_file(r, path, "write", self.disk_mb)

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
        _raise_for_file(r, dst, "upload to", self.disk_mb)

    async def download(self, remote_path: str, local_path: str | os.PathLike[str]) -> None:
        """Copy a sandbox file or directory to ``local_path`` (links stay inside it)."""
        src = self.resolve(remote_path)
        dst = Path(local_path)
        with tempfile.TemporaryFile() as f:
            script = '[ -e "$1" ] || [ -L "$1" ] || exit 3; cd "$(dirname -- "$1")" && exec tar -c -- "$(basename -- "$1")"'
            r = await self._run(["/bin/sh", "-c", script, "sh", src], stdout_file=f)
            _raise_for_file(r, src, "download", self.disk_mb)
            f.seek(0)
            with tempfile.TemporaryDirectory(dir=dst.parent) as tmp:
                try:
                    extract_tar(f, Path(tmp) / "x")
                except SandboxError as e:
                    raise SandboxError(f"refusing to download {src}: {e}") from None
                (entry,) = (Path(tmp) / "x").iterdir()
                if dst.is_dir() and entry.is_dir():
                    shutil.rmtree(dst)
                entry.replace(dst)


def _raise_for_file(r: ExecResult, path: str, what: str, disk_mb: int = 0) -> None:
    if r.exit_code == 0 and not r.timed_out:
        return
    if r.exit_code == 3:
        raise FileNotFoundError(f"no such file in the sandbox: {path}")
    if r.exit_code == 4:
        raise IsADirectoryError(f"{path} is a directory, not a file")
    if r.exit_code == 5:
        raise PermissionError(f"{path} is not readable inside the sandbox")
    why = "timed out" if r.timed_out else (r.stderr.strip() or f"exit code {r.exit_code}")
    raise SandboxError(explain_no_space(f"cannot {what} {path} in the sandbox: {why}", disk_mb))


_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def extract_tar(archive: IO[bytes], dest: Path) -> None:
    """Extract a tar made inside a sandbox into the new directory ``dest``, never following a
    link: every path component is opened ``O_NOFOLLOW`` relative to its parent's descriptor.

    Not ``tarfile.extractall(filter="data")``: its checks resolve paths with ``realpath``,
    which a crafted chain of links has fooled (CVE-2025-4517 and siblings), and this runs as
    the host user, often root. Refused (``SandboxError``): absolute or ``..`` member names,
    absolute links, links whose target climbs after descending (``x/..``) or out of the tree,
    devices and fifos, a link or file where a directory is needed. Hard links become copies;
    modes lose setuid/setgid and group/other write; ownership is the caller's.
    """
    dest.mkdir(mode=0o700)
    root = os.open(dest, _DIR)
    try:
        with tarfile.open(fileobj=archive) as tar:
            for m in tar:
                _extract_member(tar, m, root)
    except (OSError, tarfile.TarError) as e:
        raise SandboxError(f"cannot extract {getattr(e, 'filename', '') or ''} ({e})") from None
    finally:
        os.close(root)


def _parts(name: str) -> list[str]:
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if name.startswith("/") or ".." in parts:
        raise SandboxError(f"member {name!r} is absolute or climbs out of the archive")
    return parts


def _open_parent(root: int, parts: list[str], *, create: bool) -> int:
    """A descriptor of the directory holding ``parts[-1]`` (each hop O_NOFOLLOW)."""
    fd = os.dup(root)
    try:
        for p in parts[:-1]:
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(p, 0o700, dir_fd=fd)
            try:
                nfd = os.open(p, _DIR, dir_fd=fd)
            except OSError as e:  # ELOOP / ENOTDIR: a link or a file where a directory must be
                raise SandboxError(
                    f"{'/'.join(parts)}: {p!r} is not a directory ({e.strerror})"
                ) from None
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd


def _link_target_ok(parts: list[str], target: str) -> bool:
    """Relative, only leading ``..`` hops, and those stay inside the tree (the link's own
    ancestors are real directories here, so leading hops are exact)."""
    if target.startswith("/"):
        return False
    hops = [p for p in target.split("/") if p not in ("", ".")]
    ups = 0
    while ups < len(hops) and hops[ups] == "..":
        ups += 1
    return ".." not in hops[ups:] and ups <= len(parts) - 1


def _extract_member(tar: tarfile.TarFile, m: tarfile.TarInfo, root: int) -> None:
    parts = _parts(m.name)
    if not parts:  # the archive's "." entry
        return
    if not (m.isdir() or m.isreg() or m.issym() or m.islnk()):
        raise SandboxError(f"member {m.name!r} is a device or fifo")
    parent = _open_parent(root, parts, create=True)
    leaf = parts[-1]
    try:
        if m.isdir():
            with contextlib.suppress(FileExistsError):
                os.mkdir(leaf, 0o700, dir_fd=parent)
            fd = _open_parent(parent, [leaf, ""], create=False)
            os.fchmod(fd, (m.mode & 0o755) | 0o700)
            os.close(fd)
            return
        _remove_leaf(parent, leaf)
        if m.issym():
            if not _link_target_ok(parts, m.linkname):
                raise SandboxError(f"link {m.name!r} -> {m.linkname!r} leaves the tree")
            os.symlink(m.linkname, leaf, dir_fd=parent)
            return
        src = tar.extractfile(m) if m.isreg() else None
        if m.islnk():  # a copy of a member extracted before
            lparts = _parts(m.linkname)
            lparent = _open_parent(root, lparts, create=False)
            try:
                lfd = os.open(
                    lparts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=lparent
                )
            finally:
                os.close(lparent)
            src = os.fdopen(lfd, "rb")
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(leaf, flags, 0o600, dir_fd=parent)
        with os.fdopen(fd, "wb") as out:
            if src is not None:
                with src:
                    shutil.copyfileobj(src, out)
            os.fchmod(out.fileno(), (m.mode & 0o755) | 0o600)
            os.utime(out.fileno(), (m.mtime, m.mtime))
    finally:
        os.close(parent)


def _remove_leaf(parent: int, leaf: str) -> None:
    """Make room for a file or link; a directory there is an error (never replaced)."""
    try:
        st = os.stat(leaf, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        raise SandboxError(f"{leaf!r} is a directory in the archive and then something else")
    os.unlink(leaf, dir_fd=parent)
