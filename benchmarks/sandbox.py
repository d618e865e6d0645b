"""Sandbox latency and throughput per backend, next to SWE-ReX and two floors, in one run.

    python benchmarks/sandbox.py [--n 40] [--creates 20] [--sandboxes 8] [--per-sandbox 5]
                                 [--targets ...]
        (default targets: local,local-unhardened,local-chain,local-bash,remote,
         remote-unhardened,docker,swerex,swerex-bash,swerex-bash-stock,bwrap,pipe-shell,
         subprocess)

For each target: exec latency for ``echo hi``, ``python3 -c pass`` and ``ls /`` (p50/p99 over
``--n`` runs in one sandbox per target; the runs are interleaved, round by round, over all
targets, every other round in reverse order, so a shared machine's load falls on every
target alike), then create latency, the first exec after create and destroy latency
(``--creates`` rounds, interleaved the same way), then concurrent exec throughput
(``--sandboxes`` fresh sandboxes, ``--per-sandbox`` ``echo hi`` each, all at once; this
includes each sandbox's first exec), target after target.
Every target runs with the same ``PATH``, the one the local sandbox gives its commands
(``/usr/local/sbin:...:/bin``): the benchmark sets it before anything starts, and exports it
again in SWE-ReX's session (its bash runs in a pty, so it is interactive and reads
``~/.bashrc``), so ``python3`` is the same binary everywhere. Found through pyenv's shims on
this host, ``python3 -c pass`` took 0.5-0.7 s in SWE-ReX's session instead of ~0.1 s.
Targets:

- ``local``: ``LocalSandbox.exec`` through the sandbox's exec agent (started once per sandbox,
  at create, through the bubblewrap + cgroup + rlimits chain; each command is then forked
  inside the sandbox into its own pid namespace);
- ``local-unhardened``: the same with the hardening knobs off (``sandboxes.local.HARDENING_OFF``:
  ``seccomp=False``, ``disk_mb=0``), the baseline of the hardening cost. ``local`` runs the
  defaults, which are the hardened settings: the seccomp filter (installed once in the exec
  agent, inherited by each command) and the disk cap (workspace and /tmp on their own
  ``DEFAULT_DISK_MB`` ext4, mounted from a spare loop device made ahead);
- ``local-chain``: ``LocalSandbox.exec`` with ``exec_agent=False`` (a fresh chain per command);
- ``local-bash``: the ``bash`` tool's persistent shell in a local sandbox (``BashSession.run``);
- ``remote``: ``RemoteSandbox.exec`` against ``python -m sandboxes.server`` (a subprocess on
  loopback, local backend behind it), hardened: per-sandbox session tokens and the local
  defaults behind it;
- ``remote-unhardened``: the same against a second server started with
  ``--no-sandbox-tokens --sandbox-option seccomp=false --sandbox-option disk_mb=0``;
- ``docker``: ``DockerSandbox.exec``, only when a Docker engine and the image are present;
- ``swerex``: SWE-ReX ``LocalRuntime.execute`` (``subprocess.run`` on the host, no isolation);
- ``swerex-bash``: SWE-ReX ``LocalRuntime.run_in_session`` (its pexpect bash session, what
  SWE-agent uses per command) with pexpect's ``delaybeforesend`` off. pexpect sleeps 50 ms
  before every send by default and a session sends twice per command (the command, then
  ``echo $?``), so ~100 ms of the stock figure is that sleep; SWE-ReX itself does not need it
  (it waits for its prompt string). The headline baseline;
- ``swerex-bash-stock``: the same with pexpect's default 50 ms ``delaybeforesend``, for
  reference (the figure SWE-agent users see);
- ``bwrap``: a bare ``bwrap`` per command with the local sandbox's read-only view, ``/proc``,
  ``/dev`` and its ``/workspace`` and ``/tmp`` binds (no cgroup, rlimits or uid drop): the
  floor for a fresh isolated process;
- ``pipe-shell``: one ``bash`` on the host driven over stdin/stdout pipes (a sentinel line per
  command, no isolation): the floor for a persistent shell;
- ``subprocess``: a bare ``asyncio.create_subprocess_shell``, the floor for a fresh process.

SWE-ReX is optional and is not a dependency of agentrl; install it into the benchmark's own
git-ignored venv, which the benchmark adds to the end of ``sys.path`` when ``swerex`` is not
importable otherwise (agentrl's own packages win; only SWE-ReX, pexpect and bashlex load from
there)::

    python -m venv --without-pip benchmarks/.venv
    pip --python benchmarks/.venv/bin/python install swe-rex

Without it its rows are skipped with a message. Its runtime calls block the event loop
(synchronous ``subprocess.run`` / pexpect inside ``async def``), so its concurrent figure is
serial, and its session's create includes a fixed 0.3 s sleep in ``BashSession.start``.

Two headlines, JSON, at the end. The first: ``ours`` is the sum of ``local``'s exec p50 over
the three commands, ``baseline`` the same sum for ``swerex-bash`` (no send delay), ``ratio`` =
baseline / ours; goal: ratio >= 2 (isolated execs at least twice as fast as SWE-ReX's
unisolated session). The last line is the hardening cost: ``local`` (hardened defaults) over
``local-unhardened``, for the exec p50 sum and for create p50; ``ratio`` is the larger of the
two; goal: <= 1.10 (hardening costs at most 10%). Per-command ratios to every baseline and
floor, the remote hardening ratios and the load average are printed above them.
Figures on a shared 2-core machine vary with load; compare rows from the same run only. A
target that fails (SWE-ReX's pexpect session sometimes times out under load) is reported and
the others still run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

COMMANDS = ["echo hi", "python3 -c pass", "ls /"]
SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # sandboxes.local
GOAL_RATIO = 2.0  # swerex-bash p50 sum / local p50 sum
GOAL_HARDENING = 1.10  # local p50 / local-unhardened p50, exec (summed) and create
UNHARDENED_SERVER = (
    "--no-sandbox-tokens",
    "--sandbox-option",
    "seccomp=false",
    "--sandbox-option",
    "disk_mb=0",
)
LOAD = os.getloadavg()
TOKEN = "bench-token-0123456789"
CGROUP_PARENT = f"agentrl-bench{os.getpid()}"


@dataclass(kw_only=True)
class Target:
    """How to create a sandbox, run a shell command in it and destroy it."""

    name: str
    create: Callable[[], Awaitable[Any]]
    exec: Callable[[Any, str], Awaitable[str]]
    destroy: Callable[[Any], Awaitable[None]]
    note: str = ""
    failures: list[str] = field(default_factory=list)  # calls retried after an error


@dataclass(kw_only=True)
class Result:
    target: str
    create_s: list[float] = field(default_factory=list)
    destroy_s: list[float] = field(default_factory=list)
    first_exec_s: list[float] = field(default_factory=list)
    exec_s: dict[str, list[float]] = field(default_factory=dict)
    execs_per_s: float = 0.0
    note: str = ""
    python3: str = ""


def pct(xs: list[float], q: int) -> float:
    if len(xs) < 2:
        return xs[0] if xs else float("nan")
    return statistics.quantiles(xs, n=100, method="inclusive")[q - 1]


# --- targets --------------------------------------------------------------------------------
def local_targets(root: str) -> list[Target]:
    from agentrl.sandbox import build_config
    from sandboxes.local import HARDENING_OFF, LocalSandbox
    from tools.bash import session_for
    from tools.swe import close_tools

    cfg = LocalSandbox.Config(root_dir=root, cgroup_parent=CGROUP_PARENT)
    chain_cfg = LocalSandbox.Config(root_dir=root, cgroup_parent=CGROUP_PARENT, exec_agent=False)
    soft_cfg = build_config(LocalSandbox, cfg, HARDENING_OFF)  # the knobs off

    async def run(sb: Any, cmd: str) -> str:
        r = await sb.exec(cmd, timeout_s=30)
        if r.exit_code != 0:
            raise RuntimeError(f"{cmd!r} failed in {sb.name}: {r.output}")
        return str(r.stdout)

    async def bash_create() -> Any:
        sb = await LocalSandbox.create(cfg)
        await (await session_for(sb)).run("true")  # the shell starts with the sandbox
        return sb

    async def bash_run(sb: Any, cmd: str) -> str:
        out = await (await session_for(sb)).run(cmd, timeout_s=30)
        if out.exit_code != 0:
            raise RuntimeError(f"{cmd!r} failed: {out.output}")
        return out.output

    async def bash_close(sb: Any) -> None:
        await close_tools(sb)
        await sb.close()

    return [
        Target(
            name="local",
            create=lambda: LocalSandbox.create(cfg),
            exec=run,
            destroy=lambda sb: sb.close(),
            note="exec agent in the sandbox: fork + pid namespace per command",
        ),
        Target(
            name="local-unhardened",
            create=lambda: LocalSandbox.create(soft_cfg),
            exec=run,
            destroy=lambda sb: sb.close(),
            note="the same with the hardening off: " + knobs(HARDENING_OFF),
        ),
        Target(
            name="local-chain",
            create=lambda: LocalSandbox.create(chain_cfg),
            exec=run,
            destroy=lambda sb: sb.close(),
            note="exec_agent=False: bwrap + cgroup chain per command",
        ),
        Target(
            name="local-bash",
            create=bash_create,
            exec=bash_run,
            destroy=bash_close,
            note="bash tool: persistent shell in a local sandbox",
        ),
    ]


def remote_target(
    url: str, name: str = "remote", note: str = "sandbox server on loopback (HTTP) -> local"
) -> Target:
    from agentrl.sandbox import make_sandbox

    async def run(sb: Any, cmd: str) -> str:
        r = await sb.exec(cmd, timeout_s=30)
        if r.exit_code != 0:
            raise RuntimeError(f"{cmd!r} failed remotely: {r.output}")
        return str(r.stdout)

    return Target(
        name=name,
        create=lambda: make_sandbox("remote", url=url, token=TOKEN),
        exec=run,
        destroy=lambda sb: sb.close(),
        note=note,
    )


def docker_target(root: str) -> Target | str:
    try:
        import docker

        docker.from_env().ping()
    except Exception as e:
        return f"docker: skipped, no Docker engine here ({type(e).__name__}: {e})"
    from agentrl.sandbox import make_sandbox

    async def run(sb: Any, cmd: str) -> str:
        return str((await sb.exec(cmd, timeout_s=30)).stdout)

    return Target(
        name="docker",
        create=lambda: make_sandbox("docker", root_dir=root),
        exec=run,
        destroy=lambda sb: sb.close(),
        note="docker exec",
    )


SWEREX_VENV = Path(__file__).resolve().parent / ".venv"


def import_swerex() -> None:
    """Import SWE-ReX from this environment, else from ``benchmarks/.venv`` (appended to
    ``sys.path``, so agentrl's own versions of shared dependencies win)."""
    try:
        import swerex  # noqa: F401
    except ImportError:
        sys.path += [str(p) for p in sorted(SWEREX_VENV.glob("lib/python3*/site-packages"))]


def swerex_targets() -> list[Target] | str:
    import_swerex()
    try:
        from swerex.exceptions import CommandTimeoutError
        from swerex.runtime.abstract import (
            BashAction,
            CloseBashSessionRequest,
            Command,
            CreateBashSessionRequest,
        )
        from swerex.runtime.local import LocalRuntime
    except ImportError as e:
        return (
            f"swerex: skipped, SWE-ReX is not installed ({e}); `python -m venv "
            "--without-pip benchmarks/.venv && pip --python benchmarks/.venv/bin/python "
            "install swe-rex` to compare"
        )

    async def execute(rt: Any, cmd: str) -> str:
        r = await rt.execute(Command(command=cmd, shell=True, timeout=30))
        return str(r.stdout)

    async def start_session(rt: Any, send_delay: bool) -> None:
        await rt.create_session(CreateBashSessionRequest(startup_timeout=30))
        if not send_delay:  # pexpect sleeps delaybeforesend (50 ms) before every send
            rt.sessions["default"].shell.delaybeforesend = None
        # Its bash runs in a pty, so it is interactive and reads ~/.bashrc, which may put
        # other directories (pyenv shims) first: back to the PATH every target uses.
        await rt.run_in_session(BashAction(command=f"export PATH={SANDBOX_PATH}", timeout=30))

    def bash_targets(name: str, send_delay: bool, note: str) -> Target:
        failures: list[str] = []

        async def create() -> Any:
            rt = LocalRuntime()
            await start_session(rt, send_delay)
            return rt

        async def run(rt: Any, cmd: str) -> str:
            """Under load its pexpect session sometimes misses a prompt (a 0.1 s expect): then
            start a new session and run the command again (counted in the time and the note)."""
            for attempt in range(3):
                try:
                    return str(
                        (await rt.run_in_session(BashAction(command=cmd, timeout=30))).output
                    )
                except CommandTimeoutError:
                    failures.append(cmd)
                    if attempt == 2:
                        raise
                    with contextlib.suppress(Exception):
                        await rt.close_session(CloseBashSessionRequest())
                    await start_session(rt, send_delay)
            raise AssertionError("unreachable")

        async def close(rt: Any) -> None:
            await rt.close_session(CloseBashSessionRequest())
            await rt.close()

        return Target(
            name=name, create=create, exec=run, destroy=close, note=note, failures=failures
        )

    async def plain_create() -> Any:
        return LocalRuntime()

    async def plain_close(rt: Any) -> None:
        await rt.close()

    return [
        Target(
            name="swerex",
            create=plain_create,
            exec=execute,
            destroy=plain_close,
            note="LocalRuntime.execute: subprocess.run, no isolation",
        ),
        bash_targets(
            "swerex-bash", False, "run_in_session: pexpect bash, no send delay, no isolation"
        ),
        bash_targets("swerex-bash-stock", True, "the same with pexpect's 50 ms delaybeforesend"),
    ]


def bwrap_target(root: str) -> Target:
    """A bare ``bwrap`` per command with the local sandbox's filesystem view."""
    from sandboxes._host import ro_view
    from sandboxes.local import DEFAULT_RO_PATHS

    async def create() -> str:
        home = tempfile.mkdtemp(prefix="bwrap-", dir=root)
        for d in ("ws", "tmp"):
            os.mkdir(os.path.join(home, d))
        return home

    async def run(home: str, cmd: str) -> str:
        argv = [
            "bwrap",
            "--unshare-all",
            "--die-with-parent",
            "--new-session",
            "--clearenv",
            "--setenv",
            "PATH",
            SANDBOX_PATH,
            *ro_view(list(DEFAULT_RO_PATHS)),
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--bind",
            f"{home}/ws",
            "/workspace",
            "--bind",
            f"{home}/tmp",
            "/tmp",
            "--chdir",
            "/workspace",
            "/bin/sh",
            "-c",
            cmd,
        ]
        p = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE)
        out, _err = await p.communicate()
        if p.returncode != 0:
            raise RuntimeError(f"bwrap {cmd!r} exited {p.returncode}")
        return out.decode()

    async def destroy(home: str) -> None:
        shutil.rmtree(home, ignore_errors=True)

    return Target(
        name="bwrap",
        create=create,
        exec=run,
        destroy=destroy,
        note="bare bwrap per command, same view; no cgroup, rlimits, uid drop",
    )


