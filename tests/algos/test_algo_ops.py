"""Vectorised building blocks against plain loops."""

from __future__ import annotations

import pytest
import torch

import agentrl.algos.ops as ops
from agentrl.algos.ops import (
    BLOCK,
    TokenLayout,
    compact_index,
    discounted_reverse_cumsum,
    empty_output,
    final_reward_returns,
    group_mean_std,
    is_prefix_mask,
    masked_discounted_returns,
    scatter_to_last_token,
)
from agentrl.errors import ConfigError


def _loop_scan(x: torch.Tensor, d: float) -> torch.Tensor:
    out = torch.zeros_like(x)
    run = torch.zeros(x.shape[0], dtype=x.dtype)
    for t in reversed(range(x.shape[1])):
        run = x[:, t] + d * run
        out[:, t] = run
    return out


@pytest.mark.parametrize("d", [0.0, 0.3, 0.95, 0.999, 1.0])
@pytest.mark.parametrize(("t", "block"), [(5, 64), (64, 64), (100, 4), (300, 64), (257, 16)])
def test_discounted_reverse_cumsum_matches_loop(d: float, t: int, block: int) -> None:
    x = torch.randn(3, t, dtype=torch.float64)
    got = discounted_reverse_cumsum(x, d, block=block)
    torch.testing.assert_close(got, _loop_scan(x, d))


def test_discounted_reverse_cumsum_hand_values() -> None:
    x = torch.tensor([[1.0, 2.0, 4.0]])
    # y2 = 4, y1 = 2 + 0.5*4 = 4, y0 = 1 + 0.5*4 = 3
    torch.testing.assert_close(discounted_reverse_cumsum(x, 0.5), torch.tensor([[3.0, 4.0, 4.0]]))


def test_discount_out_of_range_is_config_error() -> None:
    with pytest.raises(ConfigError, match=r"\[0, 1\]"):
        discounted_reverse_cumsum(torch.zeros(1, 3), 1.5)


def test_token_layout_packs_generated_tokens_first_and_back() -> None:
    mask = torch.tensor([[1, 0, 1, 1, 0], [0, 0, 0, 0, 0], [0, 1, 1, 0, 1]])
    x = torch.arange(1, 16, dtype=torch.float32).view(3, 5)
    assert compact_index(mask).tolist() == [[0, 5, 1, 2, 5], [5] * 5, [5, 0, 1, 5, 2]]
    layout = TokenLayout.of(mask)
    packed = layout.pack(x)
    assert packed.shape == (3, BLOCK)
    assert packed[:, :6].tolist() == [[1, 3, 4, 0, 0, 0], [0] * 6, [12, 13, 15, 0, 0, 0]]
    assert packed[:, 6:].abs().sum() == 0
    assert torch.equal(layout.unpack(packed), x * mask)


@pytest.mark.parametrize("t", [5, 64])
def test_token_layout_prefix_masks_need_no_index(t: int) -> None:
    mask = (torch.arange(t)[None, :] < torch.tensor([[2], [0], [t]])).long()
    x = torch.randn(3, t)
    layout = TokenLayout.of(mask)
    assert layout.index is None
    assert torch.equal(layout.unpack(layout.pack(x)), x * mask)


def test_is_prefix_mask() -> None:
    assert is_prefix_mask(torch.tensor([[1, 1, 0], [0, 0, 0], [1, 1, 1]]))
    assert not is_prefix_mask(torch.tensor([[1, 0, 1]]))
    assert not is_prefix_mask(torch.tensor([[0, 1, 1]]))


def test_masked_discounted_returns_skips_holes() -> None:
    mask = torch.tensor([[1, 0, 1, 1, 0]])
    r = torch.tensor([[1.0, 100.0, 0.0, 2.0, 50.0]])  # rewards on mask-0 tokens are dropped
    # generated tokens: r = 1, 0, 2 -> G = 1 + 0.5*(0 + 0.5*2) = 1.5, 1, 2
    got = masked_discounted_returns(r, mask, 0.5)
    torch.testing.assert_close(got, torch.tensor([[1.5, 0.0, 1.0, 2.0, 0.0]]))


def _loop_masked_returns(r: torch.Tensor, m: torch.Tensor, gamma: float) -> torch.Tensor:
    """verl's loop: holes carry the running return unchanged; rewards on them are dropped."""
    out = torch.zeros_like(r)
    run = torch.zeros(r.shape[0], dtype=r.dtype)
    for t in reversed(range(r.shape[1])):
        new = r[:, t] * m[:, t] + gamma * run
        out[:, t] = new * m[:, t]
        run = new * m[:, t] + run * (1 - m[:, t])
    return out


