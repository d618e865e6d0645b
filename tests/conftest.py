"""Skips that must not hide a missing engine: selected markers and CI turn them into failures.

    pytest -m docker tests/sandboxes    no Docker engine -> every selected docker test FAILS
    CI=true pytest tests/tools          no bubblewrap    -> the local-sandbox tests FAIL

The default run deselects the engine markers and skips what it cannot run, which is right on
a laptop. When a run asks for an engine by name (``-m docker``, ``-m "vllm and not slow"``),
or CI promises bubblewrap, a test of that kind that skips would let the run pass having
tested nothing; this hook reports such a skip as a failure that keeps the skip's reason.
``gpu`` is left out: GPU tests skip on purpose when a machine has fewer devices than they use.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ENGINE_MARKERS = ("docker", "browser", "vllm", "sglang")
"""Markers whose tests need an engine that a run selecting them must have."""

CI_REQUIRED = ("bubblewrap",)
"""Skip reasons that fail under CI=true: CI installs these (scripts/install-sandbox-deps.sh)."""


def selected_engines(markexpr: str) -> set[str]:
    """Engine markers a ``-m`` expression asks for (named, and not only as ``not <marker>``)."""
    wanted = set()
    for m in ENGINE_MARKERS:
        named = len(re.findall(rf"\b{m}\b", markexpr))
        if named > len(re.findall(rf"\bnot\s+{m}\b", markexpr)):
            wanted.add(m)
    return wanted


def _skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    reason = (
        str(longrepr[2]) if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    )
    return reason.removeprefix("Skipped: ")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()  # type: ignore[attr-defined]
    if not report.skipped or hasattr(report, "wasxfail"):
        return
    reason = _skip_reason(report)
    engines = selected_engines(item.config.getoption("markexpr") or "")
    marked = sorted(m for m in engines if item.get_closest_marker(m) is not None)
    if marked:
        why = f"`-m {item.config.getoption('markexpr')}` selected this {marked[0]} test"
    elif os.environ.get("CI") == "true" and any(r in reason for r in CI_REQUIRED):
        why = "CI=true promises the sandbox dependencies"
    else:
        return
    report.outcome = "failed"
    report.longrepr = f"{why}, but it would skip: {reason}"


def process_env(pid: int) -> dict[str, str]:
    """A running process's environment, read from /proc (tests of what launchers pass on)."""
    items = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(e.decode().split("=", 1) for e in items if b"=" in e)
