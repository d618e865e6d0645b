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

import contextlib
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.fx.experimental import _config as fx_config
from torch.nn.attention import SDPBackend, sdpa_kernel

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
        cache = SlotCache(
            keys=torch.zeros(shape, dtype=dtype, device=device),
            values=torch.zeros(shape, dtype=dtype, device=device),
        )
        # its sizes never change: a compiled function that writes it (``_rotate_store``)
        # takes them as constants, not as symbols to guard on
        torch._dynamo.mark_static(cache.keys)
        torch._dynamo.mark_static(cache.values)
        return cache

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

    def __init__(self, model: Any, compile_pointwise: bool = False) -> None:
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
        silu = getattr(model.config, "hidden_act", "") == "silu"
        self._act = _silu_mul if silu else _act_mul(self.layers[0].mlp.act_fn)
        self._rotate_store = _rotate_store
        self._add_norm = _add_rms_norm
        if compile_pointwise:  # one generated kernel for each run of elementwise ops
            self._act = _compiled(self._act)
            self._rotate_store = _compiled(_rotate_store)
            self._add_norm = _compiled(_add_rms_norm)
        # each layer's index into the cache as a (1, 1) tensor: an int would index a view of
        # the cache, which a compiled _rotate_store would copy whole instead of writing to
        device = self.embed.weight.device
        self._layer_ids = [torch.full((1, 1), i, device=device) for i in range(len(self.layers))]
        self.fuse()

    def fuse(self) -> None:
        """Put each layer's q, k, v weights (and gate, up) in one buffer that the HF modules'
        parameters become views of: one matmul instead of three (two), and an update copied
        into a parameter lands in the buffer. Call again if parameters are replaced."""
        self.qkv: list[tuple[torch.Tensor, torch.Tensor | None]] = []
        self.gate_up: list[tuple[torch.Tensor, torch.Tensor | None]] = []
        for layer in self.layers:
            a, m = layer.self_attn, layer.mlp
            self.qkv.append(_fuse([a.q_proj, a.k_proj, a.v_proj]))
            self.gate_up.append(_fuse([m.gate_proj, m.up_proj]))

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
        half = self.head_dim // 2
        sin = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)  # rotate_half's signs
        cos, sin = cos[:, None], sin[:, None]  # (N, 1, T, D)
        keys = torch.arange(key_len, device=ids.device)
        allowed = keys[None, None, :] <= pos[:, :, None]  # (N, T, key_len)
        # an additive mask, built once: SDPA would turn a boolean one into this in every layer
        mask = torch.zeros(allowed.shape, dtype=x.dtype, device=ids.device)
        mask = mask.masked_fill_(~allowed, float("-inf"))[:, None]  # (N, 1, T, key_len)
        group = self.n_heads // self.n_kv
        if group > 1:  # the queries of a kv head attend as one: (N, 1, G T, key_len)
            mask = mask.repeat(1, 1, group, 1)
        rows = torch.arange(first_slot, first_slot + n, device=ids.device)[:, None].expand(n, t)
        slots = slice(first_slot, first_slot + n)
        delta: torch.Tensor | None = None  # a layer's MLP output, added with the next one's norm
        with _attention_backends(ids.device, t):
            for i, layer in enumerate(self.layers):
                x, delta = self._layer(
                    i, layer, x, delta, cache, slots, rows, pos, cos, sin, mask, key_len
                )
        assert delta is not None  # the model has layers
        if last is None:
            x_last, d_last = x[:, -1], delta[:, -1]
        else:
            at = torch.arange(n, device=ids.device)
            x_last, d_last = x[at, last], delta[at, last]  # (N, H)
        _, h_last = self._add_norm(x_last, d_last, self.norm.weight, self.norm.variance_epsilon)
        out: torch.Tensor = self.lm_head(h_last)
        return out

    def _layer(
        self,
        i: int,
        layer: Any,
        x: torch.Tensor,  # (N, T, H) the residual stream before the last MLP's output
        delta: torch.Tensor | None,  # (N, T, H) that output (None before the first layer)
        cache: SlotCache,
        slots: slice,
        rows: torch.Tensor,  # (N, T) each token's slot
        pos: torch.Tensor,  # (N, T)
        cos: torch.Tensor,  # (N, 1, T, D)
        sin: torch.Tensor,  # (N, 1, T, D), first half negated
        mask: torch.Tensor,  # (N, 1, G T, key_len) additive
        key_len: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The residual stream after attention, and the MLP's output to add to it (the next
        layer adds it in the same kernel as its norm, when compiled)."""
        n, t = rows.shape
        attn = layer.self_attn
        norm = layer.input_layernorm
        if delta is None:
            h = _rms_norm(norm, x)
        else:
            x, h = self._add_norm(x, delta, norm.weight, norm.variance_epsilon)
        qkv = F.linear(h, *self.qkv[i])  # (N, T, (Hq + 2 Hkv) D)
        if hasattr(attn, "q_norm"):  # qwen3
            heads = qkv.view(n, t, -1, self.head_dim)
            q, k, v = heads.split((self.n_heads, self.n_kv, self.n_kv), dim=2)
            normed = (_rms_norm(attn.q_norm, q), _rms_norm(attn.k_norm, k), v)
            qkv = torch.cat(normed, dim=2).flatten(2)
        q = self._rotate_store(
            qkv, cos, sin, cache.keys, cache.values, self._layer_ids[i], rows, pos, self.n_heads
        )  # (N, Hq, T, D); this layer's k, v are in the cache
        kc, vc = cache.keys[i, slots], cache.values[i, slots]  # (N, Hkv, M, D)
        # grouped-query attention as plain attention: each kv head's G query heads are
        # G T queries of one head, so the kv cache is read once per kv head, not G times
        o = F.scaled_dot_product_attention(
            q.reshape(n, self.n_kv, -1, self.head_dim),
            kc[:, :, :key_len],
            vc[:, :, :key_len],
            attn_mask=mask,
            scale=self.scale,
        )  # (N, Hkv, G T, D)
        o = o.reshape(n, self.n_heads, t, self.head_dim)
        o = attn.o_proj(o.transpose(1, 2).reshape(n, t, self.n_heads * self.head_dim))
        norm = layer.post_attention_layernorm
        x, h = self._add_norm(x, o, norm.weight, norm.variance_epsilon)
        return x, layer.mlp.down_proj(self._act(F.linear(h, *self.gate_up[i])))


def _compiled(fn: Any) -> Any:
    """``fn`` compiled with symbolic sizes, every size its own symbol. By default two sizes
    that are equal when a function is first compiled share one symbol (the batch's rows and
    the cache's slots, both 64), and a later call where they differ compiles it again: in
    the middle of serving, for seconds."""
    compiled = torch.compile(fn, dynamic=True, fullgraph=True)

    def call(*args: Any) -> Any:
        with fx_config.patch(use_duck_shape=False):  # type: ignore[attr-defined]
            return compiled(*args)

    return call


def _attention_backends(device: torch.device, t: int) -> contextlib.AbstractContextManager[Any]:
    """Prefill on CUDA (``t`` > 1 tokens per row, new shapes at every call) uses the
    memory-efficient SDPA kernel. The cuDNN one that SDPA picks on an H200 sets up each new
    shape: the server's prefills took ~285 ms each, against 24 ms in-process where every
    prefill's shapes had been seen (``benchmarks/generation_profile.py`` times both kernels
    on fresh shapes). Decode steps keep SDPA's choice: a few bucketed shapes, captured once."""
    if device.type != "cuda" or t == 1:
        return contextlib.nullcontext()
    return sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