class PipeShell:
    """One host ``bash`` over pipes: each command is followed by a sentinel with its status."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.n = 0
        self.lock = asyncio.Lock()  # one command at a time, as in any shell session

    async def run(self, cmd: str) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        async with self.lock:
            self.n += 1
            mark = f"__DONE_{self.n}__".encode()
            line = f"{cmd} </dev/null\nprintf '\\n%s%s\\n' {mark.decode()} $?\n"
            self.proc.stdin.write(line.encode())
            out = await self.proc.stdout.readuntil(b"\n" + mark)
            code = int(await self.proc.stdout.readline())
        if code != 0:
            raise RuntimeError(f"{cmd!r} exited {code}")
        return out[: -len(mark) - 1].decode()


def pipe_shell_target() -> Target:
    async def create() -> PipeShell:
        p = await asyncio.create_subprocess_exec(
            "bash",
            "--noprofile",
            "--norc",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        return PipeShell(p)

    async def close(sh: PipeShell) -> None:
        assert sh.proc.stdin is not None
        sh.proc.stdin.close()
        await sh.proc.wait()

    return Target(
        name="pipe-shell",
        create=create,
        exec=lambda sh, c: sh.run(c),
        destroy=close,
        note="one host bash over pipes, sentinel per command, no isolation",
    )


def subprocess_target() -> Target:
    async def run(_: Any, cmd: str) -> str:
        p = await asyncio.create_subprocess_shell(cmd, stdout=asyncio.subprocess.PIPE)
        out, _err = await p.communicate()
        return out.decode()

    async def nothing(_: Any = None) -> None:
        return None

    return Target(
        name="subprocess",
        create=nothing,
        exec=run,
        destroy=nothing,
        note="asyncio subprocess on the host, no isolation",
    )


@contextlib.asynccontextmanager
async def sandbox_server(tmp: str, *extra: str) -> AsyncIterator[str]:
    """``python -m sandboxes.server`` in a subprocess on a free loopback port."""
    import httpx2

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "TMPDIR": tmp}
    argv = [sys.executable, "-m", "sandboxes.server", "--port", str(port), "--token", TOKEN, *extra]
    proc = subprocess.Popen(argv, env=env, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        async with httpx2.AsyncClient() as c:
            for _ in range(300):
                with contextlib.suppress(httpx2.TransportError):
                    if (await c.get(url + "/health")).status_code == 200:
                        break
                await asyncio.sleep(0.1)
            else:
                raise RuntimeError("the sandbox server did not start")
        yield url
    finally:
        proc.terminate()
        proc.wait(30)


# --- measuring ------------------------------------------------------------------------------
async def timed(aw: Awaitable[Any]) -> tuple[float, Any]:
    """(seconds, result) of awaiting ``aw`` (a coroutine runs only when awaited)."""
    t0 = time.perf_counter()
    out = await aw
    return time.perf_counter() - t0, out


def failed(t: Target, e: Exception) -> str:
    first = str(e).splitlines()[0] if str(e) else ""
    return f"{t.name}: failed during the run ({type(e).__name__}: {first})"


async def create_rounds(
    targets: list[Target], results: dict[str, Result], rounds: int, skipped: list[str]
) -> None:
    """Create, one command, destroy: ``rounds`` rounds, each over every target in turn, so
    that load falls on all of them alike (as in ``exec_rounds``, every other round in reverse
    order)."""
    broken: set[str] = set()
    for i in range(rounds):
        for t in targets if i % 2 == 0 else targets[::-1]:
            if t.name not in results or t.name in broken:
                continue
            res = results[t.name]
            try:
                dt, sb = await timed(t.create())
                res.create_s.append(dt)
                res.first_exec_s.append((await timed(t.exec(sb, "true")))[0])
                dt, _ = await timed(t.destroy(sb))
                res.destroy_s.append(dt)
            except Exception as e:  # report it; keep its other figures
                skipped.append(failed(t, e))
                broken.add(t.name)


async def concurrent(t: Target, res: Result, sandboxes: int, per_sandbox: int) -> None:
    """``sandboxes`` fresh sandboxes, ``per_sandbox`` ``echo hi`` each, all at once."""
    sbs = await asyncio.gather(*(t.create() for _ in range(sandboxes)))
    try:
        t0 = time.perf_counter()
        await asyncio.gather(*(t.exec(s, "echo hi") for s in sbs for _ in range(per_sandbox)))
        res.execs_per_s = sandboxes * per_sandbox / (time.perf_counter() - t0)
    finally:
        await asyncio.gather(*(t.destroy(s) for s in sbs))


async def exec_rounds(
    targets: list[Target], results: dict[str, Result], n: int, skipped: list[str]
) -> None:
    """One sandbox per target, all open at once; ``n`` rounds, each timing every command once
    on every target in turn, so that the load of a shared machine falls on all of them alike.
    Every other round runs the targets in reverse order: no target always follows the same
    one (the work docker leaves its daemon after an exec or a removal slowed whichever target
    came next, and with a fixed order that was always ``local``)."""
    live: dict[str, tuple[Target, Any]] = {}
    try:
        for t in targets:
            try:
                sb = live.setdefault(t.name, (t, await t.create()))[1]
                res = results[t.name]
                res.python3 = (await t.exec(sb, "command -v python3")).strip()
                for cmd in COMMANDS:
                    out = await t.exec(sb, cmd)  # warm-up, and a check that it really ran
                    if cmd == "echo hi" and "hi" not in out:
                        raise RuntimeError(f"{t.name}: `echo hi` printed {out!r}")
                    res.exec_s[cmd] = []
            except Exception as e:  # report it; measure the others
                skipped.append(failed(t, e))
                results.pop(t.name, None)
        for i in range(n):
            pairs = list(live.items())
            for name, (t, sb) in pairs if i % 2 == 0 else pairs[::-1]:
                if name not in results:
                    continue
                try:
                    for cmd in COMMANDS:
                        results[name].exec_s[cmd].append((await timed(t.exec(sb, cmd)))[0])
                except Exception as e:
                    skipped.append(failed(t, e))
                    results.pop(name)
    finally:
        for t, sb in live.values():
            with contextlib.suppress(Exception):
                await t.destroy(sb)


async def measure(
    targets: list[Target], args: argparse.Namespace, skipped: list[str]
) -> list[Result]:
    results = {t.name: Result(target=t.name, note=t.note) for t in targets}
    print(f"exec latency, {args.n} interleaved rounds over {len(targets)} targets ...", flush=True)
    await exec_rounds(targets, results, args.n, skipped)
    live = [t for t in targets if t.name in results]
    print(f"create, first exec, destroy: {args.creates} interleaved rounds ...", flush=True)
    await create_rounds(live, results, args.creates, skipped)
    for t in live:
        print(f"concurrent execs: {t.name} ...", flush=True)
        try:
            await concurrent(t, results[t.name], args.sandboxes, args.per_sandbox)
        except Exception as e:  # report it; keep its other figures
            skipped.append(failed(t, e))
        if t.failures:
            results[t.name].note += f" ({len(t.failures)} calls failed and were retried)"
    return list(results.values())


def print_tables(results: list[Result], skipped: list[str]) -> None:
    ms = 1e3
    print(
        f"\n{'target':<17} {'create p50/p99 ms':>18} {'1st exec p50 ms':>15} "
        f"{'destroy p50/p99 ms':>19} {'conc. exec/s':>12}  what"
    )
    for r in results:
        print(
            f"{r.target:<17} {pct(r.create_s, 50) * ms:8.1f} /{pct(r.create_s, 99) * ms:7.1f} "
            f"{pct(r.first_exec_s, 50) * ms:15.1f} "
            f"{pct(r.destroy_s, 50) * ms:9.1f} /{pct(r.destroy_s, 99) * ms:7.1f} "
            f"{r.execs_per_s:12.0f}  {r.note}"
        )
    print(f"\n{'exec p50/p99 ms':<17}" + "".join(f"{c:>22}" for c in COMMANDS))
    for r in results:
        cells = [
            f"{pct(r.exec_s[c], 50) * ms:9.1f} /{pct(r.exec_s[c], 99) * ms:8.1f}" for c in COMMANDS
        ]
        print(f"{r.target:<17}" + "".join(f"{x:>22}" for x in cells))
    found = {r.python3 for r in results}
    print(
        f"python3 found as {', '.join(sorted(found))} by every target"
        if len(found) == 1
        else "python3 differs: " + ", ".join(f"{r.target} {r.python3}" for r in results)
    )
    by = {r.target: r for r in results}
    print()
    for ours, theirs in PAIRS:
        if ours in by and theirs in by:
            ratios = [pct(by[theirs].exec_s[c], 50) / pct(by[ours].exec_s[c], 50) for c in COMMANDS]
            print(
                f"{theirs} p50 / {ours} p50: "
                + ", ".join(f"{c!r} {x:.2f}x" for c, x in zip(COMMANDS, ratios, strict=True))
            )
    for ours, base in HARDENING_PAIRS:
        if ours in by and base in by:
            ex, cr = hardening_ratios(by[ours], by[base])
            print(
                f"hardening cost, {ours} over {base}: exec p50 (sum over the commands) "
                f"{ex:.3f}x, create p50 {cr:.3f}x"
            )
    for s in skipped:
        print(s)
    print(
        "load average (1, 5, 15 min) at the start: "
        + " ".join(f"{x:.2f}" for x in LOAD)
        + ", at the end: "
        + " ".join(f"{x:.2f}" for x in os.getloadavg())
    )
    print(json.dumps(headline(by)))
    print(json.dumps(hardening_headline(by)))


def headline(by: dict[str, Result]) -> dict[str, object]:
    """The last line: local's exec p50 summed over the commands, against SWE-ReX's session
    (ratio, goal and met are None when either was not measured)."""

    def total(name: str) -> float | None:
        r = by.get(name)
        return sum(pct(r.exec_s[c], 50) for c in COMMANDS) if r else None

    ours, base = total("local"), total("swerex-bash")
    ratio = base / ours if ours and base else None
    return {
        "benchmark": "sandbox exec p50, sum over " + ", ".join(COMMANDS),
        "baseline": f"swerex-bash (SWE-ReX session, no send delay) {base * 1e3:.1f} ms"
        if base
        else "swerex-bash not measured (SWE-ReX not installed, not selected or failed)",
        "ours": f"local (exec agent) {ours * 1e3:.1f} ms" if ours else "local not measured",
        "ratio": None if ratio is None else round(ratio, 2),
        "goal": f">= {GOAL_RATIO:g}",
        "met": None if ratio is None else ratio >= GOAL_RATIO,
    }


def hardening_ratios(ours: Result, base: Result) -> tuple[float, float]:
    """(exec p50 summed over the commands, create p50) of ``ours`` over ``base``."""
    ex = sum(pct(ours.exec_s[c], 50) for c in COMMANDS)
    ex_base = sum(pct(base.exec_s[c], 50) for c in COMMANDS)
    return ex / ex_base, pct(ours.create_s, 50) / pct(base.create_s, 50)


def hardening_headline(by: dict[str, Result]) -> dict[str, object]:
    """The last line: what the hardened defaults cost the local backend over the same
    sandbox with the knobs off (``HARDENING_OFF``); ratio is the larger of the exec and the
    create ratios (None when either target was not measured)."""
    from sandboxes.local import HARDENING_OFF

    ours, base = by.get("local"), by.get("local-unhardened")
    if ours is None or base is None or not ours.create_s or not base.create_s:
        return {
            "benchmark": "hardening cost (local)",
            "baseline": "not measured",
            "ours": "not measured",
            "ratio": None,
            "goal": f"<= {GOAL_HARDENING:g}",
            "met": None,
        }
    ex, cr = hardening_ratios(ours, base)

    def figures(r: Result) -> str:
        ms = sum(pct(r.exec_s[c], 50) for c in COMMANDS) * 1e3
        return f"exec {ms:.1f} ms, create {pct(r.create_s, 50) * 1e3:.1f} ms"

    return {
        "benchmark": "hardening cost: local exec p50 (sum over "
        + ", ".join(COMMANDS)
        + ") and create p50, hardened defaults over the knobs off",
        "baseline": f"local-unhardened ({knobs(HARDENING_OFF)}): {figures(base)}",
        "ours": f"local (defaults: {knobs(hardened_knobs())}): {figures(ours)} "
        f"(exec {ex:.3f}x, create {cr:.3f}x)",
        "ratio": round(max(ex, cr), 3),
        "goal": f"<= {GOAL_HARDENING:g}",
        "met": max(ex, cr) <= GOAL_HARDENING,
    }


def hardened_knobs() -> dict[str, object]:
    """The defaults of the knobs ``HARDENING_OFF`` turns off."""
    from sandboxes.local import HARDENING_OFF, LocalSandbox

    default = LocalSandbox.Config()
    return {k: getattr(default, k) for k in HARDENING_OFF}


def knobs(d: dict[str, object]) -> str:
    return ", ".join(f"{k}={v}" for k, v in d.items())


HARDENING_PAIRS = [("local", "local-unhardened"), ("remote", "remote-unhardened")]
PAIRS = [  # (ours, baseline or floor) for the per-command ratios
    ("local", "swerex-bash"),
    ("local", "swerex-bash-stock"),
    ("local", "swerex"),
    ("local", "bwrap"),
    ("local", "subprocess"),
    ("local-chain", "bwrap"),
    ("local-bash", "swerex-bash"),
    ("local-bash", "pipe-shell"),
]


async def main(args: argparse.Namespace) -> None:
    wanted = set(args.targets.split(","))
    tmp = tempfile.mkdtemp(prefix="agentrl-bench-")
    os.chmod(tmp, 0o711)
    targets: list[Target] = []
    skipped: list[str] = []
    os.environ["PATH"] = SANDBOX_PATH  # every target, host-side ones too, finds the same binaries
    try:
        targets += local_targets(tmp)
        for extra in (docker_target(tmp) if "docker" in wanted else None, swerex_targets()):
            if isinstance(extra, str):
                skipped.append(extra)
            elif isinstance(extra, Target):
                targets.append(extra)
            elif extra is not None:
                targets += extra
        targets += [bwrap_target(tmp), pipe_shell_target(), subprocess_target()]
        async with contextlib.AsyncExitStack() as stack:
            if "remote" in wanted:
                targets.insert(
                    4, remote_target(await stack.enter_async_context(sandbox_server(tmp)))
                )
            if "remote-unhardened" in wanted:
                url = await stack.enter_async_context(sandbox_server(tmp, *UNHARDENED_SERVER))
                targets.insert(
                    5,
                    remote_target(
                        url,
                        "remote-unhardened",
                        "the same, unhardened: " + " ".join(UNHARDENED_SERVER),
                    ),
                )
            results = await measure([t for t in targets if t.name in wanted], args, skipped)
        print_tables(results, skipped)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        from sandboxes import _cgroup

        for base in _cgroup._bases(CGROUP_PARENT):  # the parent group, empty by now
            with contextlib.suppress(OSError):
                base.rmdir()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--n", type=int, default=40, help="sequential execs per command")
    p.add_argument("--creates", type=int, default=20, help="create/destroy rounds per target")
    p.add_argument("--sandboxes", type=int, default=8, help="sandboxes in the concurrent run")
    p.add_argument("--per-sandbox", type=int, default=5, help="execs per sandbox, concurrent run")
    p.add_argument(
        "--targets",
        default="local,local-unhardened,local-chain,local-bash,remote,remote-unhardened,docker,"
        "swerex,swerex-bash,swerex-bash-stock,bwrap,pipe-shell,subprocess",
    )
    asyncio.run(main(p.parse_args()))
