"""Hostile commands through the bash tool's persistent session, on every backend: the session
must recover, say what happened, and leave nothing behind. Part of the hostile suite."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import httpx2
import pytest

from agentrl.http import ServerThread
from agentrl.sandbox import Sandbox, make_sandbox, new_name
from sandboxes.remote import RemoteSandbox
from tests.sandboxes.conftest import BACKENDS, docker_ready, leftovers, local_ready
from tools.bash import bash

MakeBox = Callable[..., Awaitable[Sandbox]]
TOKEN = "bash-hostile-token-0123456789"


@pytest.fixture(params=BACKENDS)
async def make(request: pytest.FixtureRequest) -> AsyncIterator[MakeBox]:
    backend = str(request.param)
    why = local_ready() if backend == "local" else docker_ready()
    if why:
        pytest.skip(why)
    root = tempfile.mkdtemp(prefix="agentrl-bashhostile-")
    os.chmod(root, 0o711)
    made: list[Sandbox] = []

    async def factory(**config: object) -> Sandbox:
        sb = await make_sandbox(
            backend, name=new_name(f"agentrl-bh{os.getpid()}-"), root_dir=root, **config
        )
        made.append(sb)
        return sb

    try:
        yield factory
    finally:
        for sb in made:
            await sb.close()
        left = [x for sb in made for x in leftovers(sb)]
        shutil.rmtree(root, ignore_errors=True)
        assert left == [], f"sandbox leaked: {left}"


@pytest.fixture
def sandbox_server() -> Iterator[str]:
    """A sandbox server (local backend) on loopback; its sandboxes are leak-checked."""
    from sandboxes.local import LocalSandbox
    from sandboxes.server import SandboxServer

    if why := local_ready():
        pytest.skip(why)
    root = tempfile.mkdtemp(prefix="agentrl-bashremote-")
    os.chmod(root, 0o711)
    srv = SandboxServer(SandboxServer.Config(token=TOKEN), LocalSandbox.Config(root_dir=root))
    try:
        with ServerThread(srv.app()) as url:
            yield url
        assert srv.entries == {} and list(Path(root).iterdir()) == [], "sandboxes left behind"
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def run(sb: Sandbox, command: str, **kw: object) -> str:
    return await bash(command=command, sandbox=sb, **kw)  # type: ignore[no-any-return]


async def test_fork_bomb_recovers_the_session(make: MakeBox) -> None:
    await bomb_and_recover(await make(pids_max=64))


async def test_fork_bomb_recovers_a_remote_session(sandbox_server: str) -> None:
    """Through a sandbox server on loopback: the client reads the sandbox's pids through the
    server (a route the session token guards), so the bash tool recovers remotely too."""
    url = sandbox_server
    sb = await make_sandbox("remote", url=url, token=TOKEN, options={"pids_max": 64})
    other = await make_sandbox("remote", url=url, token=TOKEN)
    assert isinstance(sb, RemoteSandbox) and isinstance(other, RemoteSandbox)
    try:
        usage = await sb.pids_in_use()
        assert usage is not None and usage[1] == 64 and 0 < usage[0] < 16, usage
        auth = {"Authorization": f"Bearer {TOKEN}"}
        async with httpx2.AsyncClient(base_url=url, timeout=30) as c:
            for headers in (auth, {**auth, **other._headers}):  # no token, another's token
                r = await c.post(f"/sandboxes/{sb.id}/pids", json={}, headers=headers)
                assert r.status_code == 403, r.text
            r = await c.post(f"/sandboxes/{sb.id}/pids", json={}, headers=sb._headers)
            assert r.status_code == 401  # and the server's bearer token
        await bomb_and_recover(sb)
    finally:
        await sb.close()
        await other.close()


async def bomb_and_recover(sb: Sandbox) -> None:
    await run(sb, "cd /tmp && export KEEP=1")
    notes = [await run(sb, ":(){ :|:& };:", timeout=20)]
    for _ in range(5):  # said by the bomb's own call, or at the latest by the next one
        if "process limit" in notes[-1]:
            break
        notes.append(await run(sb, "echo probe", timeout=20))
    assert "process limit (pids_max=64" in notes[-1] and "restarted" in notes[-1], notes
    out = await run(sb, "ls -d /tmp /usr; echo ${KEEP:-reset}", timeout=20)
    assert out == "/tmp\n/usr\nreset\n", out  # usable again, and no "fork: retry" noise
    usage = await sb.pids_in_use()
    assert usage is None or usage[0] < 16


async def test_no_terminal_to_inject_input_into(make: MakeBox) -> None:
    """TIOCSTI pushes bytes into a terminal's input queue; the session has no terminal."""
    sb = await make()
    script = (
        "import fcntl, os, termios\n"
        "for fd in (0, 1, 2):\n"
        "    try:\n"
        "        fcntl.ioctl(fd, termios.TIOCSTI, b'x'); print('injected', fd)\n"
        "    except OSError as e:\n"
        "        print('refused', fd, e.errno)\n"
        "try:\n"
        "    os.open('/dev/tty', os.O_RDWR); print('tty opened')\n"
        "except OSError as e:\n"
        "    print('no tty', e.errno)\n"
    )
    await sb.write_file("tiocsti.py", script)
    out = await run(sb, "python3 tiocsti.py")
    assert "injected" not in out and "tty opened" not in out, out
    assert await run(sb, "echo next") == "next\n"


async def test_zombies_do_not_build_up(make: MakeBox) -> None:
    sb = await make(pids_max=128)
    script = (
        "import os, time\n"
        "for _ in range(100):\n"
        "    if os.fork() == 0:\n"
        "        os._exit(0)\n"
        "time.sleep(0.3)\n"  # 100 zombies while the parent lives, never waited for
    )
    await sb.write_file("zombies.py", script)
    for _ in range(3):  # more zombies in total than pids_max allows at once
        assert await run(sb, "python3 zombies.py; echo done") == "done\n"
    count = "grep -l '^[0-9]* ([^)]*) Z' /proc/[0-9]*/stat 2>/dev/null | wc -l"
    assert (await run(sb, count)).strip() == "0"


async def test_memory_hog_in_the_session_is_killed_and_the_shell_stays(make: MakeBox) -> None:
    sb = await make(memory_mb=128)
    await run(sb, "export KEEP=kept")
    out = await run(
        sb, 'python3 -c \'x = bytearray(1 << 30); print("ALLOC" + "ATED")\'', timeout=60
    )
    assert "ALLOCATED" not in out and "exit code 137" in out, out
    assert await run(sb, "echo $KEEP") == "kept\n"
