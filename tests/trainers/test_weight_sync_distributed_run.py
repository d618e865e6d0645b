"""``inference.weight_sync: distributed`` in a real run (issue 27's NCCL path, over gloo on CPU).

The driver joins a process group with both embedded servers (SGLang's
``/init_weights_update_group``) and broadcasts every tensor after each step; the driver's
per-step verification compares the servers' checksums with the trainer's. A restarted server
cannot join the running group: it gets the weights over HTTP and the next sync forms a new
group with every server (``tests/trainers/test_async_server_fault.py`` covers restarts on the
default path). About a minute on 2 cores.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrl.errors import ConfigError
from agentrl.inference.weight_sync import SGLangWeightSync
from agentrl.logging import read_jsonl
from tests.trainers.test_driver import ray_local, smoke_config  # noqa: F401
from trainers.config import load_run_config
from trainers.driver import Trainer


@pytest.mark.usefixtures("ray_local")
def test_a_run_broadcasts_its_weights_to_every_server(tmp_path: Path) -> None:
    cfg = smoke_config(
        tmp_path,
        "inference.weight_sync=distributed",
        "inference.num_servers=2",
        "eval.num_samples=0",
        "checkpoint.every=0",
    )
    trainer = Trainer(cfg)
    try:
        trainer.setup()
        assert trainer.fleet is not None and trainer.fleet.client is not None
        sync = trainer.fleet.weight_sync
        assert isinstance(sync, SGLangWeightSync) and sync.cfg.mode == "distributed"
        assert sync.cfg.backend == "gloo"  # CPU; nccl when the policy is on CUDA
        for _ in range(2):
            trainer.step()  # each step ends with a verified sync (checksums == trainer's)
        client = trainer.fleet.client
        versions = trainer.fleet.run(client.weight_versions())
        assert sorted(versions.values()) == [2, 2]
        assert sync._group is not None  # one group, kept from step to step
        sums = trainer.fleet.run(client.weights_checksum())
        assert len({s.overall for s in sums.values()}) == 1  # both servers hold the same weights
    finally:
        trainer.close()
    rows = read_jsonl(cfg.run_dir / "metrics.jsonl")
    assert [r["train/weight_version"] for r in rows] == [1.0, 2.0]


def test_distributed_sync_is_refused_where_the_backend_cannot_take_it() -> None:
    with pytest.raises(ConfigError, match=r"does not work with inference\.backend=vllm"):
        load_run_config(
            None,
            [
                "data.envs=[{id: arith/Calculator-v0}]",
                "inference.backend=vllm",
                "inference.weight_sync=distributed",
            ],
        )
