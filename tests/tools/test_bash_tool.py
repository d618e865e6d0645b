"""The persistent bash tool and the python tool, against a real local sandbox."""

from __future__ import annotations

import asyncio

import psutil
import pytest

from agentrl.sandbox import Sandbox
from agentrl.tool import ToolSet
from agentrl.types import ToolCall
from tests.sandboxes.conftest import marked_processes
from tools.bash import bash
from tools.python import python


async def run(sb: Sandbox, command: str, **kw: object) -> str:
    return await bash(command=command, sandbox=sb, **kw)  # type: ignore[no-any-return]


async def test_cwd_and_variables_persist(sandbox: Sandbox) -> None:
    assert await run(sandbox, "mkdir -p a/b && cd a/b && export GREETING=hello") == "[no output]"
    assert await run(sandbox, "pwd; echo $GREETING") == f"{sandbox.workdir}/a/b\nhello\n"


async def test_exit_code_stderr_and_no_trailing_newline(sandbox: Sandbox) -> None:
    out = await run(sandbox, "echo to-out; echo to-err >&2; printf last; false")
    assert out == "to-out\nto-err\nlast\n[exit code 1]"


async def test_bad_syntax_and_stdin_readers_do_not_wedge_the_shell(sandbox: Sandbox) -> None:
    out = await run(sandbox, 'echo "unclosed')
    assert "exit code 2" in out
    assert await run(sandbox, "cat; read x; echo after") == "after\n"


async def test_timeout_interrupts_but_keeps_the_shell(sandbox: Sandbox) -> None:
    await run(sandbox, "cd /tmp && export KEEP=1")
    out = await run(sandbox, "echo started; sleep 100", timeout=1)
    assert out.startswith("started\n") and "timed out after 1s" in out
    assert "restarted" not in out
    assert await run(sandbox, "pwd; echo $KEEP") == "/tmp\n1\n"


async def test_stuck_shell_is_restarted(sandbox: Sandbox) -> None:
    await run(sandbox, "export GONE=1")
    out = await run(sandbox, "while :; do :; done", timeout=1)
    assert "timed out" in out and "restarted" in out
    assert await run(sandbox, "echo ${GONE:-unset}") == "unset\n"


async def test_exit_and_restart(sandbox: Sandbox) -> None:
    assert "[the shell exited]" in await run(sandbox, "exit 3")
    out = await run(sandbox, "echo back")
    assert out.startswith("back\n") and "restarted" in out
    out = await run(sandbox, "echo fresh", restart=True)
    assert out.startswith("fresh\n")


async def test_background_jobs_live_until_close(sandbox: Sandbox) -> None:
    await run(sandbox, "sleep 1000 &")
    # The job is forked at once but may still be a `bash` child that has not exec'd `sleep`
    # yet on a loaded machine, so look a few times (bounded).
    for _ in range(50):
        if "sleep" in await run(sandbox, "cat /proc/[0-9]*/comm"):
            break
        await asyncio.sleep(0.1)
    assert "sleep" in await run(sandbox, "cat /proc/[0-9]*/comm")
    assert any(p.name() == "sleep" for p in marked_processes(sandbox.name))
    # the sandbox fixture closes the sandbox and fails the test if the sleep survives


async def test_huge_output_is_clipped(sandbox: Sandbox) -> None:
    out = await run(sandbox, "seq 1 1000000")
    assert "truncated" in out and len(out) < 30_000
    assert out.startswith("1\n2\n") and out.rstrip().endswith("1000000")


async def test_through_a_toolset_the_sandbox_is_injected(sandbox: Sandbox) -> None:
    tools = ToolSet([bash, python])
    schema = tools["bash"].parameters
    assert "sandbox" not in schema["properties"] and schema["required"] == ["command"]
    r = await tools.call(ToolCall(name="bash", arguments={"command": "echo 6"}), sandbox=sandbox)
    assert (r.content, r.is_error) == ("6\n", False)


async def test_python_tool(sandbox: Sandbox) -> None:
    assert await python(code="print(6 * 7)", sandbox=sandbox) == "42\n"
    out = await python(code="raise SystemExit('bad input')", sandbox=sandbox)
    assert "bad input" in out and "[exit code 1]" in out
    out = await python(code="while True: pass", sandbox=sandbox, timeout=1)
    assert "timed out" in out


async def test_cancelled_call_does_not_leak_into_the_next(sandbox: Sandbox) -> None:
    task = asyncio.create_task(run(sandbox, "sleep 2; echo stale-output"))
    await asyncio.sleep(0.5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    out = await run(sandbox, "sleep 2.5; echo fresh")
    assert out == "fresh\n"


async def test_daemons_of_a_session_live_until_close_and_no_longer(sandbox: Sandbox) -> None:
    await run(sandbox, "(setsid sleep 9137 &); (env -i setsid sleep 9138 &); echo ok")
    listing = ""
    for _ in range(50):  # forked at once, maybe not exec'd `sleep` yet on a loaded machine
        listing = await run(sandbox, "cat /proc/[0-9]*/cmdline | tr '\\0' ' '")
        if "sleep 9137" in listing and "sleep 9138" in listing:
            break
        await asyncio.sleep(0.1)
    assert "sleep 9137" in listing and "sleep 9138" in listing
    # the fixture closes the sandbox; the env -i daemon carries no marker, so look for it too
    sleeps = [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", "9138"]]
    assert sleeps
    await sandbox.close()
    _, alive = psutil.wait_procs(sleeps, timeout=10)
    assert alive == []
