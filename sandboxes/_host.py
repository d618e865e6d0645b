"""Host-side helpers of the local backend: probing bubblewrap, the read-only view, the sandbox
root dir, copying templates, and finding leftover processes by their environment marker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

import psutil

from agentrl.errors import ConfigError, SandboxError

logger = logging.getLogger(__name__)

MARKER = "AGENTRL_SANDBOX"  # set in every sandbox process's environment, for sweep()
_probe_cache: dict[tuple[int | None, bool], str | None] = {}


def root_dir(configured: str) -> Path:
    """The host dir holding sandbox dirs (created 0711 on first use)."""
    root = Path(configured or Path(tempfile.gettempdir()) / "agentrl-sandboxes")
    root.mkdir(mode=0o711, parents=True, exist_ok=True)
    return root


def check_traversable(path: Path, uid: int) -> None:
    for p in [path, *path.parents]:
        if not p.stat().st_mode & 0o001:
            raise ConfigError(
                f"sandbox root_dir {str(path)!r} is not reachable by uid {uid}: {str(p)!r} has "
                f"mode {p.stat().st_mode & 0o777:o}; pick a root_dir whose parents are o+x "
                "(the default, {tempdir}/agentrl-sandboxes, is)"
            )


def ro_view(paths: list[str]) -> list[str]:
    args: list[str] = []
    for p in paths:
        if os.path.islink(p):
            args += ["--symlink", os.readlink(p), p]
        elif os.path.exists(p):
            args += ["--ro-bind", p, p]
    return args


def kill_marked(prefix: str, *, exact: bool = False, rounds: int = 5) -> int:
    """SIGKILL processes whose environment marks them as belonging to a sandbox ``prefix*``.

    Scans again until a scan finds nothing (a process caught mid-fork or mid-exec is found by
    the next scan), at most ``rounds`` times.
    """
    n = 0
    for _ in range(rounds):
        found = 0
        for p in psutil.process_iter():
            with contextlib.suppress(psutil.Error, OSError):
                mark = p.environ().get(MARKER, "")
                if mark == prefix or (not exact and mark.startswith(prefix)):
                    os.kill(p.pid, signal.SIGKILL)
                    found += 1
        n += found
        if not found:
            break
        time.sleep(0.01)
    return n


async def copy_tree(src: Path, dst: Path, uid: int | None) -> None:
    """Copy a *host* template into a new workspace, as root, before any sandbox process exists.

    Only for trees no sandbox can write to: a copy of a sandbox's own workspace must resolve
    its paths as the sandbox user (``_local_process.Chain.copy_argv``, the docker backend's
    copy container), never as root."""
    if not src.is_dir():
        raise ConfigError(f"template_dir {str(src)!r} is not a directory")
    cmds = [["cp", "-a", "--reflink=auto", f"{src}/.", f"{dst}/"]]
    if uid is not None:
        cmds.append(["chown", "-R", "-h", f"{uid}:{uid}", str(dst)])
    for cmd in cmds:
        await run_checked(cmd, what=" ".join(cmd[:3]))


async def run_checked(cmd: list[str], *, what: str, timeout_s: float = 3600.0) -> None:
    """Run a host command; ``SandboxError`` with its stderr when it fails or times out."""
    p = await asyncio.create_subprocess_exec(
        *cmd,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    try:
        async with asyncio.timeout(timeout_s):
            _, err = await p.communicate()
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        await p.wait()
        raise
    if p.returncode:
        raise SandboxError(f"{what} failed: {err.decode(errors='replace').strip()[:2000]}")


async def bwrap_works(uid: int | None, allow_network: bool, ro_paths: list[str]) -> str | None:
    """None when bubblewrap runs here (probed once per uid), else the reason it does not."""
    key = (uid, allow_network)
    if key not in _probe_cache:
        if shutil.which("bwrap") is None:
            _probe_cache[key] = (
                "bubblewrap (bwrap) is not installed; run scripts/install-sandbox-deps.sh"
            )
        else:
            pre = (
                ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]
                if uid is not None
                else []
            )
            args = [
                *pre,
                "bwrap",
                "--unshare-all",
                *([] if not allow_network else ["--share-net"]),
                "--die-with-parent",
                *ro_view(ro_paths),
                "--proc",
                "/proc",
                "--dev",
                "/dev",
                "--",
                "true",
            ]
            p = await asyncio.create_subprocess_exec(
                *args, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
            )
            _, err = await p.communicate()
            ok = p.returncode == 0
            _probe_cache[key] = (
                None if ok else f"bwrap fails here: {err.decode(errors='replace').strip()}"
            )
    return _probe_cache[key]


_warned: set[str] = set()


def report_isolation(require: bool, bwrap: bool, cg_reason: str | None, extra: str = "") -> None:
    """Log (once) or raise what isolation is missing."""
    missing = [extra] if extra else []
    if not bwrap:
        missing.append(
            "no bubblewrap: commands see the whole host filesystem (other sandboxes included), "
            "the host network and other processes"
        )
    if cg_reason is not None:
        missing.append(
            f"no cgroups ({cg_reason}): no memory or pids limit; leftover processes "
            "are found by their environment marker only"
        )
    if not missing:
        return
    msg = "local sandbox isolation is weaker than configured: " + "; ".join(missing)
    if require:
        raise SandboxError(
            msg + ". Install bubblewrap / enable cgroups, or set require_isolation=False."
        )
    if msg not in _warned:
        _warned.add(msg)
        logger.warning(msg)
