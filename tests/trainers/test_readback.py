"""HostCopy: a snapshot of a tensor as it was when copied, read later without a full sync."""

from __future__ import annotations

import pytest
import torch

from trainers.engines.readback import HostCopy


def _copy_then_overwrite(device: str) -> tuple[torch.Tensor, torch.Tensor]:
    t = torch.arange(4.0, device=device)
    copy = HostCopy(t)
    t.mul_(10)  # queued after the copy: the copy must not see it
    return copy.get(), t


def test_cpu_copy_is_a_snapshot() -> None:
    got, live = _copy_then_overwrite("cpu")
    assert got.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert live.tolist() == [0.0, 10.0, 20.0, 30.0]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_copy_is_a_pinned_snapshot_read_after_later_work() -> None:
    torch.cuda._sleep(50_000_000)  # keep the stream busy: the copy is queued, not done
    got, live = _copy_then_overwrite("cuda")
    assert got.device.type == "cpu" and got.is_pinned()
    assert got.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert live.tolist() == [0.0, 10.0, 20.0, 30.0]
