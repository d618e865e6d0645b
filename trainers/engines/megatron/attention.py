"""Core attention for Megatron's local layer spec, on ``torch.nn.functional.scaled_dot_product_attention``.

    SelfAttention (local spec) -> q, k, v -> SDPACoreAttention -> context -> linear_proj

Megatron's local ``DotProductAttention`` materialises the (b, heads, s, s) score matrix with
``baddbmm`` and an unfused softmax: slow and memory hungry, and it refuses packed sequences.
This module takes its place in the spec (same constructor, same forward) and hands the work to
SDPA, which picks a flash or memory-efficient kernel on the GPU and the math kernel on the CPU.

Two layouts arrive from ``SelfAttention``:

- ``sbhd`` (padded rows): q (s, b, heads, d), k/v (s, b, groups, d) -> one causal SDPA call,
  grouped-query attention through ``enable_gqa``. Right padding needs no mask: under causal
  attention a real token never sees the padding after it.
- ``thd`` (packed, ``PackedSeqParams(qkv_format="thd")``): q (t, heads, d), k/v (t, groups, d)
  with ``cu_seqlens_q`` marking where each sequence starts; one causal SDPA call per sequence,
  so no token attends across a sequence boundary.

Output: (s, b, heads * d) for ``sbhd``, (t, heads * d) for ``thd`` (Megatron reshapes it).
Dropout, softmax offsets, sliding windows and context parallelism are not supported here.
"""

from __future__ import annotations

import itertools
import math

import torch
import torch.nn.functional as F
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.process_groups_config import ProcessGroupCollection
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.transformer_config import TransformerConfig

from agentrl.errors import ConfigError


class SDPACoreAttention(MegatronModule):
    """Causal core attention on SDPA; a drop-in for the local spec's ``DotProductAttention``."""

    def __init__(
        self,
        config: TransformerConfig,
        layer_number: int,
        attn_mask_type: AttnMaskType,
        attention_type: str,
        attention_dropout: float | None = None,
        softmax_scale: float | None = None,
        cp_comm_type: str | None = None,
        pg_collection: ProcessGroupCollection | None = None,
    ) -> None:
        super().__init__(config=config)
        if config.context_parallel_size != 1:
            raise ConfigError(
                "SDPA core attention has no context parallelism; set context_parallel_size=1 "
                f"(got {config.context_parallel_size}) or use Transformer Engine's attention"
            )
        if config.window_size is not None or config.softmax_type != "vanilla":
            raise ConfigError(
                "SDPA core attention supports plain causal softmax attention only; got "
                f"window_size={config.window_size}, softmax_type={config.softmax_type!r}"
            )
        kv_channels = config.kv_channels or config.hidden_size // config.num_attention_heads
        self.softmax_scale = softmax_scale or 1.0 / math.sqrt(kv_channels)
        if config.apply_query_key_layer_scaling:
            self.softmax_scale /= max(1, layer_number)
        self.dropout_p = (
            config.attention_dropout if attention_dropout is None else attention_dropout
        )

    def _sdpa(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q (b, heads, s, d), k/v (b, groups, s, d) -> (b, heads, s, d), causal."""
        return F.scaled_dot_product_attention(
            q,
            k,
            v,
            is_causal=True,
            dropout_p=self.dropout_p if self.training else 0.0,
            scale=self.softmax_scale,
            enable_gqa=q.shape[1] != k.shape[1],
        )

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        attn_mask_type: AttnMaskType | None = None,
        attention_bias: torch.Tensor | None = None,
        packed_seq_params: PackedSeqParams | None = None,
    ) -> torch.Tensor:
        if attention_bias is not None:
            raise ConfigError("SDPA core attention takes no attention_bias")
        if packed_seq_params is not None and packed_seq_params.qkv_format == "thd":
            return self._forward_thd(query, key, value, packed_seq_params)
        # (s, b, h, d) -> (b, h, s, d)
        q, k, v = (x.permute(1, 2, 0, 3) for x in (query, key, value))
        out = self._sdpa(q, k, v)  # (b, heads, s, d)
        s, b = query.shape[0], query.shape[1]
        return out.permute(2, 0, 1, 3).reshape(s, b, -1)

    def _forward_thd(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        params: PackedSeqParams,
    ) -> torch.Tensor:
        cu = (
            params.cu_seqlens_q_padded
            if params.cu_seqlens_q_padded is not None
            else params.cu_seqlens_q
        )
        bounds = [int(x) for x in cu.tolist()]
        out = query.new_zeros(query.shape)  # (t, heads, d)
        for start, end in itertools.pairwise(bounds):
            if end <= start:
                continue
            q, k, v = (x[start:end].transpose(0, 1).unsqueeze(0) for x in (query, key, value))
            out[start:end] = self._sdpa(q, k, v).squeeze(0).transpose(0, 1)
        return out.reshape(query.shape[0], -1)
