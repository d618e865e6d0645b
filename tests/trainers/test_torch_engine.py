"""The torch-native engine on a tiny model: logprobs, packing, training, resume, export, FSDP2."""

from __future__ import annotations

import random
import socket
from pathlib import Path
from typing import Any

import pytest
import torch

from agentrl.batch import TrainBatch
from agentrl.engine import EngineConfig, MicroBatch
from agentrl.errors import ConfigError, TrainingError
from agentrl.tiny import make_tiny_model
from agentrl.types import Sample, Segment, Trajectory, TrajectoryGroup
from tests import docblocks
from trainers.engines import ENGINES
from trainers.engines.torch_native import TorchEngine, lr_factor

PAD = 0


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(make_tiny_model(tmp_path_factory.mktemp("tiny") / "model"))


def make_batch(seed: int = 0, n_groups: int = 3, group_size: int = 2) -> TrainBatch:
    rng = random.Random(seed)
    groups = []
    for g in range(n_groups):
        prompt = [rng.randrange(10, 800) for _ in range(rng.randint(2, 6))]
        trajs = []
        for _ in range(group_size):
            s = Segment()
            s.extend_prompt(prompt)
            gen = [rng.randrange(10, 800) for _ in range(rng.randint(1, 8))]
            s.extend_generated(gen, [-1.0] * len(gen), 0)
            if rng.random() < 0.5:  # a tool turn, then more generation
                s.extend_prompt([rng.randrange(10, 800) for _ in range(3)])
                s.extend_generated([5, 6], [-1.0, -1.0], 0)
            trajs.append(Trajectory(sample=Sample(env_id="x"), segments=[s], reward=rng.random()))
        groups.append(TrajectoryGroup(uid=f"g{g}", trajectories=trajs))
    return TrainBatch.from_groups(groups, pad_token_id=PAD)


