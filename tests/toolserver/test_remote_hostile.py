"""The hostile-command suite of ``tests/sandboxes/test_hostile.py`` against RemoteSandbox: the
same checks, each sandbox reached over HTTP through a sandbox server on loopback.

``make`` here builds remote sandboxes; after each test it closes them and fails the test if the
server still holds one, or a process or host directory of one is left behind.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agentrl.sandbox import Sandbox, make_sandbox, new_name
from tests.sandboxes.conftest import MakeSandbox, marked_processes
from tests.sandboxes.test_hostile import (  # noqa: F401  (collected here, with this make)
    test_background_process_of_session_dies_at_close,
    test_background_processes_do_not_outlive_exec,
    test_big_file_hits_size_limit,
    test_cpu_time_limit,
    test_fork_bomb_is_contained,
    test_host_is_read_only,
    test_host_secrets_are_hidden,
    test_huge_output_is_capped,
    test_infinite_loop_times_out_and_leaves_nothing,
    test_killing_own_parents_is_harmless,
    test_memory_hog_is_killed,
    test_network_when_allowed,
    test_no_network_by_default,
    test_other_processes_are_hidden,
    test_other_sandbox_workspace_is_hidden,
    test_symlink_to_host_file_does_not_leak_through_file_api,
)
from tests.toolserver.conftest import TOKEN


@pytest.fixture
async def make(sandbox_server: tuple[object, str], sandbox_root: str) -> AsyncIterator[MakeSandbox]:
    server, url = sandbox_server
    made: list[Sandbox] = []

    async def factory(**options: object) -> Sandbox:
        sb = await make_sandbox(
            "remote",
            name=new_name(f"agentrl-test{os.getpid()}-"),
            url=url,
            token=TOKEN,
            options=options,
        )
        made.append(sb)
        return sb

    yield factory
    for sb in made:
        await sb.close()
    problems = [f"process {p.pid}" for sb in made for p in marked_processes(sb.name)]
    problems += [f"dir {d}" for d in Path(sandbox_root).iterdir()]
    problems += [f"server entry {k}" for k in getattr(server, "entries", {})]
    assert problems == [], f"sandboxes leaked: {problems}"
