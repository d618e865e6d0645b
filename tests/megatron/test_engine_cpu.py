"""The Megatron engine's forward-only path on CPU against the torch-native engine.

Training needs CUDA (Megatron's schedules and DDP allocate on the GPU); scoring with one
pipeline stage runs anywhere, so logprobs, entropy (padded and packed/THD layouts) and the
HF-named weights are checked here on the tiny Llama and Qwen2 models.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from agentrl.engine import EngineConfig
from agentrl.errors import ConfigError, TrainingError
from trainers.engines import ENGINES

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trainers"))
from test_torch_engine import make_batch


def _pair(path: Path, **kw: object) -> tuple:
    cfg = EngineConfig(model_path=str(path), device="cpu", role="ref", micro_batch_size=2, **kw)
    ours = ENGINES.make("megatron", config=cfg)
    ours.initialize()
    ref = ENGINES.make("torch", config=cfg)
    ref.initialize()
    return ours, ref


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("packed", [False, True])
def test_logprobs_match_torch_engine(
    megatron_group: None, tiny_models: dict[str, Path], arch: str, packed: bool
) -> None:
    ours, ref = _pair(tiny_models[arch], packed=packed)
    batch = make_batch()
    lp, ent = ours.compute_logprobs(batch, temperature=0.7, with_entropy=True)
    lp_ref, ent_ref = ref.compute_logprobs(batch, temperature=0.7, with_entropy=True)
    assert lp.shape == batch.input_ids.shape and (lp[:, 0] == 0).all()
    assert (lp[batch.attention_mask == 0] == 0).all()
    torch.testing.assert_close(lp, lp_ref, rtol=0, atol=1e-5)
    assert ent is not None and ent_ref is not None
    torch.testing.assert_close(ent, ent_ref, rtol=0, atol=1e-5)


def test_named_weights_are_the_hf_weights(
    megatron_group: None, tiny_models: dict[str, Path]
) -> None:
    ours, ref = _pair(tiny_models["qwen2"])
    got = dict(ours.named_weights())
    want = dict(ref.named_weights())
    assert got.keys() == want.keys()
    for name, tensor in want.items():
        assert torch.equal(got[name], tensor), name


def test_export_hf_loads_with_transformers(
    megatron_group: None, tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ours, ref = _pair(tiny_models["llama"])
    ours.export_hf(tmp_path)
    exported = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    AutoTokenizer.from_pretrained(tmp_path)
    for name, tensor in ref.named_weights():
        assert torch.equal(exported.state_dict()[name], tensor), name


def test_checkpoint_round_trip(
    megatron_group: None, tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    """save writes a Megatron distributed checkpoint; load restores the weights exactly."""
    ours, _ = _pair(tiny_models["qwen2"])
    ours.save(tmp_path)
    assert (tmp_path / "engine.pt").is_file() and (tmp_path / "dist" / ".metadata").is_file()
    fresh, _ = _pair(tiny_models["qwen2"])
    with torch.no_grad():
        for p in fresh.model.parameters():
            p.zero_()
    fresh.load(tmp_path)
    batch = make_batch()
    assert torch.equal(fresh.compute_logprobs(batch)[0], ours.compute_logprobs(batch)[0])
    with pytest.raises(TrainingError, match="no engine checkpoint"):
        fresh.load(tmp_path / "missing")


def test_rejects_what_it_cannot_do(megatron_group: None, tiny_models: dict[str, Path]) -> None:
    with pytest.raises(ConfigError, match="critic"):
        ENGINES.make("megatron", config=EngineConfig(model_path="x", role="critic"))
    cpu_actor = ENGINES.make("megatron", config=EngineConfig(model_path="x", device="cpu"))
    with pytest.raises(ConfigError, match="CUDA"):
        cpu_actor.initialize()
    ours, _ = _pair(tiny_models["llama"])
    with pytest.raises(TrainingError, match="optimizer"):
        ours.forward_backward(make_batch(), lambda *a: (torch.zeros(()), {}))


def test_tensor_parallel_matches_one_rank(
    megatron_group: None, tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    """Two gloo ranks with TP=2: sharded weights, vocab-parallel logprobs, gathered HF weights."""
    import socket

    import torch.multiprocessing as mp
    import tp_worker

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    path = str(tiny_models["qwen2"])
    mp.start_processes(
        tp_worker.run, args=(port, path, str(tmp_path)), nprocs=2, start_method="spawn"
    )
    ours, ref = _pair(tiny_models["qwen2"])
    batch = make_batch()
    want_lp, want_ent = ref.compute_logprobs(batch, with_entropy=True)
    want_w = dict(ref.named_weights())
    results = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    vp_logp, vp_grad = _full_vocab_grad()  # what both ranks' slices must add up to
    qkv = "decoder.layers.0.self_attention.linear_qkv.weight"
    assert results[0]["local"][qkv].shape[0] * 2 == ours.model.state_dict()[qkv].shape[0]
    assert not torch.equal(results[0]["local"][qkv], results[1]["local"][qkv])
    for res in results:
        torch.testing.assert_close(res["logprobs"], want_lp, rtol=0, atol=1e-5)
        torch.testing.assert_close(res["entropy"], want_ent, rtol=0, atol=1e-5)
        assert res["weights"].keys() == want_w.keys()
        torch.testing.assert_close(res["vp_logp"], vp_logp, rtol=0, atol=1e-6)
        torch.testing.assert_close(res["vp_grad"], vp_grad, rtol=0, atol=1e-5)
        for name, tensor in want_w.items():
            assert torch.equal(res["weights"][name], tensor), name


def _full_vocab_grad() -> tuple[torch.Tensor, torch.Tensor]:
    """tp_worker._vocab_parallel_grad on one rank holding the whole vocabulary."""
    from trainers.engines.megatron.logprobs import vocab_parallel_logprobs

    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(6, 8, generator=gen).requires_grad_(True)
    weight = torch.randn(16, 8, generator=gen)
    targets = torch.tensor([0, 3, 7, 8, 12, 5])
    logp, ent = vocab_parallel_logprobs(
        hidden, weight, targets, true_vocab=13, tp_rank=0, tp_size=1, with_entropy=True
    )
    assert ent is not None
    (logp.sum() + ent.sum()).backward()
    assert hidden.grad is not None
    return logp.detach(), hidden.grad.detach()
