"""DockerSandbox behaviour beyond the shared hostile suite: files, snapshots, sweep, errors."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agentrl.errors import SandboxError
from agentrl.sandbox import make_sandbox, sweep
from tests.sandboxes.conftest import MakeSandbox, docker_ready

pytestmark = [
    pytest.mark.docker,
    pytest.mark.skipif(docker_ready() is not None, reason=str(docker_ready())),
]


@pytest.fixture
def backend() -> str:
    return "docker"


async def test_files_snapshot_and_limits(make: MakeSandbox, tmp_path: Path) -> None:
    template = tmp_path / "repo"
    (template / "pkg").mkdir(parents=True)
    (template / "pkg" / "m.py").write_text("print('v1')\n")
    sb = await make(template_dir=str(template))
    assert (await sb.exec("python3 pkg/m.py", timeout_s=30)).stdout == "v1\n"
    await sb.write_file("pkg/m.py", "print('v2')\n")
    snap = await sb.snapshot()
    try:
        await sb.write_file("pkg/m.py", "print('v3')\n")
        assert (await snap.exec("python3 pkg/m.py", timeout_s=30)).stdout == "v2\n"
    finally:
        await snap.close()
    await sb.download("pkg", tmp_path / "back")
    assert (tmp_path / "back" / "m.py").read_text() == "print('v3')\n"
    r = await sb.exec("touch /etc/x; id -u", timeout_s=30)
    assert "Read-only file system" in r.stderr
    assert r.stdout.split()[0] == "65534"


async def test_missing_runtime_is_a_sandbox_error(make: MakeSandbox) -> None:
    with pytest.raises(SandboxError, match="no-such-runtime"):
        await make(runtime="no-such-runtime")


KILLED_RUN = textwrap.dedent(
    """
    import asyncio, os, sys
    from agentrl.sandbox import make_sandbox, new_name
    async def main():
        await make_sandbox("docker", name=new_name(sys.argv[1]), root_dir=sys.argv[2])
        print("ready", flush=True)
        os._exit(0)
    asyncio.run(main())
    """
)


async def test_sweep_removes_containers_of_a_killed_run(sandbox_root: str) -> None:
    import docker

    from sandboxes.docker import DockerSandbox

    prefix = f"agentrl-dkilled{os.getpid()}-"
    client = docker.from_env()
    try:
        out = subprocess.run(
            [sys.executable, "-c", KILLED_RUN, prefix, sandbox_root],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert "ready" in out.stdout, out.stderr
        assert [c for c in client.containers.list(all=True) if c.name.startswith(prefix)]
    finally:  # the sweep under test also keeps a failed run from leaking
        report = await sweep("docker", prefix, DockerSandbox.Config(root_dir=sandbox_root))
    assert report.containers == 1 and report.dirs == 1
    assert [c for c in client.containers.list(all=True) if c.name.startswith(prefix)] == []


async def test_unreachable_engine_is_a_sandbox_error() -> None:
    with pytest.raises(SandboxError, match="cannot reach the Docker engine"):
        await make_sandbox("docker", base_url="unix:///nonexistent/docker.sock")
