"""Process chains of the local sandbox (``sandboxes._local_process``)."""

from __future__ import annotations

import asyncio
import sys

import psutil

from sandboxes._local_process import Command


async def test_a_start_cancelled_while_it_spawns_neither_hangs_nor_leaves_its_process() -> None:
    """Python 3.11's asyncio waits forever for a spawn cancelled before its pipes are connected
    (a sandbox closed while its exec agent started hung there). Command.start lets the spawn
    finish, kills it, and re-raises the cancel."""
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    sleep = f"{sys.executable} -c 'import time; time.sleep(60)'"
    # A grandchild holds the pipes open, as the sandbox's agent does under bubblewrap.
    chain = ["/bin/sh", "-c", f"{sleep} & exec {sleep}"]
    pipe = asyncio.subprocess.PIPE
    try:
        for _ in range(3):
            task = asyncio.create_task(
                Command.start(chain, {}, None, "t", stdin=pipe, stdout=pipe, stderr=pipe)
            )
            await asyncio.sleep(0)  # spawned (synchronously); its pipes are being connected
            task.cancel()
            done, _ = await asyncio.wait([task], timeout=10)
            assert done, "the cancelled start hung"
            assert task.cancelled()
        for _ in range(200):  # killed once each spawn finished
            left = _live_children(me, before)
            if not left:
                break
            await asyncio.sleep(0.05)
        assert not left, left
    finally:
        # The shielded spawns run on after the cancels: let them finish before the test's event
        # loop is closed, whatever failed above. Closing it cancels every task, and a spawn
        # cancelled before its pipes are connected is the very 3.11 hang (the suite would stop).
        for _ in range(200):
            if not [t for t in asyncio.all_tasks() if "subprocess_exec" in repr(t.get_coro())]:
                break
            await asyncio.sleep(0.05)


def _live_children(me: psutil.Process, before: set[int]) -> list[list[str]]:
    """Command lines of ``me``'s descendants started since ``before``, not zombies; a process
    that exits while it is looked at is gone, not left."""
    left = []
    for p in me.children(recursive=True):
        if p.pid in before:
            continue
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                left.append(p.cmdline())
        except psutil.NoSuchProcess:
            continue
    return left
