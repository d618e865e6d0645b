"""Process chains of a local sandbox: building them, long-lived processes, and killing a
command's whole process tree.

The host sees a command as a chain ``sh -> prlimit -> setpriv -> bwrap`` (one pid, exec'd in
turn) whose child is bwrap's pid-1 reaper, whose child is the command (or the sandbox's exec
agent, ``_exec_agent.py``). ``Command.kill`` kills the chain's process group and every process
in the command's leaf cgroup; without cgroups it kills the descendants psutil can still see and
any process carrying the command's marker.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from agentrl.sandbox import SandboxProcess
from sandboxes import _cgroup
from sandboxes._host import kill_marked, ro_view, root_dir

if TYPE_CHECKING:
    from sandboxes.local import LocalSandbox

_JOIN = 'while [ "$1" != -- ]; do echo 0 > "$1" || exit 125; shift; done; shift; '
# best effort (needs CAP_SYS_RESOURCE): the OOM killer then picks a command, not the agent
_PROTECT = "{ echo -1000 > /proc/self/oom_score_adj; } 2>/dev/null; "


@dataclass(frozen=True, kw_only=True, slots=True)
class Chain:
    """What wraps a command in a local sandbox: cgroup join, rlimits, uid drop, bubblewrap."""

    config: LocalSandbox.Config
    home: Path  # the sandbox's host dir: ws/ and tmp/
    uid: int | None
    bwrap: bool

    def argv(
        self,
        argv: list[str],
        *,
        workdir: str,
        inner_env: dict[str, str],
        leaf: _cgroup.Leaf | None,
        agent: bool = False,
        seccomp_fd: int | None = None,
    ) -> list[str]:
        """The full chain. ``agent``: the exec agent's (protected from the OOM killer, no CPU
        limit, room for many open files; it applies the command limits to each command)."""
        c = self.config
        chain: list[str] = []
        if leaf is not None:
            script = _JOIN + (_PROTECT if agent else "") + 'exec "$@"'
            chain += ["/bin/sh", "-c", script, "sh", *leaf.procs_files, "--"]
        if shutil.which("prlimit"):
            limits = [f"--fsize={c.file_size_mb << 20}", "--core=0"]
            limits += (
                [f"--nofile={max(c.nofile, 4096)}"]
                if agent
                else [f"--cpu={c.cpu_time_s}", f"--nofile={c.nofile}"]
            )
            chain += ["prlimit", *limits, "--"]
        if self.uid is not None:
            chain += [
                "setpriv",
                f"--reuid={self.uid}",
                f"--regid={self.uid}",
                "--clear-groups",
                "--",
            ]
        if not self.bwrap:
            return [*chain, "/usr/bin/env", "-C", workdir, *argv]
        seccomp = ["--seccomp", str(seccomp_fd)] if seccomp_fd is not None else []
        return [*chain, *self._bwrap_args(workdir, inner_env), *seccomp, "--", *argv]

    def copy_argv(self, src: Path, dst: Path) -> list[str]:
        """``cp -a src/. dst/`` as the sandbox's uid, inside bubblewrap with only the read-only
        system paths, ``src`` (read-only, at /src) and ``dst`` (at /dst): a link a sandbox plants
        in ``src``, or swaps in while the copy runs, resolves in that view, never the host's."""
        chain: list[str] = []
        if self.uid is not None:
            chain += [
                "setpriv",
                f"--reuid={self.uid}",
                f"--regid={self.uid}",
                "--clear-groups",
                "--",
            ]
        cp = ["cp", "-a", "--reflink=auto", "--no-preserve=ownership"]
        if not self.bwrap:  # no isolation at all (see report_isolation): the uid drop only
            return [*chain, *cp, f"{src}/.", f"{dst}/"]
        args = [
            "bwrap",
            "--unshare-all",
            "--die-with-parent",
            "--new-session",
            "--clearenv",
            "--setenv",
            "PATH",
            "/usr/bin:/bin",
            *ro_view(self.config.ro_paths),
        ]
        args += self._mask_root()
        args += [
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--ro-bind",
            str(src),
            "/src",
            "--bind",
            str(dst),
            "/dst",
            "--remount-ro",
            "/",
        ]
        return [*chain, *args, "--", *cp, "/src/.", "/dst/"]

    def _mask_root(self) -> list[str]:
        root = str(root_dir(self.config.root_dir))
        if any(root == p or root.startswith(p.rstrip("/") + "/") for p in self.config.ro_paths):
            return ["--tmpfs", root]  # hide the other sandboxes
        return []

    def rlimits(self) -> list[tuple[str, int]]:
        """The per-command limits, as the exec agent applies them."""
        c = self.config
        return [
            ("RLIMIT_CPU", c.cpu_time_s),
            ("RLIMIT_FSIZE", c.file_size_mb << 20),
            ("RLIMIT_NOFILE", c.nofile),
            ("RLIMIT_CORE", 0),
        ]

    def _bwrap_args(self, cwd: str, inner_env: dict[str, str]) -> list[str]:
        args = [
            "bwrap",
            "--unshare-all",
            "--die-with-parent",
            "--new-session",
            "--clearenv",
            "--hostname",
            "sandbox",
        ]
        if self.config.allow_network:
            args.append("--share-net")
        for k, v in inner_env.items():
            args += ["--setenv", k, v]
        args += ro_view(self.config.ro_paths) + self._mask_root()
        args += ["--proc", "/proc", "--dev", "/dev"]
        args += [
            "--bind",
            str(self.home / "ws"),
            "/workspace",
            "--bind",
            str(self.home / "tmp"),
            "/tmp",
        ]
        return [*args, "--remount-ro", "/", "--chdir", cwd]


