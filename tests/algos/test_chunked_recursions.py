"""The row-chunked recursions (GAE, discounted returns, masked scores) equal one whole-batch pass."""

from __future__ import annotations

import pytest
import torch

import agentrl.algos.ops as ops
from agentrl.algos import ADV_ESTIMATORS, AdvantageConfig, AdvantageInputs, gae
from agentrl.algos.ops import masked_discounted_returns, row_chunks


def _data(holes: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    b, t = 13, 150  # T not a multiple of the scan block
    lengths = torch.randint(0, t + 1, (b,), generator=g)
    mask = torch.arange(t)[None, :] < lengths[:, None]
    if holes:
        mask &= torch.rand(b, t, generator=g) > 0.2
    return torch.randn(b, t, generator=g), torch.randn(b, t, generator=g), mask


def test_row_chunks_cover_every_row_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ops, "CHUNK_ELEMENTS", 1000)
    chunks = row_chunks(13, 150)
    assert [(s.start, s.stop) for s in chunks] == [(i, min(i + 6, 13)) for i in range(0, 13, 6)]
    assert row_chunks(3, 5000) == [slice(0, 1), slice(1, 2), slice(2, 3)]  # a row per chunk
    assert row_chunks(0, 10) == []


@pytest.mark.parametrize("holes", [False, True])
def test_chunked_results_equal_a_single_chunk(holes: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    r, v, mask = _data(holes)
    inp = AdvantageInputs(
        response_mask=mask, token_rewards=r, values=v, group_ids=torch.arange(13) % 4
    )
    cfg = AdvantageConfig(gamma=0.9, lam=0.8)

    def run() -> list[torch.Tensor]:
        a, ret = gae(r, v, mask, gamma=0.9, lam=0.8)
        return [
            a,
            ret,
            masked_discounted_returns(r, mask, 0.9),
            inp.scores(),
            ADV_ESTIMATORS.get("gae")(inp, cfg)[0],
        ]

    whole = run()
    monkeypatch.setattr(ops, "CHUNK_ELEMENTS", 400)  # chunks of 2 rows, and a last one of 1
    chunked = run()
    for x, y in zip(whole, chunked, strict=True):
        torch.testing.assert_close(x, y)
    assert (whole[0][~mask] == 0).all() and (whole[1][~mask] == 0).all()
