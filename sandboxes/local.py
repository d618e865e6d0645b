"""Local sandboxes: bubblewrap namespaces + a per-sandbox cgroup + rlimits, on this machine.

    sb = await make_sandbox("local", memory_mb=512)    # or LocalSandbox.create(Config(...))
    r = await sb.exec("echo hi > f && cat f", timeout_s=5)   # runs in /workspace

Processes start through one chain (``_local_process.Chain``)::

    sh (joins a leaf cgroup) -> prlimit (cpu, fsize, nofile, core)
       -> setpriv (drop to an unprivileged uid when run as root) -> bwrap -> the process

At create, that chain starts the sandbox's exec agent (``_exec_agent.py``): commands are then
requests to it, and it forks each one inside the sandbox, with the per-command rlimits, as
pid 1 of its own pid namespace (a few ms instead of ~30 ms per command). Without bubblewrap or
cgroups, with ``exec_agent=False``, for large stdin and for ``start_process``, each process
gets a fresh chain of its own.

bwrap gives the command: a read-only view of ``ro_paths`` on an empty root (everything else on
the host, other sandboxes included, does not exist), the sandbox's own writable workspace at
``/workspace`` and its own ``/tmp`` (both host directories under ``root_dir``, so files persist
between commands), fresh ``/proc`` and ``/dev``, new user/pid/ipc/uts/cgroup/net namespaces (no
network unless ``allow_network``), a new session and a cleared environment. When the command
returns, the pid namespace dies with it: background processes do not outlive an ``exec``.
Long-lived processes (a bash session) use ``start_process``.

Limits: memory and pids on the sandbox cgroup (all its commands together); CPU seconds, file size
and open files per process through rlimits; the workspace and /tmp live on their own
filesystem of ``disk_mb`` (``_disk.py``; 4096 by default, 0 for none). Syscalls go through a seccomp filter
(``_seccomp.py``: bwrap ``--seccomp`` for chains; the exec agent installs it once, on
itself, and its commands inherit it). A timeout kills the chain and everything in the
command's cgroup. Without bubblewrap or cgroups the sandbox logs a WARNING naming what is
missing and runs a plain subprocess with rlimits (``require_isolation=True`` raises instead).
Files move through the sandbox's own processes (``cat``, ``tar``), never by host-side path
lookups, so a symlink planted in the workspace cannot make the host read or write elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import platform
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Self

from agentrl.errors import ConfigError, SandboxError
from agentrl.sandbox import ExecResult, OutputCap, SweepReport, new_name
from sandboxes import _cgroup, _seccomp
from sandboxes._disk import (
    DEFAULT_DISK_MB,
    drop_stale_spares,
    make_home,
    prepare_spare,
    remove_home,
)
from sandboxes._exec_agent import MAX_STDIN, SECCOMP_ENV, AgentSlot, ExecAgent, agent_argv
from sandboxes._files import ExecFileOps
from sandboxes._host import (
    MARKER,
    bwrap_works,
    check_traversable,
    copy_tree,
    kill_marked,
    report_isolation,
    root_dir,
    run_checked,
)
from sandboxes._local_process import Chain, Command, LocalProcess

logger = logging.getLogger(__name__)

_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DEFAULT_RO_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc", "/opt")
HARDENING_OFF: dict[str, object] = {"seccomp": False, "disk_mb": 0}
"""The local backend's hardening, turned off. The defaults are hardened: the seccomp filter
(``seccomp=True``) and a disk cap on the workspace and /tmp (``disk_mb=DEFAULT_DISK_MB``);
``make_sandbox("local", **HARDENING_OFF)`` is the unhardened baseline that
``benchmarks/sandbox.py`` measures their cost against (goal: <= 10% of exec and create p50).
Isolation that is not a knob (namespaces, cgroup limits, rlimits, uid drop) is on in both."""


class LocalSandbox(ExecFileOps):
    kind = "local"

    @dataclass(kw_only=True)
    class Config:
        root_dir: str = ""
        """Host dir holding the sandboxes' dirs; "" means {tempdir}/agentrl-sandboxes."""
        template_dir: str = ""
        """Copied (reflink when the filesystem can) into each new workspace, e.g. a repo."""
        ro_paths: list[str] = field(default_factory=lambda: list(DEFAULT_RO_PATHS))
        """Host paths visible read-only inside (symlinks are kept as symlinks)."""
        allow_network: bool = False
        memory_mb: int = 2048
        pids_max: int = 256
        cpu_time_s: int = 600
        """RLIMIT_CPU per process."""
        file_size_mb: int = 1024
        """RLIMIT_FSIZE: the largest file a process may write."""
        disk_mb: int = DEFAULT_DISK_MB
        """Cap on the workspace and /tmp together: they live on their own ext4 of this size
        (a sparse, loop-mounted image, ``_disk.py``; needs root and loop devices, else a
        WARNING and no cap, or ``SandboxError`` with ``require_isolation``). 0: no cap, they
        share root_dir's disk."""
        nofile: int = 1024
        uid: int = 65534
        """When started as root, run commands as this uid/gid (-1: stay root)."""
        exec_timeout_s: float = 120.0
        max_output_bytes: int = 64 * 1024
        """Per stream; the head and tail are kept around a truncation marker."""
        max_file_bytes: int = 64 * 1024 * 1024
        env: dict[str, str] = field(default_factory=dict)
        require_isolation: bool = False
        """Raise SandboxError instead of falling back when bwrap or cgroups are missing."""
        use_bwrap: bool = True
        use_cgroups: bool = True
        cgroup_parent: str = "agentrl"
        seccomp: bool = True
        """Filter syscalls (``sandboxes/_seccomp.py``): EPERM for what Docker's default profile
        blocks (ptrace, mount, keyrings, bpf, perf_event_open, new namespaces, ...), ENOSYS
        for clone3, death for other ABIs. Needs bubblewrap."""
        seccomp_allow: list[str] = field(default_factory=list)
        """Blocked syscalls to allow anyway, e.g. ["ptrace"] for gdb or strace,
        ["unshare", "clone-namespaces"] for tools that make namespaces."""
        exec_agent: bool = True
        """Start commands from a resident agent inside the sandbox (a few ms each) instead of a
        fresh isolation chain each (~30 ms); needs bubblewrap, cgroups and python3 in
        ``ro_paths``, else commands use fresh chains."""

    def __init__(
        self,
        config: Config,
        name: str,
        home: Path,
        cg: _cgroup.SandboxCgroup | None,
        bwrap: bool,
        uid: int | None,
    ) -> None:
        self.config = config
        self.max_file_bytes = config.max_file_bytes
        self.disk_mb = config.disk_mb
        self.name = name
        self.home = home  # host dir: ws/ (the workspace) and tmp/
        self.cgroup = cg
        self.bwrap = bwrap
        self.uid = uid
        self.workdir = "/workspace" if bwrap else str(home / "ws")
        self._procs: set[LocalProcess] = set()
        self._serial = 0
        self._closed = False
        self._isolation = Chain(config=config, home=home, uid=uid, bwrap=bwrap)
        self._seccomp = _seccomp.program(config.seccomp_allow) if bwrap and config.seccomp else None
        if bwrap and config.seccomp and self._seccomp is None:
            report_isolation(
                config.require_isolation,
                True,
                None,
                extra=f"no syscall filter for {platform.machine()}",
            )
        use_agent = config.exec_agent and bwrap and cg is not None
        self._agent = AgentSlot(name, self._start_agent, cg, enabled=use_agent)

    # --- creation -----------------------------------------------------------------------------
    @classmethod
    async def create(cls, config: object, *, name: str | None = None) -> Self:
        if not isinstance(config, LocalSandbox.Config):
            raise ConfigError(
                f"LocalSandbox expects LocalSandbox.Config, got {type(config).__name__}"
            )
        name = name or new_name()
        unknown = sorted(set(config.seccomp_allow) - set(_seccomp.BLOCKABLE))
        if unknown:
            raise ConfigError(
                f"seccomp_allow names {unknown}, which the filter does not block; "
                f"it blocks {_seccomp.BLOCKABLE}"
            )
        uid = config.uid if os.geteuid() == 0 and config.uid >= 0 else None
        bwrap = (
            config.use_bwrap
            and await bwrap_works(uid, config.allow_network, config.ro_paths) is None
        )
        cg_reason = _cgroup.available(config.cgroup_parent) if config.use_cgroups else "disabled"
        report_isolation(
            config.require_isolation and (config.use_bwrap or config.use_cgroups), bwrap, cg_reason
        )
        home = root_dir(config.root_dir) / name
        if uid is not None:
            check_traversable(home.parent, uid)
        disk_mb = await make_home(home, config.disk_mb, required=config.require_isolation)
        cg = None
        try:
            for sub in ("ws", "tmp"):
                (home / sub).mkdir()
                (home / sub).chmod(0o1777 if sub == "tmp" else 0o755)
                if uid is not None:
                    os.chown(home / sub, uid, uid)
            if config.template_dir:
                await copy_tree(Path(config.template_dir), home / "ws", uid)
            if cg_reason is None:
                cg = _cgroup.SandboxCgroup.create(
                    name,
                    parent=config.cgroup_parent,
                    memory_bytes=config.memory_mb << 20,
                    pids_max=config.pids_max,
                )
        except BaseException:
            await asyncio.shield(remove_home(home))
            raise
        sb = cls(config, name, home, cg, bwrap, uid)
        sb.disk_mb = disk_mb  # 0 when no cap could be made here (make_home warned)
        # The exec agent (~40 ms: bubblewrap, then python) starts in the background: a reset
        # returns without it, and the first command, which in a rollout comes after the
        # model's first reply, finds it up (or waits for the rest of its start).
        sb._agent.start_soon()
        prepare_spare(disk_mb)  # the next sandbox's capped filesystem, in the background
        return sb

    # --- commands --------------------------------------------------------------------------------
    async def exec(
        self,
        cmd: str | list[str],
        *,
        timeout_s: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | str | None = None,
    ) -> ExecResult:
        argv = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        data = stdin.encode() if isinstance(stdin, str) else stdin
        return await self._run(argv, timeout_s=timeout_s, cwd=cwd, env=env, stdin=data)

    async def _run(
        self,
        argv: list[str],
        *,
        timeout_s: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | IO[bytes] | None = None,
        out_cap: int | None = None,
        stdout_file: IO[bytes] | None = None,
    ) -> ExecResult:
        self._check_open()
        timeout = self.config.exec_timeout_s if timeout_s is None else timeout_s
        caps = (out_cap or self.config.max_output_bytes, self.config.max_output_bytes)
        small = stdin is None or (isinstance(stdin, bytes) and len(stdin) <= MAX_STDIN)
        agent = await self._agent.get() if small else None
        if agent is None:
            return await self._run_chain(argv, timeout, cwd, env, stdin, caps, stdout_file)
        assert self.cgroup is not None and agent.leaf is not None  # the agent needs both
        loop = asyncio.get_running_loop()
        start = loop.time()
        self._serial += 1
        oom_before = self.cgroup.oom_kills(agent.leaf)
        reply = await agent.run(
            argv,
            cwd=self.resolve(cwd or self.workdir),
            env=self._inner_env(env, f"{self.name}/{self._serial}"),
            timeout_s=timeout,
            caps=caps,
            rlimits=self._isolation.rlimits(),
            stdin=stdin if isinstance(stdin, bytes) else None,
            stdout_file=stdout_file,
        )
        out, err = reply.stdout, reply.stderr
        return ExecResult(
            exit_code=-1 if reply.timed_out else reply.exit_code,
            stdout=out.text(),
            stderr=err.text() + (f"sandbox: {reply.error}\n" if reply.error else ""),
            timed_out=reply.timed_out,
            duration_s=loop.time() - start,
            truncated=out.truncated or err.truncated,
            oom_killed=self.cgroup.oom_kills(agent.leaf) > oom_before,
        )

    async def _start_agent(self) -> ExecAgent:
        assert self.cgroup is not None
        leaf = self.cgroup.new_leaf()
        inner = {"PATH": _PATH, "LANG": "C.UTF-8"}
        if self._seccomp is not None:  # the agent installs it on itself; commands inherit it
            inner[SECCOMP_ENV] = self._seccomp.hex()
        chain = self._isolation.argv(
            agent_argv(), workdir="/workspace", leaf=leaf, agent=True, inner_env=inner
        )
        try:
            return await ExecAgent.start(
                chain, {"PATH": _PATH}, self.cgroup, leaf, f"{self.name}/agent"
            )
        except BaseException:
            await self.cgroup.remove_leaf(leaf)
            raise

    async def _run_chain(
        self,
        argv: list[str],
        timeout: float,
        cwd: str | None,
        env: Mapping[str, str] | None,
        stdin: bytes | IO[bytes] | None,
        caps: tuple[int, int],
        stdout_file: IO[bytes] | None,
    ) -> ExecResult:
        """Run one command through a fresh chain (no agent, or a streamed stdin)."""
        loop = asyncio.get_running_loop()
        out, err = OutputCap(caps[0]), OutputCap(caps[1])
        start = loop.time()
        cmd = await self._spawn(
            argv,
            cwd,
            env,
            stdin=asyncio.subprocess.PIPE
            if isinstance(stdin, bytes)
            else (stdin or asyncio.subprocess.DEVNULL),
            stdout=stdout_file or asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        proc = cmd.proc
        pumps = [loop.create_task(_pump(proc.stderr, err))]
        if proc.stdout is not None:
            pumps.append(loop.create_task(_pump(proc.stdout, out)))
        if isinstance(stdin, bytes):
            pumps.append(loop.create_task(_feed(proc.stdin, stdin)))
        timed_out = False
        try:
            try:
                async with asyncio.timeout(timeout):
                    await cmd.exited.wait()
            except TimeoutError:
                timed_out = True
        finally:
            oom_killed = await asyncio.shield(self._reap(cmd, pumps))
        return ExecResult(
            exit_code=-1 if timed_out else (proc.returncode if proc.returncode is not None else -1),
            stdout=out.text(),
            stderr=err.text(),
            timed_out=timed_out,
            duration_s=loop.time() - start,
            truncated=out.truncated or err.truncated,
            oom_killed=oom_killed,
        )

    async def _reap(self, cmd: Command, pumps: list[asyncio.Task[None]]) -> bool:
        """Kill what is left of a command, drain its pipes, free its leaf cgroup.
        Returns whether the memory limit killed one of its processes."""
        await cmd.kill(self.cgroup)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(5.0):
                await asyncio.gather(*pumps, return_exceptions=True)
        for t in pumps:
            t.cancel()
        cmd.close_pipes()
        if self.cgroup is None or cmd.leaf is None:
            return False
        oom = self.cgroup.oom_kills(cmd.leaf) > 0
        await self.cgroup.remove_leaf(cmd.leaf)
        return oom

    async def _spawn(
        self, argv: list[str], cwd: str | None, env: Mapping[str, str] | None, **pipes: Any
    ) -> Command:
        """Start the chain; the token ``{name}/{n}`` marks the command's processes' environment."""
        self._serial += 1
        token = f"{self.name}/{self._serial}"
        leaf = self.cgroup.new_leaf() if self.cgroup else None
        fd = None
        if self._seccomp is not None:  # bwrap --seccomp FD reads the program from a memfd
            fd = os.memfd_create("agentrl-seccomp", 0)  # not CLOEXEC: the chain inherits it
            os.write(fd, self._seccomp)
            os.lseek(fd, 0, os.SEEK_SET)
        chain = self._isolation.argv(
            argv,
            workdir=self.resolve(cwd or self.workdir),
            leaf=leaf,
            inner_env=self._inner_env(env, token),
            seccomp_fd=fd,
        )
        outer_env = {"PATH": _PATH, MARKER: token} if self.bwrap else self._inner_env(env, token)
        try:
            return await Command.start(
                chain, outer_env, leaf, token, pass_fds=() if fd is None else (fd,), **pipes
            )
        except BaseException:
            if self.cgroup and leaf:
                await self.cgroup.remove_leaf(leaf)
            raise
        finally:
            if fd is not None:
                os.close(fd)

    def _inner_env(self, env: Mapping[str, str] | None, token: str) -> dict[str, str]:
        tmp = "/tmp" if self.bwrap else str(self.home / "tmp")
        base = {
            "PATH": _PATH,
            "HOME": self.workdir,
            "LANG": "C.UTF-8",
            "TERM": "dumb",
            "TMPDIR": tmp,
            MARKER: token,
        }
        return {**base, **self.config.env, **(env or {})}

    # --- processes, snapshot, close --------------------------------------------------------------
    async def start_process(
        self, argv: list[str], *, cwd: str | None = None, env: Mapping[str, str] | None = None
    ) -> LocalProcess:
        self._check_open()
        cmd = await self._spawn(
            argv,
            cwd,
            env,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        lp = LocalProcess(cmd, self.cgroup, on_exit=self._procs.discard)
        self._procs.add(lp)
        return lp

    async def pids_in_use(self) -> tuple[int, int] | None:
        return self.cgroup.pids() if self.cgroup is not None else None

    async def snapshot(self) -> LocalSandbox:
        """A new sandbox whose workspace is a copy (``cp --reflink=auto``) of this one's.

        The copy runs as the sandbox's uid inside bubblewrap (``Chain.copy_argv``), never as
        root on host paths: the workspace is sandbox-controlled and may change under the copy
        (a directory swapped for a link to ``/root`` mid-copy reads nothing of the host's)."""
        self._check_open()
        cfg = dataclasses.replace(self.config, template_dir="")
        snap = await LocalSandbox.create(cfg, name=new_name(self.name + "-"))
        try:
            await run_checked(
                self._isolation.copy_argv(self.home / "ws", snap.home / "ws"),
                what=f"copying the workspace of {self.name}",
            )
        except BaseException:
            await asyncio.shield(snap.close())
            raise
        return snap

    async def is_alive(self) -> bool:
        if self._closed or not (self.home / "ws").is_dir():
            return False
        return await super().is_alive()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for p in list(self._procs):
            await p.kill()
        await self._agent.close()  # the sandbox cgroup's kill below takes its commands
        if self.cgroup:
            await self.cgroup.destroy()
        else:
            kill_marked(self.name + "/")
        await remove_home(self.home)

    @classmethod
    async def sweep(cls, prefix: str, config: object | None = None) -> SweepReport:
        cfg = config if isinstance(config, LocalSandbox.Config) else LocalSandbox.Config()
        procs = kill_marked(prefix)
        cg_procs, groups = (
            await _cgroup.sweep(cfg.cgroup_parent, prefix) if _cgroup.version() else (0, 0)
        )
        dirs = 0
        root = root_dir(cfg.root_dir)
        for d in list(root.iterdir()) if root.is_dir() else ():
            if d.name.startswith(prefix) and d.is_dir():
                await remove_home(d)
                dirs += 1
            elif d.name.startswith(prefix) and d.name.endswith(".img"):
                d.unlink(missing_ok=True)  # an image whose mount point is gone
        await asyncio.to_thread(drop_stale_spares)
        return SweepReport(processes=procs + cg_procs, cgroups=groups, dirs=dirs)

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxError(f"sandbox {self.name} is closed")


async def _pump(stream: asyncio.StreamReader | None, cap: OutputCap) -> None:
    while stream is not None and (chunk := await stream.read(65536)):
        cap.feed(chunk)


async def _feed(stream: asyncio.StreamWriter | None, data: bytes) -> None:
    if stream is None:
        return
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        stream.write(data)
        await stream.drain()
        stream.close()