class _Protocol(asyncio.subprocess.SubprocessStreamProtocol):
    """asyncio's stream protocol plus an event set when the process exits.

    ``Process.wait()`` also waits for the pipes to close, which a leftover grandchild can
    hold open forever; ``exited`` fires on the exit of the process itself.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit=1 << 16, loop=loop)
        self.exited = asyncio.Event()

    def process_exited(self) -> None:
        super().process_exited()
        self.exited.set()


_closing: set[asyncio.Task[None]] = set()


def _kill_spawned(spawn: asyncio.Future[tuple[asyncio.SubprocessTransport, Any]]) -> None:
    """A spawn whose caller was cancelled: SIGKILL its process group, then release its pipes
    once the child watcher has seen it exit (closing first would reap it under the watcher)."""
    if spawn.cancelled() or spawn.exception() is not None:
        return
    transport, protocol = spawn.result()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(transport.get_pid(), signal.SIGKILL)

    async def close_after_exit() -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(10.0):
                await protocol.exited.wait()
        transport.close()

    task = asyncio.get_running_loop().create_task(close_after_exit())
    _closing.add(task)  # held until done (the loop keeps only weak references)
    task.add_done_callback(_closing.discard)


@dataclass(slots=True)
class Command:
    """A started process chain and what is needed to kill it and its descendants."""

    proc: asyncio.subprocess.Process
    exited: asyncio.Event
    leaf: _cgroup.Leaf | None
    token: str  # the MARKER value in its processes' environment

    @classmethod
    async def start(
        cls,
        chain: list[str],
        env: dict[str, str],
        leaf: _cgroup.Leaf | None,
        token: str,
        **pipes: Any,
    ) -> Command:
        loop = asyncio.get_running_loop()
        spawn = asyncio.ensure_future(
            loop.subprocess_exec(
                lambda: _Protocol(loop), *chain, env=env, start_new_session=True, **pipes
            )
        )
        try:
            # Never cancelled half-way: asyncio of Python 3.11 cleans up a spawn cancelled
            # before its pipes are connected by waiting for a wake-up that only comes once
            # every pipe is connected, i.e. forever (a sandbox closed while its exec agent
            # started hung there). A cancelled caller leaves the spawn to finish (ms) and kill
            # what it started.
            transport, protocol = await asyncio.shield(spawn)
        except asyncio.CancelledError:
            spawn.add_done_callback(_kill_spawned)
            raise
        return cls(
            asyncio.subprocess.Process(transport, protocol, loop), protocol.exited, leaf, token
        )

    async def kill(self, cg: _cgroup.SandboxCgroup | None) -> None:
        """SIGKILL the chain's process group and everything it started; wait for the exit."""
        proc = self.proc
        descendants: list[psutil.Process] = []
        if cg is None:
            with contextlib.suppress(psutil.Error):
                descendants = psutil.Process(proc.pid).children(recursive=True)
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        for p in descendants:
            with contextlib.suppress(psutil.Error):
                p.kill()
        if cg is not None and self.leaf is not None:
            await cg.kill(self.leaf)
        else:  # orphans that left the process tree still carry the token
            kill_marked(self.token, exact=True)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(10.0):
                await self.exited.wait()

    def close_pipes(self) -> None:
        """Release our ends of the pipes (a leftover process may still hold the others)."""
        transport = getattr(self.proc, "_transport", None)
        if transport is not None:
            transport.close()


class LocalProcess(SandboxProcess):
    """A process started by ``LocalSandbox.start_process`` (stdin/stdout piped, stderr merged)."""

    def __init__(
        self,
        cmd: Command,
        cg: _cgroup.SandboxCgroup | None,
        on_exit: Callable[[LocalProcess], None],
    ) -> None:
        self._cmd = cmd
        self._proc = cmd.proc
        self._cg = cg
        self._on_exit = on_exit
        self._killed = False

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def alive(self) -> bool:
        return not self._killed and self._proc.returncode is None

    async def write(self, data: bytes) -> None:
        if self._proc.stdin is None or not self.alive:
            raise BrokenPipeError("the sandbox process has exited")
        self._proc.stdin.write(data)
        await self._proc.stdin.drain()

    async def read(self, n: int = 65536) -> bytes:
        if self._proc.stdout is None:
            return b""
        return await self._proc.stdout.read(n)

    def _target(self) -> psutil.Process | None:
        """The process the caller started: below bwrap and bwrap's pid-1 reaper, if present."""
        try:
            cur = psutil.Process(self._proc.pid)
            while cur.name() == "bwrap":
                kids = cur.children()
                if not kids:
                    return None
                cur = kids[0]
            return cur
        except psutil.Error:
            return None

    async def interrupt(self) -> None:
        target = self._target()
        if target is None:
            return
        with contextlib.suppress(psutil.Error):
            kids = target.children(recursive=True)
            for k in kids:
                with contextlib.suppress(psutil.Error):
                    k.kill()
            psutil.wait_procs(kids, timeout=0)

    async def kill(self) -> None:
        if self._killed:
            return
        self._killed = True
        try:
            await self._cmd.kill(self._cg)
            self._cmd.close_pipes()
            if self._cg is not None and self._cmd.leaf is not None:
                await self._cg.remove_leaf(self._cmd.leaf)
        finally:
            self._on_exit(self)
