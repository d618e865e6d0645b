"""Concurrent GUI sessions: one Chromium with a context per session against a Chromium per session.

    python benchmarks/gui.py [--sessions 32] [--baseline-sessions 8] [--episodes 2]

Each session plays ``--episodes`` episodes of gui/Browser-v0's own multi-step tasks (login,
search, form in turn, a different seed each) with the oracle plan, all sessions at once:

- ``ours``: the env as shipped, every session a context of the process's one browser
  (``BrowserPool``, its cap raised to ``--sessions``);
- ``baseline``: the same env and episodes, each session with a browser of its own (a
  ``BrowserPool`` of one context per env), the way GUI envs that launch a browser per env
  instance run. ``--baseline-sessions`` of them (Chromium processes cost a lot of memory).

Reported per side: errors (an exception, or an oracle episode without reward 1), episodes/s,
and the memory the browser side needs: the proportional set size (PSS) of every process the
sessions started (Playwright's driver and Chromium's processes), read from
``/proc/<pid>/smaps_rollup`` while every session has its page open, minus nothing (no browser
runs before). Then: browser processes left after the pools are shut down, and after ``kill -9``
of a process that holds open sessions (a child started by this script with ``--hold``).

The last line is the headline: memory per session, baseline / ours; the goal is ``--sessions``
concurrent sessions without an error and no browser process left behind in either case.
Needs Debian's chromium and the ``gui`` extra (``scripts/install-sandbox-deps.sh --browser``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentrl.types import Message
from envs.gui.env import BrowserEnv, plan_action
from envs.gui.session import BrowserPool
from envs.gui.tasks import TASKS


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        kids.setdefault(ppid, []).append(int(entry.name))
    return kids


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (Playwright's driver, Chromium and its helpers)."""
    kids, out, todo = _children(), [], [pid]
    while todo:
        for child in kids.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def pss_mb(pids: list[int]) -> float:
    total_kb = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total_kb += int(line.split()[1])
                    break
        except OSError:
            continue
    return total_kb / 1024


def alive(pids: list[int]) -> list[int]:
    """Those of ``pids`` still running (zombies count as gone)."""
    out = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            out.append(pid)
    return out


def wait_gone(pids: list[int], timeout_s: float = 15.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while (left := alive(pids)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


async def episode(env: BrowserEnv, task: str, seed: int) -> str | None:
    """One oracle episode: None when it ends with reward 1, else what went wrong."""
    env.task = task
    _, info = await env.areset(seed=seed)
    if info["error"]:
        return f"reset: {info['error']}"
    assert env.site is not None
    reward, terminated = 0.0, False
    for step in env.site.plan:
        action = plan_action(step, env.view.nodes)
        reply = Message(role="assistant", content=str(action))
        _, reward, terminated, _, info = await env.astep(reply)
        if info["error"]:
            return f"{action}: {info['error']}"
    return None if terminated and reward == 1.0 else f"reward {reward}, terminated {terminated}"


async def run_side(n: int, episodes: int, own_browser: bool) -> dict[str, Any]:
    """``n`` sessions at once, ``episodes`` each; memory read while all pages are open."""
    pools = [BrowserPool(1) for _ in range(n)] if own_browser else [BrowserPool(n)]
    envs = []
    for i in range(n):
        env = BrowserEnv(screenshots=False)
        env.pool = pools[i] if own_browser else pools[0]
        envs.append(env)
    errors: list[str] = []
    opened = asyncio.Barrier(n + 1)
    memory: dict[str, float] = {}

    async def session(i: int, env: BrowserEnv) -> None:
        for k in range(episodes):
            task, seed = TASKS[(i + k) % len(TASKS)], 1000 * k + i
            try:
                if (error := await episode(env, task, seed)) is not None:
                    errors.append(f"session {i}: {task} seed {seed}: {error}")
            except Exception as e:  # counted, reported below
                errors.append(f"session {i}: {task} seed {seed}: {type(e).__name__}: {e}")
            if k == 0:
                await opened.wait()  # every session's first page is open: measure
                await opened.wait()

    async def measure() -> None:
        await opened.wait()
        procs = descendants(os.getpid())
        memory.update(pss_mb=pss_mb(procs), processes=len(procs))
        await opened.wait()

    t0 = time.perf_counter()
    try:
        await asyncio.gather(measure(), *(session(i, env) for i, env in enumerate(envs)))
        wall = time.perf_counter() - t0
        for env in envs:
            await env.aclose()
        browser_pids = descendants(os.getpid())
    finally:
        for pool in pools:
            pool.shutdown()
    left = wait_gone(browser_pids)
    return {
        "sessions": n,
        "episodes": n * episodes,
        "errors": len(errors),
        "first_errors": errors[:3],
        "wall_s": round(wall, 2),
        "episodes_per_s": round(n * episodes / wall, 3),
        "browser_processes": memory["processes"],
        "pss_mb": round(memory["pss_mb"], 1),
        "pss_mb_per_session": round(memory["pss_mb"] / n, 1),
        "left_after_shutdown": len(left),
    }


async def hold(n: int) -> None:
    """The ``--hold`` child: open ``n`` sessions, say so, and wait to be killed."""
    envs = [BrowserEnv(screenshots=False, max_contexts=n) for _ in range(n)]
    for i, env in enumerate(envs):
        env.task = TASKS[i % len(TASKS)]
        await env.areset(seed=i)
    print("HOLDING", flush=True)
    await asyncio.sleep(3600)


def killed_leaves(n: int) -> dict[str, int]:
    """Browser processes left after ``kill -9`` of a process holding ``n`` open sessions."""
    child = subprocess.Popen(
        [sys.executable, __file__, "--hold", str(n)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        if line.strip() != "HOLDING":
            raise RuntimeError(f"the --hold child did not open its sessions: {line!r}")
        procs = descendants(child.pid)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(30)
    return {"browser_processes": len(procs), "left_after_kill": len(wait_gone(procs))}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sessions", type=int, default=32)
    p.add_argument("--baseline-sessions", type=int, default=8)
    p.add_argument("--episodes", type=int, default=2, help="oracle episodes per session")
    p.add_argument("--kill-sessions", type=int, default=4, help="sessions of the kill -9 check")
    p.add_argument("--hold", type=int, default=0, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.hold:
        asyncio.run(hold(a.hold))
        return
    ours = asyncio.run(run_side(a.sessions, a.episodes, own_browser=False))
    print("ours (one browser, a context per session):", json.dumps(ours), flush=True)
    base = asyncio.run(run_side(a.baseline_sessions, a.episodes, own_browser=True))
    print("baseline (a browser per session):", json.dumps(base), flush=True)
    kill = killed_leaves(a.kill_sessions)
    print(f"kill -9 of a process holding {a.kill_sessions} sessions:", json.dumps(kill))
    met = (
        ours["errors"] == 0
        and base["errors"] == 0
        and ours["left_after_shutdown"] == base["left_after_shutdown"] == 0
        and kill["left_after_kill"] == 0
    )
    print(
        json.dumps(
            {
                "benchmark": f"gui sessions: browser memory (PSS) per session, {a.sessions} "
                f"concurrent sessions (baseline {a.baseline_sessions})",
                "baseline": f"a Chromium per session: {base['pss_mb_per_session']} MB",
                "ours": f"one Chromium, a context per session: {ours['pss_mb_per_session']} MB",
                "ratio": round(base["pss_mb_per_session"] / ours["pss_mb_per_session"], 2),
                "goal": f"{a.sessions} sessions, 0 errors, no browser process left after "
                "shutdown or kill -9",
                "met": met,
            }
        )
    )


if __name__ == "__main__":
    main()
