"""Updates without gradient signal skip AdamW; (B, 1) advantages train like (B, T) ones.

Runs the real ActorWorker (locally, rank 0 of 1) on the torch-native engine and a tiny model.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from agentrl.algos import ADV_ESTIMATORS, AdvantageConfig, AdvantageInputs, token_level
from agentrl.batch import TrainBatch
from agentrl.engine import EngineConfig
from agentrl.tiny import make_tiny_model
from agentrl.types import Sample, Segment, Trajectory, TrajectoryGroup
from trainers.engines.torch_native import lr_factor
from trainers.workers import ActorWorker, PolicyUpdate

PAD = 0


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(make_tiny_model(tmp_path_factory.mktemp("tiny") / "model"))


def _batch(seed: int = 0) -> TrainBatch:
    rng = random.Random(seed)
    groups = []
    for g in range(2):
        prompt = [rng.randrange(10, 800) for _ in range(4)]
        trajs = []
        for _ in range(3):
            s = Segment()
            s.extend_prompt(prompt)
            gen = [rng.randrange(10, 800) for _ in range(rng.randint(2, 7))]
            s.extend_generated(gen, [-1.0] * len(gen), 0)
            trajs.append(Trajectory(sample=Sample(env_id="x"), segments=[s], reward=rng.random()))
        groups.append(TrajectoryGroup(uid=f"g{g}", trajectories=trajs))
    return TrainBatch.from_groups(groups, pad_token_id=PAD)


def _worker(model_path: str, **kw: float | int | str) -> ActorWorker:
    cfg = EngineConfig(
        model_path=model_path,
        device="cpu",
        lr=1e-2,
        weight_decay=0.1,
        lr_schedule="linear",
        total_steps=8,
        **kw,  # type: ignore[arg-type]
    )
    return ActorWorker(cfg)


def _scored(worker: ActorWorker, seed: int = 0) -> TrainBatch:
    batch = _batch(seed)
    batch["old_logprobs"] = worker.compute_logprobs(batch)["logprobs"]
    inp = AdvantageInputs(
        response_mask=batch.loss_mask, token_rewards=batch.token_rewards, group_ids=batch.group_ids
    )
    batch["advantages"], _ = ADV_ESTIMATORS.get("grpo")(inp, AdvantageConfig())  # (B, 1)
    return batch


def _zero_advantages(batch: TrainBatch) -> TrainBatch:
    batch["advantages"] = torch.zeros(len(batch), 1)  # e.g. every group had equal rewards
    return batch


def _weights(worker: ActorWorker) -> dict[str, torch.Tensor]:
    return {n: t.clone() for n, t in worker.engine.named_weights()}


def _adam_steps(worker: ActorWorker) -> list[float]:
    opt = worker.engine.optimizer  # type: ignore[attr-defined]
    return [float(s["step"]) for s in opt.state.values()]


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_all_zero_advantages_skip_the_adam_step(model_path: str) -> None:
    worker = _worker(model_path)
    spec = PolicyUpdate()
    (first,) = worker.update_policy(_scored(worker), spec)  # builds Adam momentum
    assert first["train/skipped_step"] == 0.0
    before, adam_before = _weights(worker), _adam_steps(worker)
    (m,) = worker.update_policy(_zero_advantages(_scored(worker, seed=1)), spec)
    assert m["train/skipped_step"] == 1.0 and m["train/skipped_zero_grad"] == 1.0
    assert m["train/skipped_nonfinite_grad"] == 0.0 and m["train/grad_norm"] == 0.0
    assert _same(_weights(worker), before)  # no momentum step, no weight decay
    assert _adam_steps(worker) == adam_before  # Adam's bias correction did not advance
    assert worker.engine.step == 2  # type: ignore[attr-defined]  # the LR schedule did
    # What the skip prevents: AdamW with zero gradients still moves the weights.
    opt = worker.engine.optimizer  # type: ignore[attr-defined]
    for group in opt.param_groups:
        for p in group["params"]:
            p.grad = torch.zeros_like(p)
    opt.step()
    assert not _same(_weights(worker), before)


def test_zero_advantages_with_an_entropy_bonus_still_step(model_path: str) -> None:
    worker = _worker(model_path)
    before = _weights(worker)
    batch = _zero_advantages(_scored(worker))
    (m,) = worker.update_policy(batch, PolicyUpdate(entropy_coef=0.01))
    assert m["train/skipped_step"] == 0.0 and m["train/grad_norm"] > 0
    assert not _same(_weights(worker), before)


def test_resume_across_a_skipped_step_matches_an_uninterrupted_run(
    model_path: str, tmp_path: Path
) -> None:
    spec = PolicyUpdate()

    def tail(worker: ActorWorker) -> list[dict[str, float]]:
        zero = worker.update_policy(_zero_advantages(_scored(worker, seed=1)), spec)
        return zero + worker.update_policy(_scored(worker, seed=2), spec)

    run = _worker(model_path)
    run.update_policy(_scored(run), spec)
    run.save(str(tmp_path / "ckpt"))
    metrics = tail(run)
    resumed = _worker(model_path)
    resumed.load(str(tmp_path / "ckpt"))
    assert tail(resumed) == metrics
    assert _same(_weights(resumed), _weights(run))
    cfg = run.engine.config  # type: ignore[attr-defined]
    # the skipped step used LR step 1, the next update LR step 2
    assert metrics[1]["train/lr"] == pytest.approx(cfg.lr * lr_factor(2, cfg))


def test_row_advantages_train_exactly_like_token_level_ones(model_path: str) -> None:
    row, dense = _worker(model_path), _worker(model_path)
    batch = _scored(row)
    assert batch["advantages"].shape == (len(batch), 1)
    batch_dense = batch.select(list(range(len(batch))))
    batch_dense["advantages"] = token_level(batch["advantages"], batch.loss_mask)
    spec = PolicyUpdate(num_mini_batches=2, entropy_coef=0.001)
    (m_row,) = row.update_policy(batch, spec)
    (m_dense,) = dense.update_policy(batch_dense, spec)
    assert m_row["train/pg_loss"] == pytest.approx(m_dense["train/pg_loss"], rel=1e-5)
    w_row, w_dense = _weights(row), _weights(dense)
    for k in w_row:
        torch.testing.assert_close(w_row[k], w_dense[k], rtol=1e-5, atol=1e-6)


def test_a_skipped_first_step_does_not_warn_about_the_scheduler(model_path: str) -> None:
    import warnings

    worker = _worker(model_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        (m,) = worker.update_policy(_zero_advantages(_scored(worker)), PolicyUpdate())
    assert m["train/skipped_step"] == 1.0
    assert [w for w in caught if "lr_scheduler.step" in str(w.message)] == []
