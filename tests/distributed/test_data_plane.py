"""The driver's data plane: a batch put once for several calls, scoring calls that return only
their new fields, and the bytes the driver puts out and gathers in (``driver/bytes_*``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from distributed_workers import EchoWorker, RowScoreWorker
from tensordict import TensorDict

from agentrl.batch import BatchFields, RowInfo, TrainBatch
from agentrl.distributed import ResourcePool, ShardCache, WorkerGroup
from agentrl.distributed.traffic import TRAFFIC, DataTraffic, payload_nbytes
from agentrl.errors import ConfigError
from agentrl.types import RolloutStatus


def make_batch(lengths: list[int], t: int = 16) -> TrainBatch:
    b = len(lengths)
    seq_lens = torch.tensor(lengths)
    mask = (torch.arange(t) < seq_lens[:, None]).long()
    ids = (torch.arange(b * t).reshape(b, t) % 97 + 1) * mask
    td = TensorDict(
        {
            "input_ids": ids,
            "attention_mask": mask,
            "loss_mask": mask.float(),
            "rollout_logprobs": -mask.float(),
            "seq_lens": seq_lens,
            "group_ids": torch.zeros(b, dtype=torch.long),
        },
        batch_size=[b],
    )
    rows = [RowInfo(f"u{i}", f"t{i}", RolloutStatus.COMPLETED, 0, 1, "g") for i in range(b)]
    return TrainBatch(td, rows, pad_token_id=0)


@pytest.fixture(scope="module")
def scorer(ray_local: None) -> Iterator[WorkerGroup[RowScoreWorker]]:
    pool = ResourcePool(ResourcePool.Config(bundles_per_node=2, cpus_per_bundle=0.5))
    wg = WorkerGroup(pool, RowScoreWorker)
    yield wg
    wg.shutdown()


def test_shards_are_put_once_and_scoring_returns_only_the_new_field(
    scorer: WorkerGroup[RowScoreWorker],
) -> None:
    batch = make_batch([16, 3, 9, 12, 5, 16])
    batch_bytes = payload_nbytes(batch)
    TRAFFIC.take()
    shards = ShardCache(batch)
    a = scorer.call_sharded(RowScoreWorker.token_scores, shards.on(scorer), 2.0)
    b = scorer.call_sharded(RowScoreWorker.token_scores, shards.on(scorer))
    sent, got = TRAFFIC.take().values()
    # each shard trimmed to its longest row, so the shards weigh at most the batch; put once
    assert 0 < sent <= batch_bytes
    # two calls, each gathering one float (B, T) field: far less than the batch
    assert got == 2 * batch.input_ids.numel() * 4
    assert got / 2 < batch_bytes
    torch.testing.assert_close(a["scores"], batch.input_ids.float() * 2)
    batch.add_fields(b, {"scores": "old_scores"})
    torch.testing.assert_close(batch["old_scores"], batch.input_ids.float())

    # the old pattern: every call ships the batch and gathers the whole batch back
    TRAFFIC.take()
    back = scorer.call(RowScoreWorker.echo, batch)
    sent_old, got_old = TRAFFIC.take().values()
    assert sent_old >= batch_bytes and got_old >= batch_bytes
    assert len(back) == len(batch)
    assert TRAFFIC.by_method() == {}


def test_call_sharded_refuses_plain_values_and_other_modes(
    scorer: WorkerGroup[RowScoreWorker], ray_local: None
) -> None:
    batch = make_batch([4, 4])
    with pytest.raises(ConfigError, match="takes a Sharded value"):
        scorer.call_sharded(RowScoreWorker.token_scores, batch)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="ONE_TO_ALL; only DP_SPLIT"):
        scorer.call_sharded(EchoWorker.add, scorer.shard([1, 2]))  # type: ignore[arg-type]


def test_batch_fields_concat_pads_each_part_to_the_longest() -> None:
    batch = make_batch([16, 3, 9, 2])
    parts = batch.split(2)
    assert [p.seq_len for p in parts] == [16, 9]
    fields = BatchFields.concat(
        [BatchFields({"x": p.input_ids.float(), "r": p.seq_lens}) for p in parts]
    )
    assert fields["x"].shape == (4, 16) and fields["r"].tolist() == [16, 3, 9, 2]
    torch.testing.assert_close(fields["x"], batch.input_ids.float())
    per_row = BatchFields.concat([BatchFields({"v": torch.ones(len(p), 1)}) for p in parts])
    assert per_row["v"].shape == (4, 1)
    with pytest.raises(ValueError, match="one B"):
        BatchFields({"a": torch.zeros(2, 3), "b": torch.zeros(3)})


def test_payload_bytes_count_each_storage_once() -> None:
    x = torch.zeros(10, 8)
    assert payload_nbytes(x) == 320
    assert payload_nbytes({"a": x, "b": x[:2], "c": [x]}) == 320  # views pickle the storage
    assert payload_nbytes([torch.zeros(3, dtype=torch.int64), b"abcd", "xy", 7, None]) == 30
    traffic = DataTraffic()
    traffic.sent("m", x)
    traffic.received("m", [None, x[:1]])
    assert traffic.by_method() == {"m": (320, 320)}
    assert traffic.take() == {"driver/bytes_out": 320.0, "driver/bytes_in": 320.0}
    assert traffic.totals() == {"driver/bytes_out": 0.0, "driver/bytes_in": 0.0}
