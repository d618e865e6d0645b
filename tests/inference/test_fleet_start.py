"""``Fleet.start_beside``: CPU servers load while the training workers are built; GPU servers
are up before the workers load (they size their KV cache from free memory). The order of the
calls is what is checked; the real CPU path runs in every ``agentrl train`` test."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainers.config import InferenceConfig
from trainers.serving import Fleet


@pytest.mark.parametrize(
    ("device", "placement", "expected"),
    [
        ("cpu", [], ["spawn", "build", "connect"]),
        ("cpu", ["cpu", "cpu"], ["spawn", "build", "connect"]),
        ("cuda:0", [], ["start", "build"]),
        ("cpu", ["cpu", "cuda:1"], ["start", "build"]),  # one GPU server is enough to wait
    ],
)
def test_servers_overlap_the_build_only_on_cpu(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    device: str,
    placement: list[str],
    expected: list[str],
) -> None:
    fleet = Fleet(
        InferenceConfig(placement=placement),
        run_seed=0,
        dtype="float32",
        device="cpu",
        log_dir=tmp_path,
    )
    fleet.device = device  # as resolve_device would give on a GPU machine
    calls: list[str] = []
    for name in ("spawn", "connect", "start"):
        monkeypatch.setattr(fleet, name, lambda *_a, _n=name: calls.append(_n))
    fleet.start_beside("model", lambda: calls.append("build"))
    assert calls == expected
    fleet.loop.close()