@pytest.mark.parametrize("gamma", [0.05, 0.3, 0.9, 0.99, 0.999])
@pytest.mark.parametrize("t", [7, 16, 33, 150, 300])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_masked_discounted_returns_match_the_loop(gamma: float, t: int, dtype: torch.dtype) -> None:
    """Both ways of skipping holes (counting them, or packing the generated tokens first when
    gamma^T would leave float64) against the loop; rewards on holes are dropped."""
    g = torch.Generator().manual_seed(t)
    r = torch.randn(6, t, generator=g, dtype=torch.float64)
    m = (torch.rand(6, t, generator=g) > 0.3).double()
    m[0] = 0.0  # a row with no generated token
    m[1] = 1.0  # and one without holes
    got = masked_discounted_returns(r.to(dtype), m.to(dtype), gamma)
    tol = 1e-5 if dtype == torch.float32 else 1e-7
    torch.testing.assert_close(got.double(), _loop_masked_returns(r, m, gamma), rtol=tol, atol=tol)


def test_count_scan_covers_the_usual_discounts_and_falls_back_past_float64() -> None:
    assert ops.count_scan_fits(8192, 0.99, torch.float32)
    assert ops.count_scan_fits(8192, 0.999, torch.float64)
    assert not ops.count_scan_fits(8192, 0.9, torch.float32)  # 0.9^8192 underflows float64
    assert not ops.count_scan_fits(16, 0.05, torch.float32)  # 0.05^-16 in float32: too close
    assert not ops.count_scan_fits(64, 0.99, torch.bfloat16)  # packed path for half types
    assert not ops.count_scan_fits(64, 1.0, torch.float32)  # gamma 1 needs no skipping at all


def test_empty_output_asks_for_huge_pages_inside_the_tensor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[tuple[int, int, int]] = []
    page = 1 << 16  # a small "huge page", so the test allocates little

    def madvise(addr: int, n: int, advice: int) -> int:
        calls.append((addr, n, advice))
        return 0

    monkeypatch.setattr(ops, "_huge_page_advice", lambda: (madvise, page))
    like = torch.zeros(2, 3, dtype=torch.float64)
    out = empty_output((100, 1000), like=like)
    assert out.shape == (100, 1000) and out.dtype == torch.float64 and out.is_contiguous()
    ((addr, n, advice),) = calls
    start, end = out.data_ptr(), out.data_ptr() + out.nbytes
    assert advice == ops.MADV_HUGEPAGE and addr % page == 0 and n % page == 0
    assert start <= addr and addr + n <= end and n >= out.nbytes - 2 * page
    assert empty_output((10,), like=like, dtype=torch.float32).dtype == torch.float32
    assert len(calls) == 1  # too small to hold an aligned huge page: plain torch.empty
    monkeypatch.setattr(ops, "_huge_page_advice", lambda: None)
    assert empty_output((100, 1000), like=like).shape == (100, 1000)


def test_group_mean_std_noncontiguous_ids_and_singletons() -> None:
    scores = torch.tensor([1.0, 0.0, 1.0, 2.0, 6.0, 5.0])
    ids = torch.tensor([7, -3, -3, 7, 7, 100])
    mean, std, n = group_mean_std(scores, ids)
    torch.testing.assert_close(mean, torch.tensor([3.0, 0.5, 0.5, 3.0, 3.0, 5.0]))
    s7, s3 = 7.0**0.5, 0.5**0.5  # var7 = (4 + 1 + 9) / 2; var-3 = (0.25 + 0.25) / 1
    torch.testing.assert_close(std, torch.tensor([s7, s3, s3, s7, s7, 0.0]))
    assert n.tolist() == [3, 2, 2, 3, 3, 1]


def test_scatter_to_last_token() -> None:
    mask = torch.tensor([[1, 1, 0], [1, 0, 1], [0, 0, 0]])
    out = scatter_to_last_token(torch.tensor([2.0, 3.0, 4.0]), mask)
    assert out.tolist() == [[0, 2, 0], [0, 0, 3], [0, 0, 0]]


@pytest.mark.parametrize("gamma", [0.0, 0.5, 0.99, 1.0])
def test_final_reward_returns_closed_form_matches_scan(gamma: float) -> None:
    mask = torch.tensor([[1, 0, 1, 1, 0], [0, 0, 0, 0, 0], [1, 1, 1, 1, 1], [0, 1, 0, 0, 0]])
    scores = torch.tensor([2.0, 5.0, -1.0, 3.0], dtype=torch.float64)
    expected = masked_discounted_returns(scatter_to_last_token(scores, mask), mask, gamma)
    torch.testing.assert_close(final_reward_returns(scores, mask, gamma), expected)
    if gamma == 0.5:  # row 0: tokens at 0, 2, 3 -> 0.25 * 2, 0.5 * 2, 2
        assert final_reward_returns(scores, mask, gamma)[0].tolist() == [0.5, 0, 1.0, 2.0, 0]
