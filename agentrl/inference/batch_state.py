"""The running batch's tensors: KV cache rows, attention mask, positions, pending tokens.

    prefill_inputs(prompts)  -> left-padded ids (B, P), mask (B, P), position_ids (B, P)
    BatchState.merge(other)  -> rows of both, KV and mask left-padded to a common length
    BatchState.select(rows)  -> only those rows, leading all-padding columns trimmed
    BatchState.decode_inputs -> pending token per row (B, 1), mask (B, T + 1), positions (B, 1)

Invariant: the cache holds every token of each row except the last sampled one, which is in
``last_tokens`` and is fed by the next decode step. Positions count real tokens only, so a
row's rotary phases, and hence its logits, do not depend on how much padding it carries.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from agentrl.errors import ConfigError

if TYPE_CHECKING:
    from agentrl.inference.runner_types import RunnerRequest


def prefill_inputs(
    prompts: list[list[int]], pad_id: int, device: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-pad prompts: ids (B, P), mask (B, P) with 1 on real tokens, position_ids (B, P)."""
    longest = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), longest), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), longest), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, longest - len(p) :] = torch.tensor(p, dtype=torch.long)
        mask[i, longest - len(p) :] = 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids.to(device), mask.to(device), pos.to(device)


def _left_pad(x: torch.Tensor, n: int) -> torch.Tensor:
    """Pad the sequence axis (-2 for KV (B, H, T, D), -1 for masks (B, T)) with n zeros."""
    if n == 0:
        return x
    if x.dim() == 2:
        return torch.cat([x.new_zeros(x.shape[0], n), x], dim=1)
    shape = (*x.shape[:-2], n, x.shape[-1])
    return torch.cat([x.new_zeros(shape), x], dim=-2)


@dataclass(eq=False, kw_only=True)
class BatchState:
    reqs: list[RunnerRequest]  # [B]
    cache: Any  # transformers DynamicCache; layers hold keys/values (B, H, T, D)
    mask: torch.Tensor  # (B, T) long, 1 on real tokens
    next_pos: torch.Tensor  # (B,) position of each row's pending token
    last_tokens: torch.Tensor  # (B,) the pending token of each row

    @property
    def size(self) -> int:
        return len(self.reqs)

    @staticmethod
    def new_cache(model: Any) -> Any:
        from transformers import DynamicCache

        return DynamicCache(config=model.config)

    @staticmethod
    def check_supported(model: Any) -> None:
        """Only full-attention ``DynamicLayer`` caches can be merged and indexed by rows."""
        from transformers.cache_utils import DynamicLayer

        kinds = {type(layer) for layer in BatchState.new_cache(model).layers}
        if kinds and kinds != {DynamicLayer}:
            names = sorted(k.__name__ for k in kinds)
            raise ConfigError(
                f"the embedded server batches full-attention models only; this model's cache "
                f"has layers {names}. Serve it with vLLM or SGLang instead."
            )

    def decode_inputs(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        ones = self.mask.new_ones(self.size, 1)
        return (
            self.last_tokens[:, None],
            torch.cat([self.mask, ones], dim=1),
            self.next_pos[:, None],
        )

    def merge(self, other: BatchState) -> BatchState:
        """Rows of self then rows of other, left-padded to the longer cache."""
        t_self, t_other = self.mask.shape[1], other.mask.shape[1]
        width = max(t_self, t_other)
        for mine, theirs in zip(self.cache.layers, other.cache.layers, strict=True):
            mine.keys = torch.cat(
                [_left_pad(mine.keys, width - t_self), _left_pad(theirs.keys, width - t_other)]
            )
            mine.values = torch.cat(
                [_left_pad(mine.values, width - t_self), _left_pad(theirs.values, width - t_other)]
            )
        self.mask = torch.cat(
            [_left_pad(self.mask, width - t_self), _left_pad(other.mask, width - t_other)]
        )
        self.next_pos = torch.cat([self.next_pos, other.next_pos])
        self.last_tokens = torch.cat([self.last_tokens, other.last_tokens])
        self.reqs = self.reqs + other.reqs
        return self

    def select(self, rows: list[int]) -> BatchState:
        """Keep only ``rows``; drop leading columns that are padding in every kept row."""
        idx = torch.tensor(rows, dtype=torch.long, device=self.mask.device)
        mask = self.mask[idx]
        used = mask.any(dim=0).nonzero()
        start = int(used[0, 0]) if used.numel() else 0
        for layer in self.cache.layers:
            layer.keys = layer.keys[idx, :, start:]
            layer.values = layer.values[idx, :, start:]
        self.mask = mask[:, start:]
        self.next_pos = self.next_pos[idx]
        self.last_tokens = self.last_tokens[idx]
        self.reqs = [self.reqs[i] for i in rows]
        return self
