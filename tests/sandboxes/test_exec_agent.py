"""The local sandbox's exec agent: commands it starts are contained like fresh-chain ones, it
survives what commands do to it, a dead agent fails its commands loudly and is replaced, and
nothing of it is left after close.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal

import psutil
import pytest

from agentrl.errors import SandboxError
from agentrl.sandbox import Sandbox
from tests.sandboxes.conftest import MakeSandbox, local_ready, marked_processes

pytestmark = pytest.mark.skipif(local_ready() is not None, reason=str(local_ready()))


@pytest.fixture
def backend() -> str:
    return "local"


def agent_process(sb: Sandbox) -> psutil.Process:
    """The agent's python process (the chain's pid is bwrap's; the agent is bwrap's grandchild)."""
    agent = getattr(sb, "_agent").agent  # noqa: B009 (the sandbox's AgentSlot)
    assert agent is not None and agent.alive, "no exec agent is running"
    for p in psutil.Process(agent.cmd.proc.pid).children(recursive=True):
        if p.name().startswith("python3") and p.parent().name() == "bwrap":
            return p
    raise AssertionError("the exec agent's process was not found")


@pytest.mark.parametrize("exec_agent", [True, False])
async def test_both_paths_agree(make: MakeSandbox, exec_agent: bool) -> None:
    sb = await make(exec_agent=exec_agent, env={"FROM_CONFIG": "cfg"})
    r = await sb.exec(
        "echo $FROM_CONFIG $X $(id -u); pwd; cat; echo e >&2; exit 4",
        cwd="/tmp",
        env={"X": "x"},
        stdin="in\n",
        timeout_s=10,
    )
    assert (r.exit_code, r.stdout, r.stderr) == (4, "cfg x 65534\n/tmp\nin\n", "e\n")
    r = await sb.exec(["sh", "-c", "kill -TERM $$; sleep 5"], timeout_s=10)
    assert r.exit_code in (0, 128 + signal.SIGTERM)
    assert (await sb.exec("yes | head -n 1", timeout_s=10)).stderr == ""  # SIGPIPE is default
    assert (await sb.exec(["no-such-command"], timeout_s=10)).exit_code != 0
    assert (await sb.exec("true", cwd="/no/such/dir", timeout_s=10)).exit_code != 0
    blob = bytes(range(256)) * 4096  # 1 MiB: streamed back, not capped
    await sb.write_file("blob.bin", blob)
    assert await sb.read_file("blob.bin") == blob
    assert (getattr(sb, "_agent").agent is not None) == exec_agent  # noqa: B009


async def test_concurrent_commands_in_one_sandbox(make: MakeSandbox) -> None:
    sb = await make()
    rs = await asyncio.gather(
        *(
            sb.exec(f"sleep 0.{i % 3}; cat; echo {i} >&2", stdin=f"out{i}", timeout_s=30)
            for i in range(24)
        )
    )
    assert [(r.stdout, r.stderr) for r in rs] == [(f"out{i}", f"{i}\n") for i in range(24)]
    slow, fast = await asyncio.gather(
        sb.exec("sleep 30", timeout_s=0.5), sb.exec("sleep 0.2; echo fast", timeout_s=10)
    )
    assert slow.timed_out and fast.stdout == "fast\n"


async def test_commands_cannot_reach_the_agent(make: MakeSandbox) -> None:
    sb = await make()
    await sb.exec("true", timeout_s=10)
    agent = agent_process(sb)
    r = await sb.exec(
        "for p in $(ls /proc | grep -E '^[0-9]+$'); do kill -9 $p 2>/dev/null; done; "
        "cat /proc/self/oom_score_adj",
        timeout_s=10,
    )
    assert r.stdout == "0\n"  # the OOM killer may pick a command (the agent: not if it can)
    assert agent.is_running() and agent_process(sb).pid == agent.pid
    assert (await sb.exec("echo ok", timeout_s=10)).stdout == "ok\n"
    # not dumpable: its /proc files (memory, fds, environment) belong to root, not to its uid
    assert agent.uids().real == 65534 and os.stat(f"/proc/{agent.pid}/mem").st_uid == 0


async def test_a_dead_agent_fails_its_commands_and_is_replaced(
    make: MakeSandbox, caplog: pytest.LogCaptureFixture
) -> None:
    sb = await make()
    await sb.exec("true", timeout_s=10)
    first = agent_process(sb)
    running = asyncio.ensure_future(sb.exec("sleep 1000 & setsid sleep 1001 & wait", timeout_s=60))
    await asyncio.sleep(0.5)
    with caplog.at_level(logging.WARNING, logger="sandboxes._exec_agent"):
        first.kill()
        with pytest.raises(SandboxError, match="exec agent died"):
            await running
    assert "exec agent" in caplog.text
    assert marked_processes(sb.name) == []  # its commands died with it
    assert (await sb.exec("echo again", timeout_s=10)).stdout == "again\n"
    assert agent_process(sb).pid != first.pid


async def test_cancelled_exec_kills_its_command(make: MakeSandbox) -> None:
    sb = await make()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.5):
            await sb.exec("sleep 1000", timeout_s=60)
    for _ in range(200):
        if not marked_processes(sb.name):
            break
        await asyncio.sleep(0.01)
    assert marked_processes(sb.name) == []
    assert (await sb.exec("echo alive", timeout_s=10)).stdout == "alive\n"


async def test_agent_that_cannot_start_falls_back_to_fresh_chains(
    make: MakeSandbox, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sandboxes.local

    broken = ["python3", "-c", "import sys; sys.stderr.write('no agent today'); sys.exit(3)"]
    monkeypatch.setattr(sandboxes.local, "agent_argv", lambda: broken)
    with caplog.at_level(logging.WARNING, logger="sandboxes.local"):
        sb = await make()
        r = await sb.exec("echo $$; id -u", timeout_s=10)
    assert r.stdout == "2\n65534\n"  # bwrap's reaper is pid 1 on the fresh-chain path
    assert "no agent today" in caplog.text and "fresh chain" in caplog.text


async def test_close_leaves_no_agent(make: MakeSandbox) -> None:
    sb = await make(pids_max=64)
    await sb.exec("sleep 1000 &", timeout_s=10)
    agent = agent_process(sb)
    busy = asyncio.ensure_future(sb.exec("sleep 1000", timeout_s=60))
    await asyncio.sleep(0.3)
    await sb.close()
    with pytest.raises(SandboxError):
        await busy
    agent.wait(timeout=5)  # reaped: it no longer exists
    assert not psutil.pid_exists(agent.pid) or agent.status() == psutil.STATUS_ZOMBIE


async def test_the_agent_starts_in_the_background(make: MakeSandbox) -> None:
    """create() returns before the agent is up (a reset does not wait ~40 ms for it); the first
    command waits for it and runs through it (pid 1 of its own namespace, not a fresh chain's 2)."""
    sb = await make()
    slot = getattr(sb, "_agent")  # noqa: B009
    assert slot.agent is None
    assert (await sb.exec("echo $$", timeout_s=10)).stdout == "1\n"
    assert slot.agent is not None and slot.agent.alive
    agent_process(sb)


async def test_close_while_the_agent_starts_leaves_nothing(make: MakeSandbox) -> None:
    names = []
    for _ in range(3):
        sb = await make()
        names.append(sb.name)
        await asyncio.sleep(0.005 * len(names))  # cut the start short at different points
        await sb.close()
    await asyncio.sleep(0.1)
    assert [p for n in names for p in marked_processes(n)] == []  # and the fixture's leak check
