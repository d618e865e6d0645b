"""Fixtures for sandbox tests: a factory per backend that checks for leaks after each test."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import psutil
import pytest

from agentrl.sandbox import Sandbox, SandboxProcess, make_sandbox, new_name

MARKER = "AGENTRL_SANDBOX"
BACKENDS = ["local", pytest.param("docker", marks=pytest.mark.docker)]
DOCKER_IMAGE = "agentrl/bookworm-python:latest"


def local_ready() -> str | None:
    if shutil.which("bwrap") is None:
        return "bubblewrap is not installed; run scripts/install-sandbox-deps.sh"
    if os.geteuid() != 0:
        return "per-sandbox cgroups need root"
    return None


def disk_cap_ready() -> str | None:
    """Why ``disk_mb`` cannot work here (it loop-mounts an ext4 image), or None."""
    if os.geteuid() != 0:
        return "a capped filesystem needs root"
    if shutil.which("mkfs.ext4") is None or not os.path.exists("/dev/loop-control"):
        return "a capped filesystem needs mkfs.ext4 and loop devices"
    return None


def docker_ready() -> str | None:
    try:
        import docker

        client = docker.from_env()
        client.ping()
        client.images.get(DOCKER_IMAGE)
    except ImportError:
        return "the Docker SDK is not installed (pip install 'agentrl[docker]')"
    except Exception as e:
        return f"no Docker engine or no {DOCKER_IMAGE} image ({e}); see scripts/install-sandbox-deps.sh"
    return None


def marked_processes(prefix: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter():
        try:
            if (
                p.environ().get(MARKER, "").startswith(prefix)
                and p.status() != psutil.STATUS_ZOMBIE
            ):
                found.append(p)
        except (psutil.Error, OSError):
            continue
    return found


async def read_until(proc: SandboxProcess, needle: bytes, timeout_s: float = 10.0) -> bytes:
    """Read a sandbox process's output until ``needle`` shows up (or EOF / timeout)."""
    seen = b""
    async with asyncio.timeout(timeout_s):
        while needle not in seen and (chunk := await proc.read()):
            seen += chunk
    return seen


def leftovers(sb: Sandbox) -> list[str]:
    """What a closed sandbox left behind (processes, cgroups, host dirs)."""
    left = [f"process {p.pid}" for p in marked_processes(sb.name)]
    home = getattr(sb, "home", None)
    if home is not None and Path(home).exists():
        left.append(f"dir {home}")
    if home is not None and Path(f"{home}.img").exists():
        left.append(f"disk image {home}.img")
    if home is not None and f" {home} " in Path("/proc/mounts").read_text():
        left.append(f"mount {home}")
    container = getattr(sb, "container", None)
    if container is not None:
        import docker.errors

        try:
            container.reload()
            left.append(f"container {sb.name} ({container.status})")
        except docker.errors.NotFound:
            pass
    cg = getattr(sb, "cgroup", None)
    for d in getattr(cg, "dirs", []):
        if Path(d).exists():
            left.append(f"cgroup {d}")
    return left


MakeSandbox = Callable[..., Awaitable[Sandbox]]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    if request.param == "local" and (why := local_ready()):
        pytest.skip(why)
    if request.param == "docker" and (why := docker_ready()):
        pytest.skip(why)
    return str(request.param)


@pytest.fixture
def sandbox_root() -> Iterator[str]:
    """A root_dir the sandbox uid can traverse (pytest's tmp_path is root-only)."""
    root = tempfile.mkdtemp(prefix="agentrl-sbtest-")
    os.chmod(root, 0o711)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
async def make(backend: str, sandbox_root: str) -> AsyncIterator[MakeSandbox]:
    """``await make(**config)`` -> a sandbox of the test's backend, closed and leak-checked after."""
    made: list[Sandbox] = []

    async def factory(**config: object) -> Sandbox:
        config.setdefault("root_dir", sandbox_root)
        sb = await make_sandbox(backend, name=new_name(f"agentrl-test{os.getpid()}-"), **config)
        made.append(sb)
        return sb

    yield factory
    for sb in made:
        await sb.close()
    problems = [x for sb in made for x in leftovers(sb)]
    assert problems == [], f"sandboxes leaked: {problems}"