def nll_loss(
    logprobs: torch.Tensor | None,
    entropy: torch.Tensor | None,
    values: torch.Tensor | None,
    mb: MicroBatch,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Token-mean NLL over the whole (global) batch: exact under any micro-batch/rank split."""
    assert logprobs is not None
    loss = -(logprobs * mb.batch.loss_mask).sum() / mb.global_num_loss_tokens
    return loss, {"train/nll_mb": float(loss.detach())}


def engine(model_path: str, **kw: Any) -> TorchEngine:
    e = TorchEngine(EngineConfig(model_path=model_path, device="cpu", **kw))
    e.initialize()
    return e


def grads(e: TorchEngine) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in e.scorer.model.named_parameters() if p.grad is not None}


def weights(e: TorchEngine) -> dict[str, torch.Tensor]:
    return {n: t.clone() for n, t in e.named_weights()}


def test_logprobs_match_a_direct_hf_forward(model_path: str) -> None:
    from transformers import AutoModelForCausalLM

    batch = make_batch()
    e = engine(model_path, micro_batch_size=2)
    lp, ent = e.compute_logprobs(batch, temperature=0.7, with_entropy=True)
    assert ent is not None and lp.shape == ent.shape == (len(batch), batch.seq_len)
    hf = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = hf(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits / 0.7
    ref_all = torch.log_softmax(logits.float(), -1)  # (B, T, V): position t-1 predicts token t
    ref = ref_all[:, :-1].gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
    ref_ent = -(ref_all.exp() * ref_all).sum(-1)[:, :-1]
    valid = batch.attention_mask[:, 1:].bool()
    torch.testing.assert_close(lp[:, 1:][valid], ref[valid], atol=1e-5, rtol=0)
    torch.testing.assert_close(ent[:, 1:][valid], ref_ent[valid], atol=1e-5, rtol=0)
    assert (lp[:, 0] == 0).all() and (lp[~batch.attention_mask.bool()] == 0).all()


def test_packed_equals_padded(model_path: str) -> None:
    batch = make_batch(seed=1)
    padded = engine(model_path, micro_batch_size=3)
    packed = engine(model_path, micro_batch_size=3, packed=True)
    lp_a, ent_a = padded.compute_logprobs(batch, with_entropy=True)
    lp_b, ent_b = packed.compute_logprobs(batch, with_entropy=True)
    torch.testing.assert_close(lp_a, lp_b, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent_a, ent_b, atol=1e-5, rtol=0)
    padded.forward_backward(batch, nll_loss)
    packed.forward_backward(batch, nll_loss)
    ga, gb = grads(padded), grads(packed)
    for name in ga:
        torch.testing.assert_close(ga[name], gb[name], atol=1e-5, rtol=1e-4)


def test_training_lowers_the_loss(model_path: str) -> None:
    batch = make_batch(seed=2)
    e = ENGINES.make(
        "torch",
        config=EngineConfig(model_path=model_path, device="cpu", lr=3e-3, micro_batch_size=4),
    )
    e.initialize()
    losses = []
    for _ in range(5):
        m = e.forward_backward(batch, nll_loss)
        losses.append(m["train/loss"])
        step = e.optimizer_step()
        assert step["train/grad_norm"] > 0 and step["train/lr"] == pytest.approx(3e-3)
        e.offload()  # a no-op on CPU that must leave the engine usable
        e.onload()
    assert losses[-1] < losses[0] - 0.1, losses
    assert e.step == 5


def test_two_micro_batches_equal_one_big_batch(model_path: str) -> None:
    batch = make_batch(seed=3)
    one, two = engine(model_path), engine(model_path)
    m1 = one.forward_backward(batch, nll_loss, num_micro_batches=1)
    m2 = two.forward_backward(batch, nll_loss, num_micro_batches=2)
    assert m1["train/loss"] == pytest.approx(m2["train/loss"], abs=1e-6)
    g1, g2 = grads(one), grads(two)
    assert g1.keys() == g2.keys() and g1
    for name in g1:
        torch.testing.assert_close(g1[name], g2[name], atol=1e-6, rtol=1e-5)
    s1, s2 = one.optimizer_step(), two.optimizer_step()
    assert s1["train/grad_norm"] == pytest.approx(s2["train/grad_norm"], rel=1e-5)


def test_save_load_resumes_exactly(model_path: str, tmp_path: Path) -> None:
    batches = [make_batch(seed=s) for s in (4, 5, 6)]
    cfg = dict(lr=1e-3, warmup_steps=2, lr_schedule="cosine", total_steps=5, max_grad_norm=0.5)
    a = engine(model_path, **cfg)
    a.forward_backward(batches[0], nll_loss)
    a.optimizer_step()
    a.save(tmp_path / "ckpt")
    results = []
    for e in (a, engine(model_path, **cfg)):
        if e is not a:
            e.load(tmp_path / "ckpt")
            assert e.step == 1
        metrics = []
        for b in batches[1:]:
            metrics.append(e.forward_backward(b, nll_loss) | e.optimizer_step())
        results.append((metrics, weights(e)))
    (m_a, w_a), (m_b, w_b) = results
    assert m_a == m_b  # loss, grad norm and LR identical
    for name in w_a:
        assert torch.equal(w_a[name], w_b[name]), name


def test_export_hf_round_trip(model_path: str, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    batch = make_batch(seed=7)
    e = engine(model_path, lr=1e-3)
    e.forward_backward(batch, nll_loss)
    e.optimizer_step()
    e.export_hf(tmp_path / "hf")
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32)
    assert AutoTokenizer.from_pretrained(tmp_path / "hf").pad_token_id == PAD
    w = weights(e)
    for name, tensor in hf.state_dict().items():
        tied = name == "lm_head.weight" and name not in w
        assert torch.equal(tensor, w["model.embed_tokens.weight" if tied else name]), name
    assert set(w) == {n for n, _ in hf.named_parameters()}  # HF names; tied weights once


def test_critic_values_and_training(model_path: str) -> None:
    batch = make_batch(seed=8)
    critic = engine(model_path, role="critic", lr=1e-2)
    values = critic.compute_values(batch)
    assert values.shape == (len(batch), batch.seq_len)
    assert (values[:, 0] == 0).all() and (values[~batch.attention_mask.bool()] == 0).all()
    target = batch.rewards[:, None].expand_as(values)

    def mse(
        logprobs: torch.Tensor | None,
        entropy: torch.Tensor | None,
        values: torch.Tensor | None,
        mb: MicroBatch,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        assert logprobs is None and values is not None
        err = (values - mb.batch.rewards[:, None]) ** 2 * mb.batch.loss_mask
        return err.sum() / mb.global_num_loss_tokens, {}

    before = float(((values - target) ** 2 * batch.loss_mask).sum())
    for _ in range(3):
        critic.forward_backward(batch, mse)
        critic.optimizer_step()
    after_values = critic.compute_values(batch)
    assert float(((after_values - target) ** 2 * batch.loss_mask).sum()) < before
    with pytest.raises(TrainingError, match="compute_values"):
        critic.compute_logprobs(batch)


def test_lr_schedule_and_config_errors() -> None:
    cfg = EngineConfig(
        model_path="x", lr_schedule="cosine", warmup_steps=2, total_steps=6, min_lr_ratio=0.1
    )
    factors = [lr_factor(s, cfg) for s in range(8)]
    assert factors[:3] == [0.5, 1.0, 1.0]  # linear warmup, then the cosine starts at 1
    assert factors[2] > factors[3] > factors[4] > factors[5]
    assert factors[6] == factors[7] == pytest.approx(0.1)  # floor after total_steps
    linear = EngineConfig(model_path="x", lr_schedule="linear", total_steps=4)
    assert [lr_factor(s, linear) for s in range(5)] == [1.0, 0.75, 0.5, 0.25, 0.0]
    with pytest.raises(ConfigError, match="total_steps"):
        TorchEngine(EngineConfig(model_path="x", lr_schedule="cosine"))
    with pytest.raises(ConfigError, match="role"):
        TorchEngine(EngineConfig(model_path="x", role="teacher"))
    with pytest.raises(ConfigError, match="not a loadable"):
        TorchEngine(EngineConfig(model_path="/nonexistent", device="cpu")).initialize()


def test_the_projection_chunk_is_chosen_by_device_unless_set(model_path: str) -> None:
    from trainers.engines.torch_model import CPU_CHUNK_TOKENS, projection_chunk

    assert projection_chunk(0, 1030, "cpu") == CPU_CHUNK_TOKENS
    assert projection_chunk(0, 1000, "cuda") == 65536  # a tiny vocabulary: the cap
    assert projection_chunk(0, 32768, "cuda") == 2048  # 256 MiB of fp32 logits
    assert projection_chunk(0, 152064, "cuda") == 1024  # a large vocabulary: the floor
    assert projection_chunk(300, 152064, "cuda") == projection_chunk(300, 10, "cpu") == 300
    assert engine(model_path).scorer.chunk_tokens == CPU_CHUNK_TOKENS
    assert engine(model_path, logprob_chunk_tokens=64).scorer.chunk_tokens == 64
    assert engine(model_path, role="critic").scorer.chunk_tokens == CPU_CHUNK_TOKENS
    with pytest.raises(ConfigError, match="logprob_chunk_tokens must be >= 0"):
        TorchEngine(EngineConfig(model_path="x", logprob_chunk_tokens=-1))


def test_ref_engine_does_not_train(model_path: str) -> None:
    ref = engine(model_path, role="ref")
    with pytest.raises(TrainingError, match="no optimizer"):
        ref.forward_backward(make_batch(), nll_loss)


# ---- two FSDP2 ranks on CPU (gloo) == one rank ------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _shards(batch: TrainBatch) -> list[TrainBatch]:
    """Uneven on purpose: rank 0 runs 1 micro-batch, rank 1 three, so rank 0 pads with fillers."""
    return [batch.select([0]), batch.select(list(range(1, len(batch))))]


def _fsdp_rank(rank: int, world: int, port: int, model_path: str, out: str) -> None:
    import torch.distributed as dist

    from agentrl.distributed.rendezvous import init_process_group_bound

    torch.set_num_threads(1)
    init_process_group_bound(
        backend="gloo", master_addr="127.0.0.1", master_port=port, rank=rank, world_size=world
    )
    try:
        shard = _shards(make_batch(seed=9))[rank]
        e = engine(model_path, lr=1e-3, micro_batch_size=2)
        lp, _ = e.compute_logprobs(shard)
        metrics = e.forward_backward(shard, nll_loss)
        full_grads = {
            n: p.grad.full_tensor()  # type: ignore[union-attr]  # DTensor gradients under FSDP2
            for n, p in e.scorer.model.named_parameters()
        }
        metrics |= e.optimizer_step()
        w = weights(e)
        e.save(Path(out) / "ckpt")
        fresh = engine(model_path, lr=1e-3)
        fresh.load(Path(out) / "ckpt")
        w_loaded = weights(fresh)
        lps = [torch.zeros(0)] * world
        dist.all_gather_object(lps, lp)
        if rank == 0:
            torch.save(
                {
                    "metrics": metrics,
                    "grads": full_grads,
                    "weights": w,
                    "loaded": w_loaded,
                    "logprobs": lps,
                },
                Path(out) / "rank0.pt",
            )
    finally:
        dist.destroy_process_group()


def test_two_fsdp_ranks_match_one_rank(model_path: str, tmp_path: Path) -> None:
    import torch.multiprocessing as mp

    mp.spawn(_fsdp_rank, args=(2, _free_port(), model_path, str(tmp_path)), nprocs=2, join=True)
    got = torch.load(tmp_path / "rank0.pt", weights_only=False)
    batch = make_batch(seed=9)
    single = engine(model_path, lr=1e-3, micro_batch_size=2)
    lp, _ = single.compute_logprobs(batch)
    rows = 0
    for h in got["logprobs"]:  # each rank's logprobs line up with its shard
        torch.testing.assert_close(h, lp[rows : rows + len(h), : h.shape[1]], atol=1e-5, rtol=0)
        rows += len(h)
    metrics = single.forward_backward(batch, nll_loss)
    g = grads(single)
    metrics |= single.optimizer_step()
    assert got["metrics"]["train/loss"] == pytest.approx(metrics["train/loss"], abs=1e-5)
    assert got["metrics"]["train/grad_norm"] == pytest.approx(metrics["train/grad_norm"], rel=1e-4)
    for name, grad in g.items():
        torch.testing.assert_close(got["grads"][name], grad, atol=1e-5, rtol=1e-4)
    w = weights(single)
    assert got["weights"].keys() == w.keys()
    for name in w:
        # Adam divides by sqrt(v): float noise in tiny gradients moves an update by ~1e-6
        torch.testing.assert_close(got["weights"][name], w[name], atol=1e-5, rtol=1e-5)
        assert torch.equal(got["loaded"][name], got["weights"][name]), name


def test_engines_guide_examples_run() -> None:
    blocks = docblocks.runnable("docs/guides/engines.md", "python")
    assert len(blocks) >= 4
    namespace: dict[str, object] = {"__name__": "engines_guide"}
    docblocks.exec_blocks(blocks, namespace)
