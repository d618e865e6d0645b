"""A Llama/Qwen-style decoder forward over a slot KV cache, on the HF model's own modules.

    ids (N, T), positions (N, T), slots [s0, s0 + N) of SlotCache
        -> embed -> per layer: RMSNorm -> q/k/v proj (+ q/k norm) -> rotary
           -> write k, v at each row's positions in its slot -> SDPA over the slot's first
              ``key_len`` positions (causal by position) -> o_proj -> residual -> MLP -> residual
        -> final norm -> hidden of one position per row -> lm_head -> logits (N, V)

The embedding, norms, projections, MLP, rotary and lm_head are the HF model's own modules,
called as they are: their parameters are the ones ``apply_named_tensors`` copies updates into,
so a weight update is seen by the next forward (and by CUDA graphs, which read the same
memory). Only attention and the cache are ours: the cache is preallocated,
``(layers, slots, kv_heads, max_len, head_dim)``, one slot per running request, so rows join
and leave a batch without re-padding or concatenating anything.

Supported: full-attention ``llama``, ``mistral`` (no sliding window), ``qwen2`` and ``qwen3``
decoders; ``check_supported`` says why another model is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from agentrl.errors import ConfigError

SUPPORTED = ("llama", "mistral", "qwen2", "qwen3")


def check_supported(cfg: Any) -> None:
    """ConfigError unless ``cfg`` (an HF model config) is a full-attention decoder this module
    can run."""
    kind = getattr(cfg, "model_type", "")
    if kind not in SUPPORTED:
        raise ConfigError(
            f"the static engine runs {', '.join(SUPPORTED)} decoders, not {kind!r}; "
            "serve this model with --engine dynamic (or vLLM/SGLang)."
        )
    kinds = set(getattr(cfg, "layer_types", None) or ["full_attention"])
    window = getattr(cfg, "sliding_window", None) if kind == "mistral" else None
    if kinds != {"full_attention"} or window:
        raise ConfigError(
            f"the static engine runs full-attention models only; this one has {sorted(kinds)} "
            f"layers (sliding_window={window}). Serve it with --engine dynamic."
        )


@dataclass(eq=False)
class SlotCache:
    """Preallocated keys and values: one slot per running request."""

    keys: torch.Tensor  # (L, S, Hkv, M, D)
    values: torch.Tensor  # (L, S, Hkv, M, D)

    @staticmethod
    def bytes_per_token(model: Any, dtype: torch.dtype) -> int:
        layers, kv, dim = _shape(model)
        return 2 * layers * kv * dim * torch.empty((), dtype=dtype).element_size()

    @staticmethod
    def allocate(
        model: Any, slots: int, max_len: int, dtype: torch.dtype, device: str | torch.device
    ) -> SlotCache:
        layers, kv, dim = _shape(model)
        shape = (layers, slots, kv, max_len, dim)
        return SlotCache(
            keys=torch.zeros(shape, dtype=dtype, device=device),
            values=torch.zeros(shape, dtype=dtype, device=device),
        )

    @property
    def slots(self) -> int:
        return int(self.keys.shape[1])

    @property
    def max_len(self) -> int:
        return int(self.keys.shape[3])

    def move(self, src: list[int], dst: list[int], length: int) -> None:
        """Copy slots ``src`` to ``dst`` (their first ``length`` positions)."""
        s = torch.tensor(src, device=self.keys.device)
        d = torch.tensor(dst, device=self.keys.device)
        for t in (self.keys, self.values):
            t[:, :, :, :length].index_copy_(1, d, t[:, s, :, :length])


def _shape(model: Any) -> tuple[int, int, int]:
    c = model.config
    heads = int(c.num_attention_heads)
    kv = int(getattr(c, "num_key_value_heads", None) or heads)
    dim = int(getattr(c, "head_dim", None) or c.hidden_size // heads)
    return int(c.num_hidden_layers), kv, dim


class Decoder:
    """The forward pass of ``model`` (an HF ``*ForCausalLM``) over a ``SlotCache``."""

    def __init__(self, model: Any) -> None:
        check_supported(model.config)
        self.model = model
        inner = model.model
        self.layers = list(inner.layers)
        self.embed = inner.embed_tokens
        self.norm = inner.norm
        self.rotary = inner.rotary_emb
        self.lm_head = model.lm_head
        _, self.n_kv, self.head_dim = _shape(model)
        self.n_heads = int(model.config.num_attention_heads)
        self.scale = float(self.layers[0].self_attn.scaling)

    def forward(
        self,
        cache: SlotCache,
        ids: torch.Tensor,  # (N, T)
        pos: torch.Tensor,  # (N, T) position of each token in its row
        first_slot: int,
        key_len: int,
        last: torch.Tensor | None = None,  # (N,) which t gives each row's logits; None: T - 1
    ) -> torch.Tensor:
        """Logits (N, V) of one position per row, writing every token's k, v into slots
        ``first_slot .. first_slot + N`` at ``pos``. Attention covers positions < ``key_len``
        (every position a query needs must be below it) up to each query's own position."""
        n, t = ids.shape
        x = self.embed(ids)  # (N, T, H)
        cos, sin = self.rotary(x, pos)  # (N, T, D)
        cos, sin = cos[:, None], sin[:, None]  # (N, 1, T, D)
        keys = torch.arange(key_len, device=ids.device)
        mask = (keys[None, None, :] <= pos[:, :, None])[:, None]  # (N, 1, T, key_len)
        rows = torch.arange(n, device=ids.device)[:, None].expand(n, t)  # (N, T)
        slots = slice(first_slot, first_slot + n)
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            q = attn.q_proj(h).view(n, t, self.n_heads, self.head_dim)
            k = attn.k_proj(h).view(n, t, self.n_kv, self.head_dim)
            v = attn.v_proj(h).view(n, t, self.n_kv, self.head_dim)
            if hasattr(attn, "q_norm"):  # qwen3
                q, k = attn.q_norm(q), attn.k_norm(k)
            q = _rotate(q.transpose(1, 2), cos, sin)  # (N, Hq, T, D)
            k = _rotate(k.transpose(1, 2), cos, sin)  # (N, Hkv, T, D)
            kc, vc = cache.keys[i, slots], cache.values[i, slots]  # (N, Hkv, M, D)
            kc[rows, :, pos] = k.transpose(1, 2)
            vc[rows, :, pos] = v
            o = F.scaled_dot_product_attention(
                q,
                kc[:, :, :key_len],
                vc[:, :, :key_len],
                attn_mask=mask,
                scale=self.scale,
                enable_gqa=self.n_kv != self.n_heads,
            )  # (N, Hq, T, D)
            x = x + attn.o_proj(o.transpose(1, 2).reshape(n, t, self.n_heads * self.head_dim))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        if last is None:
            h_last = x[:, -1]
        else:
            h_last = x[torch.arange(n, device=ids.device), last]  # (N, H)
        out: torch.Tensor = self.lm_head(self.norm(h_last))
        return out


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
