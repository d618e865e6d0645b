"""HF <-> Megatron weight conversion on tiny Llama and Qwen2 models (CPU).

Round trip HF -> Megatron -> HF is bit-exact; tensor-parallel shard/unshard is lossless; the
Megatron model loaded with converted weights gives HF's logits (fp32).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trainers.engines.megatron import convert
from trainers.engines.megatron.model import (
    Parallelism,
    build_model,
    model_shape,
    transformer_config,
)


def _hf(path: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_round_trip_is_bit_exact(tiny_models: dict[str, Path], arch: str) -> None:
    hf = _hf(tiny_models[arch])
    shape = model_shape(hf.config)
    assert shape.qkv_bias == (arch == "qwen2")
    sd = {k: v for k, v in hf.state_dict().items() if k != "lm_head.weight"}
    mg = convert.hf_to_megatron(sd, shape, padded_vocab=shape.padded_vocab(128))
    assert mg[convert.EMBED].shape[0] % 128 == 0
    back = convert.megatron_to_hf(mg, shape)
    assert back.keys() == sd.keys()
    for name, tensor in sd.items():
        assert torch.equal(back[name], tensor), name


def test_qkv_layout_is_grouped(tiny_models: dict[str, Path]) -> None:
    """Rows of linear_qkv: per kv group, its query heads, then its key head, then its value head."""
    hf = _hf(tiny_models["qwen2"])
    shape = model_shape(hf.config)
    mg = convert.hf_to_megatron(hf.state_dict(), shape, padded_vocab=shape.padded_vocab(128))
    qkv = mg["decoder.layers.0.self_attention.linear_qkv.weight"]
    d, hpg = shape.head_dim, shape.heads_per_group
    attn = hf.model.layers[0].self_attn
    group1 = qkv[(hpg + 2) * d : 2 * (hpg + 2) * d]
    assert torch.equal(group1[: hpg * d], attn.q_proj.weight[hpg * d : 2 * hpg * d])
    assert torch.equal(group1[hpg * d : (hpg + 1) * d], attn.k_proj.weight[d : 2 * d])
    assert torch.equal(group1[(hpg + 1) * d :], attn.v_proj.weight[d : 2 * d])


@pytest.mark.parametrize("tp", [2])
def test_tensor_parallel_shards_reassemble(tiny_models: dict[str, Path], tp: int) -> None:
    hf = _hf(tiny_models["llama"])
    shape = model_shape(hf.config)
    if shape.num_kv_heads % tp:
        pytest.skip("tp must divide the kv heads")
    mg = convert.hf_to_megatron(hf.state_dict(), shape, padded_vocab=shape.padded_vocab(128 * tp))
    for name, full in mg.items():
        parts = [convert.shard(name, full, r, tp) for r in range(tp)]
        assert torch.equal(convert.unshard(name, parts), full), name
    fc1 = mg["decoder.layers.0.mlp.linear_fc1.weight"]
    gate, up = fc1.chunk(2)
    rank1 = convert.shard("decoder.layers.0.mlp.linear_fc1.weight", fc1, 1, tp)
    assert torch.equal(rank1, torch.cat([gate.chunk(tp)[1], up.chunk(tp)[1]]))


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_megatron_forward_matches_hf_logits(
    megatron_group: None, tiny_models: dict[str, Path], arch: str
) -> None:
    hf = _hf(tiny_models[arch])
    shape = model_shape(hf.config)
    cfg = transformer_config(
        shape, dtype=torch.float32, parallel=Parallelism(), recompute=False, cpu_init=True
    )
    model = build_model(shape, cfg, vocab_multiple=128).eval()
    full = convert.hf_to_megatron(hf.state_dict(), shape, padded_vocab=shape.padded_vocab(128))
    state = convert.local_state(full, shape, tp_rank=0, tp_size=1, pp_rank=0, pp_size=1)
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all(k.endswith("_extra_state") for k in missing)
    ids = torch.randint(10, shape.vocab_size, (2, 12))
    pos = torch.arange(12).expand(2, 12)
    with torch.no_grad():
        ours = model(ids, pos, None)[..., : shape.vocab_size]
        ref = hf(input_ids=ids).logits
    torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4)
