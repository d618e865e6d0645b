"""Weights between Hugging Face (Llama / Qwen2 / Qwen3 dense) and Megatron-core GPTModel layout.

    HF state dict --hf_to_megatron--> full Megatron dict (global layer ids, padded vocab)
        --shard(name, tensor, tp_rank, tp_size)--> this rank's tensor-parallel slice
    this rank's slices --unshard(name, [slice per tp rank])--> full Megatron tensor
        --megatron_to_hf--> HF state dict (vocab padding dropped)

Layouts that differ (per decoder layer ``i``):

- ``self_attention.linear_qkv``: HF ``q_proj``, ``k_proj``, ``v_proj`` (and their biases for
  Qwen2) interleaved per query group: for each of the ``num_kv_heads`` groups, that group's
  ``num_heads / num_kv_heads`` query heads, then its key head, then its value head. A
  tensor-parallel slice is a contiguous run of whole groups.
- ``mlp.linear_fc1``: ``[gate_proj; up_proj]`` stacked; a tensor-parallel slice is
  ``[gate slice; up slice]``, so shard and unshard split the halves first.
- ``embedding.word_embeddings`` / ``output_layer``: vocabulary padded with zero rows to a
  multiple of ``vocab_multiple * tp_size``; with tied embeddings (``tie_word_embeddings``) the
  HF ``lm_head.weight`` is not stored and Megatron has no ``output_layer.weight`` (except on the
  last pipeline stage, which keeps a synchronised copy).

Column-parallel weights (qkv, fc1, embedding, output layer) split on dim 0, row-parallel
weights (``linear_proj``, ``linear_fc2``) on dim 1; norms are replicated.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import torch

from agentrl.errors import ConfigError
from trainers.engines.megatron.model import ModelShape

HF_LAYER = "model.layers.{i}."
MG_LAYER = "decoder.layers.{i}."
EMBED, OUTPUT, FINAL_NORM = (
    "embedding.word_embeddings.weight",
    "output_layer.weight",
    "decoder.final_layernorm.weight",
)
# Megatron name inside a layer -> HF name inside a layer, for tensors copied as they are.
_RENAMES = {
    "input_layernorm.weight": "input_layernorm.weight",
    "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
    "self_attention.linear_proj.weight": "self_attn.o_proj.weight",
    "mlp.linear_fc2.weight": "mlp.down_proj.weight",
    "self_attention.q_layernorm.weight": "self_attn.q_norm.weight",
    "self_attention.k_layernorm.weight": "self_attn.k_norm.weight",
}
_COLUMN = ("linear_qkv.weight", "linear_qkv.bias", "linear_fc1.weight", EMBED, OUTPUT)
_ROW = ("linear_proj.weight", "linear_fc2.weight")


def layer_names(shape: ModelShape) -> list[str]:
    """Megatron parameter names inside one decoder layer (no prefix)."""
    names = [
        "input_layernorm.weight",
        "self_attention.linear_qkv.weight",
        "self_attention.linear_proj.weight",
        "pre_mlp_layernorm.weight",
        "mlp.linear_fc1.weight",
        "mlp.linear_fc2.weight",
    ]
    if shape.qkv_bias:
        names.insert(2, "self_attention.linear_qkv.bias")
    if shape.qk_norm:
        names += ["self_attention.q_layernorm.weight", "self_attention.k_layernorm.weight"]
    return names


def _pad_vocab(w: torch.Tensor, rows: int) -> torch.Tensor:
    if w.shape[0] > rows:
        raise ConfigError(f"vocabulary of {w.shape[0]} rows exceeds the padded size {rows}")
    return torch.cat([w, w.new_zeros(rows - w.shape[0], *w.shape[1:])]) if rows > w.shape[0] else w


def _fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, shape: ModelShape) -> torch.Tensor:
    g, d = shape.num_kv_heads, shape.head_dim
    rest = q.shape[1:]  # (H,) for weights, () for biases
    parts = [
        q.reshape(g, shape.heads_per_group * d, *rest),
        k.reshape(g, d, *rest),
        v.reshape(g, d, *rest),
    ]
    return torch.cat(parts, dim=1).reshape(-1, *rest)


def _split_qkv(qkv: torch.Tensor, shape: ModelShape) -> tuple[torch.Tensor, ...]:
    g, d = shape.num_kv_heads, shape.head_dim
    rest = qkv.shape[1:]
    grouped = qkv.reshape(g, (shape.heads_per_group + 2) * d, *rest)
    q, k, v = torch.split(grouped, [shape.heads_per_group * d, d, d], dim=1)
    return tuple(x.reshape(-1, *rest) for x in (q, k, v))


def hf_to_megatron(
    hf: Mapping[str, torch.Tensor], shape: ModelShape, *, padded_vocab: int
) -> dict[str, torch.Tensor]:
    """Full (unsharded) Megatron tensors with global layer ids from an HF state dict."""
    try:
        out = {EMBED: _pad_vocab(hf["model.embed_tokens.weight"], padded_vocab)}
        out[FINAL_NORM] = hf["model.norm.weight"]
        if not shape.tie_embeddings:
            out[OUTPUT] = _pad_vocab(hf["lm_head.weight"], padded_vocab)
        for i in range(shape.num_layers):
            h, m = HF_LAYER.format(i=i), MG_LAYER.format(i=i)
            for mg_name, hf_name in _RENAMES.items():
                if h + hf_name in hf:
                    out[m + mg_name] = hf[h + hf_name]
            attn = h + "self_attn."
            qkv = [hf[f"{attn}{p}_proj.weight"] for p in "qkv"]
            out[m + "self_attention.linear_qkv.weight"] = _fuse_qkv(qkv[0], qkv[1], qkv[2], shape)
            if shape.qkv_bias:
                biases = [hf[f"{attn}{p}_proj.bias"] for p in "qkv"]
                out[m + "self_attention.linear_qkv.bias"] = _fuse_qkv(
                    biases[0], biases[1], biases[2], shape
                )
            gate, up = hf[h + "mlp.gate_proj.weight"], hf[h + "mlp.up_proj.weight"]
            out[m + "mlp.linear_fc1.weight"] = torch.cat([gate, up])
    except KeyError as e:
        raise ConfigError(
            f"HF checkpoint lacks {e.args[0]!r}, which a {shape.arch} model needs; "
            "is the directory a complete dense Llama/Qwen2/Qwen3 checkpoint?"
        ) from None
    return out


def megatron_layer_to_hf(
    i: int, name: str, full: torch.Tensor, shape: ModelShape
) -> Iterator[tuple[str, torch.Tensor]]:
    """HF (name, tensor) pairs for Megatron layer ``i``'s full tensor ``name`` (no prefix)."""
    h = HF_LAYER.format(i=i)
    if name in _RENAMES:
        yield h + _RENAMES[name], full
    elif name.startswith("self_attention.linear_qkv."):
        kind = name.rsplit(".", 1)[1]
        for p, x in zip("qkv", _split_qkv(full, shape), strict=True):
            yield f"{h}self_attn.{p}_proj.{kind}", x
    elif name == "mlp.linear_fc1.weight":
        gate, up = full.chunk(2)
        yield h + "mlp.gate_proj.weight", gate
        yield h + "mlp.up_proj.weight", up
    else:
        raise ConfigError(f"no HF name for Megatron layer tensor {name!r}")


