"""Load: 200 concurrent sessions on one tool server, each with its own local sandbox, each making
8 SWE tool calls (bash, python, str_replace_editor, search) over real HTTP on loopback; then
every resource the server used (fds, child processes, cgroups, temp and sandbox dirs) must be
back to its baseline. The 200-session run is ``slow`` (about 15-25 s on a shared 2-core
machine); the default run does the same with 24 sessions.

Sizing the server for this: ``SandboxPool.Config.max_active`` caps live sandboxes (32 by
default), and a session holds its sandbox for its whole life, so ``max_active`` (and
``max_sessions``) must be at least the number of live sessions; past it, ``POST /sessions``
waits up to ``acquire_timeout_s`` for a free sandbox and then answers 503. The pool's
``create_rate_per_s`` (20 by default) is raised so sandboxes start without a queue. Clients:
4 ``RemoteToolSet``s sharing the sessions (httpx2 keeps at most 100 connections per client).
Every session is open before any of them calls a tool (a barrier), so all are live at once.

The test prints throughput (calls/s) and per-call latency p50/p99 (run with ``-s`` to see them).
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from agentrl.http import ServerThread
from agentrl.sandbox_pool import SandboxPool
from agentrl.toolserver import RemoteToolSet, ToolServer
from agentrl.types import ToolCall
from sandboxes import _cgroup, _disk
from tools.swe import swe_toolset

TOKEN = "load-token-0123456789"
MAX_SESSIONS = 200
CLIENTS = 4


@dataclass(frozen=True, slots=True)
class Baseline:
    fds: int
    children: set[int]

    @classmethod
    def now(cls) -> Baseline:
        me = psutil.Process()
        kids = {p.pid for p in me.children(recursive=True) if _alive(p)}
        return cls(fds=me.num_fds(), children=kids)


def _alive(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _cgroup_children(parent: str) -> list[str]:
    bases = [b for b in _cgroup._bases(parent) if b.exists()]
    return [str(d) for b in bases for d in b.iterdir() if d.is_dir()]


@pytest.fixture
def private_tmp(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """TMPDIR (and Python's tempdir) for this test alone, so leftovers there are ours."""
    d = Path(tempfile.mkdtemp(prefix="agentrl-loadtmp-"))
    os.chmod(d, 0o711)
    monkeypatch.setenv("TMPDIR", str(d))
    monkeypatch.setattr(tempfile, "tempdir", str(d))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def load_server(needs_local: None, private_tmp: Path) -> Iterator[tuple[ToolServer, str, str]]:
    from sandboxes.local import LocalSandbox

    root = private_tmp / "sandboxes"
    root.mkdir(mode=0o711)
    cg_parent = f"agentrl-loadtest{os.getpid()}"
    sb_cfg = LocalSandbox.Config(
        root_dir=str(root), cgroup_parent=cg_parent, memory_mb=256, pids_max=64, exec_timeout_s=60
    )
    pool = SandboxPool.Config(
        max_active=MAX_SESSIONS + 8,
        create_rate_per_s=1000,
        acquire_timeout_s=120,
        run_id=f"load{os.getpid()}",
    )
    cfg = ToolServer.Config(
        token=TOKEN, pool=pool, max_sessions=MAX_SESSIONS + 8, call_timeout_s=120
    )
    server = ToolServer(swe_toolset(), cfg, sb_cfg)
    thread = ServerThread(server.app())
    thread.start()
    try:
        yield server, thread.url, cg_parent
    finally:
        thread.stop()
        for base in _cgroup._bases(cg_parent):
            if base.exists() and not _cgroup_children(cg_parent):
                base.rmdir()


def script(i: int) -> list[tuple[ToolCall, str]]:
    """Eight calls for session ``i`` and a string each answer must contain."""

    def tc(name: str, **arguments: object) -> ToolCall:
        return ToolCall(name=name, arguments=arguments)

    edit = tc(
        "str_replace_editor",
        command="str_replace",
        path="/workspace/m.py",
        old_str="N = 1",
        new_str=f"N = {i}",
    )
    return [
        (tc("bash", command=f"mkdir -p d && cd d && echo sid-{i} > n.txt"), ""),
        (tc("bash", command="cat n.txt; pwd"), f"sid-{i}\n/workspace/d"),  # cwd persisted
        (
            tc(
                "str_replace_editor",
                command="create",
                path="/workspace/m.py",
                file_text="N = 1\nprint(N * 2)\n",
            ),
            "m.py",
        ),
        (edit, "N = " + str(i)),
        (tc("python", code="print(open('/workspace/d/n.txt').read().strip())"), f"sid-{i}"),
        (tc("bash", command="python3 /workspace/m.py"), str(2 * i)),
        (tc("search", pattern="sid-[0-9]+", path="/workspace"), f"sid-{i}"),
        (tc("str_replace_editor", command="view", path="/workspace/m.py"), f"N = {i}"),
    ]


async def run_session(
    tools: RemoteToolSet, i: int, all_open: asyncio.Barrier, latencies_s: list[float]
) -> list[str]:
    """Open a session, wait until every session is open, run the script; returns problems."""
    problems = []
    async with tools.session() as s:
        await all_open.wait()
        for call, expect in script(i):
            t0 = time.perf_counter()
            res = await s.call(call)
            latencies_s.append(time.perf_counter() - t0)
            if res.is_error or expect not in res.content:
                problems.append(f"session {i} {call.name}: {res.content[:200]!r}")
            if set(re.findall(r"sid-(\d+)", res.content)) - {str(i)}:
                problems.append(f"session {i} sees another session's file: {res.content!r}")
    return problems


async def wait_back_to(base: Baseline, timeout_s: float = 30.0) -> Baseline:
    """Poll until fds and child processes are back to ``base`` (connections close lazily)."""
    deadline = time.monotonic() + timeout_s
    while True:
        now = Baseline.now()
        if (now.fds <= base.fds and now.children <= base.children) or time.monotonic() > deadline:
            return now
        await asyncio.sleep(0.2)


@pytest.mark.parametrize("sessions", [24, pytest.param(MAX_SESSIONS, marks=pytest.mark.slow)])
async def test_concurrent_sessions_on_one_server(
    load_server: tuple[ToolServer, str, str], private_tmp: Path, sessions: int
) -> None:
    server, url, cg_parent = load_server
    # warm-up: one full session, so lazily made things (thread pools, caches) exist; its
    # client is closed before the baseline, so the baseline holds no client connections
    warm = RemoteToolSet(RemoteToolSet.Config(url=url, token=TOKEN))
    assert await run_session(warm, 0, asyncio.Barrier(1), []) == []
    await warm.aclose()
    await asyncio.sleep(1.0)  # the server closes its side of those connections
    base = Baseline.now()
    clients = [RemoteToolSet(RemoteToolSet.Config(url=url, token=TOKEN)) for _ in range(CLIENTS)]
    base_cgroups = _cgroup_children(cg_parent)

    latencies_s: list[float] = []
    all_open = asyncio.Barrier(sessions + 1)
    tasks = [
        asyncio.create_task(run_session(clients[i % CLIENTS], i, all_open, latencies_s))
        for i in range(sessions)
    ]
    async with asyncio.timeout(300):
        while all_open.n_waiting < sessions and not any(t.done() for t in tasks):
            await asyncio.sleep(0.05)
        ended = [t.exception() or t.result() for t in tasks if t.done()]
        assert not ended, f"{len(ended)} sessions ended before all were open: {ended[:3]!r}"
        assert server.metrics()["sessions_open"] == sessions  # all live at once
        assert server.pool is not None and server.pool.stats().live >= sessions
        t0 = time.perf_counter()
        await all_open.wait()
        problems = [p for ps in await asyncio.gather(*tasks) for p in ps]
    wall_s = time.perf_counter() - t0
    assert problems == []
    assert len(latencies_s) == sessions * len(script(0))

    m = server.metrics()
    assert m["sessions_open"] == 0 and m["sessions_closed"] == sessions + 1
    assert m["sandboxes_live"] == 0 and m["rate_limited"] == 0
    for c in clients:
        await c.aclose()
    after = await wait_back_to(base)
    # removed images are deleted on the disk cap's background threads (seconds for 200 on 2 busy cores)
    assert await asyncio.to_thread(_disk.settle, 120.0), (
        "the disk cap's background deletes did not finish"
    )
    assert after.fds <= base.fds, f"fds: {base.fds} before, {after.fds} after"
    assert after.children <= base.children, f"processes left: {after.children - base.children}"
    assert _cgroup_children(cg_parent) == base_cgroups == []
    assert list((private_tmp / "sandboxes").iterdir()) == []
    # No other temp files, but the disk cap's cache (sandboxes/_disk.py): formatted template
    # images shared by every sandbox on the machine, and this process's one ready spare.
    left = sorted(p.name for p in private_tmp.iterdir())
    assert left in (["sandboxes"], ["agentrl-disk-templates", "sandboxes"]), left
    cache = private_tmp / "agentrl-disk-templates"
    extra = [
        p.name
        for p in (cache.iterdir() if cache.exists() else [])
        if not p.name.startswith(("ext4-", f"spare-{os.getpid()}-"))
    ]
    assert extra == [], f"per-sandbox files left in the disk cache: {extra}"

    q = statistics.quantiles(latencies_s, n=100)
    server_ms = {k: round(v["latency_s_mean"] * 1e3) for k, v in m["tools"].items()}
    print(
        f"\nload: {sessions} sessions x {len(script(0))} calls = {len(latencies_s)} calls in "
        f"{wall_s:.1f}s: {len(latencies_s) / wall_s:.0f} calls/s, latency p50 "
        f"{q[49] * 1e3:.0f} ms, p99 {q[98] * 1e3:.0f} ms (client side); mean ms in the tool "
        f"(server side): {server_ms}"
    )
