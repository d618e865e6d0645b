"""available_cpus(): the affinity mask and the cgroup quota, not the host's CPU count."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agentrl import cpus
from agentrl.cpus import _cgroup_quota, available_cpus


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs Linux affinity")
def test_a_process_pinned_to_one_core_sees_one() -> None:
    before = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {min(before)})
        assert available_cpus() == 1
    finally:
        os.sched_setaffinity(0, before)
    assert available_cpus() == min(len(before), _cgroup_quota() or len(before))


@pytest.mark.parametrize(
    ("text", "expected"),
    [("max 100000\n", None), ("200000 100000\n", 2), ("150000 100000\n", 2), ("50000 100000", 1)],
)
def test_cgroup_quota_rounds_up_to_whole_cpus(
    tmp_path: Path, text: str, expected: int | None
) -> None:
    path = tmp_path / "cpu.max"
    path.write_text(text)
    assert _cgroup_quota(path) == expected


def test_missing_or_garbled_quota_means_no_limit(tmp_path: Path) -> None:
    assert _cgroup_quota(tmp_path / "absent") is None
    (tmp_path / "bad").write_text("lots\n")
    assert _cgroup_quota(tmp_path / "bad") is None


def test_a_quota_caps_the_affinity_mask(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    quota = tmp_path / "cpu.max"
    quota.write_text("100000 100000\n")
    monkeypatch.setattr(cpus, "_CPU_MAX", quota)
    assert available_cpus() == 1
