"""Loss aggregation modes and masked statistics against hand-computed values."""

from __future__ import annotations

import statistics

import pytest
import torch

from agentrl.algos.aggregation import Aggregation, agg_loss, masked_var, masked_whiten
from agentrl.errors import ConfigError

L = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0], [9.0, 9.0, 9.0, 9.0]])
M = torch.tensor([[1, 1, 0, 1], [0, 1, 0, 0], [0, 0, 0, 0]])  # row 2 has no loss tokens


@pytest.mark.parametrize(
    ("mode", "max_len", "expected"),
    [
        ("token-mean", None, (1 + 2 + 4 + 6) / 4),
        ("seq-mean-token-sum", None, (7 + 6) / 2),  # the empty row does not count
        ("seq-mean-token-mean", None, (7 / 3 + 6 / 1) / 2),
        ("seq-mean-token-sum-norm", None, (7 / 4 + 6 / 4) / 2),  # max_len defaults to T = 4
        ("seq-mean-token-sum-norm", 10, (7 / 10 + 6 / 10) / 2),
    ],
)
def test_agg_modes(mode: str, max_len: int | None, expected: float) -> None:
    got = agg_loss(L, M, mode, max_len=max_len)
    assert got.item() == pytest.approx(expected)
    assert Aggregation(mode=mode, max_len=max_len)(L, M).item() == pytest.approx(expected)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_global_normaliser_makes_micro_batches_sum_to_the_batch_loss(mode: str) -> None:
    full = agg_loss(L, M, mode)
    if mode == "token-mean":
        norm = float(M.sum())
    else:
        norm = float((M.sum(-1) > 0).sum())
    parts = [agg_loss(L[i : i + 1], M[i : i + 1], mode, normaliser=norm) for i in range(3)]
    assert sum(p.item() for p in parts) == pytest.approx(full.item())
    # without the global normaliser the micro-batch losses do not add up
    local = [agg_loss(L[i : i + 1], M[i : i + 1], mode) for i in range(3)]
    assert sum(p.item() for p in local) != pytest.approx(full.item())


def test_unknown_mode_suggests() -> None:
    with pytest.raises(ConfigError, match="Did you mean 'token-mean'"):
        agg_loss(L, M, "token_mean")
    with pytest.raises(ConfigError):
        Aggregation(mode="seq-mean")


def test_agg_loss_gradient_only_on_mask() -> None:
    x = L.clone().requires_grad_()
    agg_loss(x, M, "seq-mean-token-mean").backward()
    assert x.grad is not None
    expected = torch.tensor([[1 / 6, 1 / 6, 0, 1 / 6], [0, 1 / 2, 0, 0], [0, 0, 0, 0]])
    torch.testing.assert_close(x.grad, expected)


def test_masked_whiten_matches_statistics_module() -> None:
    x = torch.tensor([[1.0, 5.0, 2.0], [7.0, -1.0, 3.0]], dtype=torch.float64)
    m = torch.tensor([[1, 0, 1], [1, 1, 0]])
    vals = [1.0, 2.0, 7.0, -1.0]
    mu, sd = statistics.mean(vals), statistics.stdev(vals)
    assert masked_var(x, m).item() == pytest.approx(sd**2)
    w = masked_whiten(x, m, eps=0.0)
    expected = [[(1 - mu) / sd, 0.0, (2 - mu) / sd], [(7 - mu) / sd, (-1 - mu) / sd, 0.0]]
    torch.testing.assert_close(w, torch.tensor(expected, dtype=torch.float64))


def test_masked_whiten_grad_and_no_grad_paths_agree() -> None:
    x = torch.randn(3, 7, dtype=torch.float64)
    m = torch.rand(3, 7) > 0.4
    for shift_mean in (True, False):
        fast = masked_whiten(x, m, shift_mean=shift_mean)
        slow = masked_whiten(x.clone().requires_grad_(), m, shift_mean=shift_mean)
        torch.testing.assert_close(fast, slow.detach())
    vals = x[m]
    scale_only = masked_whiten(x, m, shift_mean=False)
    torch.testing.assert_close(scale_only[m].mean(), vals.mean())
