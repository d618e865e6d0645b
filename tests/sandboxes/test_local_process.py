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
        left = [
            p
            for p in me.children(recursive=True)
            if p.pid not in before and p.status() != psutil.STATUS_ZOMBIE
        ]
        if not left:
            break
        await asyncio.sleep(0.05)
    assert not left, [p.cmdline() for p in left]
