"""Closed sandboxes are freed: a bash session does not keep its sandbox (or a docker client's
sockets) alive after close. Counts live sandbox objects and this process's open fds."""

from __future__ import annotations

import gc
import os
import shutil
import tempfile
import weakref

import pytest

from agentrl.sandbox import Sandbox, make_sandbox, new_name
from tests.sandboxes.conftest import docker_ready, local_ready
from tools.bash import bash


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def _churn(backend: str, root: str, n: int) -> tuple[int, int, int]:
    """Create, use (bash + exec + files) and close ``n`` sandboxes after one warm-up;
    (sandboxes still alive, fds before, fds after)."""
    refs: list[weakref.ref[Sandbox]] = []

    async def one() -> None:
        sb = await make_sandbox(
            backend, name=new_name(f"agentrl-churn{os.getpid()}-"), root_dir=root
        )
        try:
            assert await bash(command="cd /tmp && echo hi", sandbox=sb) == "hi\n"
            await sb.write_file("f.txt", "x")
            assert (await sb.exec("cat f.txt", timeout_s=30)).stdout == "x"
        finally:
            await sb.close()
        refs.append(weakref.ref(sb))

    await one()  # imports, thread pools, probes: paid once
    gc.collect()
    before = _fds()
    for _ in range(n):
        await one()
    gc.collect()
    return sum(r() is not None for r in refs), before, _fds()


@pytest.mark.parametrize(
    ("backend", "n"),
    [
        ("local", 20),
        pytest.param("local", 200, marks=pytest.mark.slow),
        pytest.param("docker", 50, marks=pytest.mark.docker),
    ],
)
async def test_closed_sandboxes_are_freed(backend: str, n: int) -> None:
    why = local_ready() if backend == "local" else docker_ready()
    if why:
        pytest.skip(why)
    root = tempfile.mkdtemp(prefix="agentrl-churn-")
    os.chmod(root, 0o711)
    try:
        alive, before, after = await _churn(backend, root, n)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert alive == 0, f"{alive} of {n + 1} closed {backend} sandboxes are still in memory"
    assert after <= before, f"open fds grew from {before} to {after} over {n} sandboxes"