def _fuse(linears: list[torch.nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One weight (and bias) buffer for ``linears``, their parameters made views of it."""
    weight = torch.cat([lin.weight.data for lin in linears])
    biases = [lin.bias for lin in linears]
    bias = torch.cat([b.data for b in biases]) if all(b is not None for b in biases) else None
    start = 0
    for lin in linears:
        rows = lin.weight.shape[0]
        lin.weight.data = weight[start : start + rows]
        if bias is not None:
            lin.bias.data = bias[start : start + rows]
        start += rows
    if bias is None and any(b is not None for b in biases):
        raise ConfigError("a layer has biases on some of q/k/v (or gate/up) but not all.")
    return weight, bias


def _rms_norm(norm: Any, x: torch.Tensor) -> torch.Tensor:
    """The HF RMSNorm module ``norm`` as one ``F.rms_norm`` call: a fused kernel on CUDA
    (accumulating in float32), where the module's eight elementwise ops are eight launches."""
    return F.rms_norm(x, (x.shape[-1],), norm.weight, norm.variance_epsilon)


def _add_rms_norm(
    x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual ``x + delta`` and its RMSNorm (``_rms_norm``'s kernel after the add)."""
    x = x + delta
    return x, F.rms_norm(x, (x.shape[-1],), weight, eps)


def _silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` of the fused gate/up product (Llama's MLP activation)."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def _act_mul(act: Any) -> Any:
    """``act(gate) * up`` with the model's own activation module (non-SiLU models)."""

    def act_mul(gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return act(gate) * up

    return act_mul


def _rotate_store(
    qkv: torch.Tensor,  # (N, T, (Hq + 2 Hkv) D) contiguous: q, k, v before the rotary embedding
    cos: torch.Tensor,  # (N, 1, T, D)
    sin: torch.Tensor,  # (N, 1, T, D), first half negated
    keys: torch.Tensor,  # (L, S, Hkv, M, D) the whole cache
    values: torch.Tensor,  # (L, S, Hkv, M, D)
    layer: torch.Tensor,  # (1, 1) the layer's index
    rows: torch.Tensor,  # (N, T) each token's slot
    pos: torch.Tensor,  # (N, T) each token's position
    n_heads: int,
) -> torch.Tensor:
    """Rotate q and k, write k and v into the cache at each token's slot and position, and
    return q (N, Hq, T, D). Compiled (``compile_pointwise``) this is one kernel that writes
    into the cache in place, where eager it takes five (the rotation's three, two stores).
    It takes ``qkv`` whole (a slice's strides would be guarded on) and the cache marked
    static (``SlotCache.allocate``), so new batch shapes do not compile it again."""
    n, t = rows.shape
    d = keys.shape[-1]
    heads = qkv.view(n, t, -1, d)
    n_kv = keys.shape[2]
    qk, v = heads.split((heads.shape[2] - n_kv, n_kv), dim=2)
    qk = _rotate(qk.transpose(1, 2), cos, sin)  # q and k at once: (N, Hq + Hkv, T, D)
    q, k = qk[:, :n_heads], qk[:, n_heads:]
    keys[layer, rows, :, pos] = k.transpose(1, 2)
    values[layer, rows, :, pos] = v
    return q


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding: ``x * cos + rotate_half(x) * sin`` in three kernels, with ``sin``'s
    first half negated by the caller (``rotate_half(x) = cat(-x2, x1)``, so
    ``rotate_half(x) * sin = cat(x2, x1) * cat(-sin1, sin2)``)."""
    swapped = x.unflatten(-1, (2, x.shape[-1] // 2)).flip(-2).flatten(-2)
    return torch.addcmul(x * cos, swapped, sin)
