"""The order of an interrupting sync (``inference.interrupt: abort``) in ``Fleet._sync``.

Fakes stand in for the client, the weight sync and the supervisor (the real path runs in
``tests/inference/test_interrupt.py`` and the rollout-worker test): every client, the
workers' first, holds aborted requests before any server is paused; the servers resume and
the clients let go only after the push; a server that cannot be paused, or a push that fails,
still ends the interrupt.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agentrl.errors import InferenceError
from trainers.config import InferenceConfig
from trainers.serving import Fleet


class _Client:
    def __init__(self, log: list[str], pause_fails: bool = False) -> None:
        self.log, self.pause_fails = log, pause_fails
        self.backends = {"http://a": "sglang"}

    def begin_interrupt(self) -> None:
        self.log.append("client holds")

    def end_interrupt(self) -> None:
        self.log.append("client lets go")

    async def pause(self, mode: str) -> None:
        self.log.append(f"pause {mode}")
        if self.pause_fails:
            raise InferenceError("http://a: connection refused")

    async def resume(self) -> None:
        self.log.append("resume")


class _Sync:
    def __init__(self, log: list[str], fails: bool = False) -> None:
        self.log, self.fails = log, fails

    async def push(self, named: Any, version: int, targets: Any) -> None:
        self.log.append(f"push {version}")
        if self.fails:
            raise InferenceError("push failed")

    async def verify(self, targets: Any) -> bool:
        return True


class _Supervisor:
    async def check(self) -> None:
        pass

    async def confirm_failure(self) -> bool:
        return False


def _fleet(tmp_path: Path, log: list[str], **kw: Any) -> Fleet:
    fleet = Fleet(
        InferenceConfig(interrupt="abort"), run_seed=0, dtype="float32", device="cpu",
        log_dir=tmp_path,
    )  # fmt: skip
    fleet.client = _Client(log, kw.get("pause_fails", False))  # type: ignore[assignment]
    fleet.weight_sync = _Sync(log, kw.get("push_fails", False))  # type: ignore[assignment]
    fleet.supervisor = _Supervisor()  # type: ignore[assignment]

    async def begin() -> None:
        log.append("workers hold")

    async def end() -> None:
        log.append("workers let go")

    fleet.interrupt_hooks.append((begin, end))
    return fleet


def test_clients_hold_before_the_pause_and_let_go_after_the_resume(tmp_path: Path) -> None:
    log: list[str] = []
    fleet = _fleet(tmp_path, log)
    try:
        fleet.sync({}, 3, verify=True)
    finally:
        fleet.loop.close()
    assert log == [
        "client holds", "workers hold", "pause abort", "push 3", "resume", "client lets go",
        "workers let go",
    ]  # fmt: skip


def test_a_server_that_cannot_be_paused_does_not_fail_the_sync(tmp_path: Path) -> None:
    log: list[str] = []
    fleet = _fleet(tmp_path, log, pause_fails=True)
    try:
        fleet.sync({}, 4, verify=True)
    finally:
        fleet.loop.close()
    assert "push 4" in log and log[-2:] == ["client lets go", "workers let go"]


def test_a_failed_push_still_ends_the_interrupt(tmp_path: Path) -> None:
    log: list[str] = []
    fleet = _fleet(tmp_path, log, push_fails=True)
    try:
        with pytest.raises(InferenceError, match="push failed"):
            fleet.sync({}, 5, verify=True)
    finally:
        fleet.loop.close()
    assert log[-3:] == ["resume", "client lets go", "workers let go"]
