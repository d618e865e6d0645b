"""A real sandbox per test (local; docker too under ``-m docker``), closed and leak-checked."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator

import pytest

from agentrl.sandbox import Sandbox, make_sandbox, new_name
from tests.sandboxes.conftest import BACKENDS, docker_ready, leftovers, local_ready


@pytest.fixture(params=BACKENDS)
async def sandbox(request: pytest.FixtureRequest) -> AsyncIterator[Sandbox]:
    backend = str(request.param)
    why = local_ready() if backend == "local" else docker_ready()
    if why:
        pytest.skip(why)
    root = tempfile.mkdtemp(prefix="agentrl-tooltest-")
    os.chmod(root, 0o711)
    name = new_name(f"agentrl-tooltest{os.getpid()}-")
    sb = await make_sandbox(backend, name=name, root_dir=root)
    try:
        yield sb
    finally:
        await sb.close()
        left = leftovers(sb)
        shutil.rmtree(root, ignore_errors=True)
        assert left == [], f"sandbox leaked: {left}"