def megatron_to_hf(mg: Mapping[str, torch.Tensor], shape: ModelShape) -> dict[str, torch.Tensor]:
    """HF state dict (vocab padding dropped, tied lm_head omitted) from full Megatron tensors."""
    out = {"model.embed_tokens.weight": mg[EMBED][: shape.vocab_size]}
    for i in range(shape.num_layers):
        for name in layer_names(shape):
            out.update(megatron_layer_to_hf(i, name, mg[MG_LAYER.format(i=i) + name], shape))
    out["model.norm.weight"] = mg[FINAL_NORM]
    if not shape.tie_embeddings:
        out["lm_head.weight"] = mg[OUTPUT][: shape.vocab_size]
    return out


def _split_kind(name: str) -> str:
    if name.endswith(_COLUMN):
        return "column"
    if name.endswith(_ROW):
        return "row"
    return "replicated"


def shard(name: str, full: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    """Tensor-parallel rank ``rank``'s slice of the full Megatron tensor ``name``."""
    kind = _split_kind(name)
    if size == 1 or kind == "replicated":
        return full
    if name.endswith("linear_fc1.weight"):
        gate, up = full.chunk(2)
        return torch.cat([gate.chunk(size)[rank], up.chunk(size)[rank]])
    return full.chunk(size, dim=0 if kind == "column" else 1)[rank].contiguous()


def unshard(name: str, parts: list[torch.Tensor]) -> torch.Tensor:
    """The full Megatron tensor ``name`` from its tensor-parallel slices, in rank order."""
    kind = _split_kind(name)
    if len(parts) == 1 or kind == "replicated":
        return parts[0]
    if name.endswith("linear_fc1.weight"):
        halves = [p.chunk(2) for p in parts]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves])
    return torch.cat(parts, dim=0 if kind == "column" else 1)


def stage_layers(num_layers: int, pp_rank: int, pp_size: int) -> range:
    """Global ids of the decoder layers on pipeline stage ``pp_rank`` (even split)."""
    per = num_layers // pp_size
    return range(pp_rank * per, (pp_rank + 1) * per)


def local_state(
    full: Mapping[str, torch.Tensor],
    shape: ModelShape,
    *,
    tp_rank: int,
    tp_size: int,
    pp_rank: int,
    pp_size: int,
) -> dict[str, torch.Tensor]:
    """The slice of ``full`` that one (tp, pp) rank's GPTModel holds, with stage-local layer ids."""
    out: dict[str, torch.Tensor] = {}
    first, last = pp_rank == 0, pp_rank == pp_size - 1
    layers = stage_layers(shape.num_layers, pp_rank, pp_size)
    for local, i in enumerate(layers):
        src, dst = MG_LAYER.format(i=i), MG_LAYER.format(i=local)
        for name in layer_names(shape):
            out[dst + name] = shard(src + name, full[src + name], tp_rank, tp_size)
    if first:
        out[EMBED] = shard(EMBED, full[EMBED], tp_rank, tp_size)
    if last:
        out[FINAL_NORM] = full[FINAL_NORM]
        head = full[EMBED] if shape.tie_embeddings else full[OUTPUT]
        if not (shape.tie_embeddings and first):
            out[OUTPUT] = shard(OUTPUT, head, tp_rank, tp_size)
    return out
