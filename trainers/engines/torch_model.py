"""The model side of the torch-native engine: load, shard, and score tokens memory-aware.

    HF dir -> load_model (AutoModelForCausalLM | AutoModelForTokenClassification for a critic)
           -> Scorer (root module: base model -> hidden states -> per-token logprobs or values)
           -> shard (FSDP2 fully_shard on every decoder layer, then the Scorer) when distributed

``Scorer`` calls the base transformer and then projects only the hidden states that predict a
real next token, ``logprob_chunk_tokens`` at a time: each chunk's fp32 logits live only inside
that chunk (recomputed in backward via activation checkpointing), so the full (N, V) fp32
log-softmax never exists, let alone twice. Logprobs are ``logits[t-1] / temperature`` log-softmaxed
and gathered at token t; position 0 of each sequence gets 0.0 (token-aligned, see
``agentrl.batch``).

Padding-free ("packed") forwards concatenate a micro-batch into one (1, N) row whose
position ids restart per sequence; transformers turns those into a block-diagonal causal mask
(sdpa/eager, on any device) or varlen kernels (flash attention), as long as no 2-D attention
mask and no KV cache are passed. Models with logit soft-capping or scaled logits (not plain
``lm_head`` projections) are not supported by the chunked projection.

Vision-language models (``agentrl.vision``; Qwen2-VL, loaded with
``AutoModelForImageTextToText``): a micro-batch whose rows carry images gets their pixels
(``ScoringPlan.images``, from ``Vision.pixels`` on the rows' data URLs, as the inference
server computes them) and Qwen2-VL's multimodal rotary positions (``mrope_positions``), and
runs padded even when ``packed`` is set (packing those positions is not built).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from agentrl.batch import TrainBatch
from agentrl.engine import EngineConfig
from agentrl.errors import ConfigError, TrainingError
from agentrl.vision import ImageInputs, Vision, mrope_positions, vision_model_type

logger = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _chunk_scores(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    temperature: float,
    with_entropy: bool,
    suppress: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    logits = F.linear(hidden, weight, bias).float() / temperature  # (n, V) fp32, this chunk only
    if suppress is not None:  # tokens the server never samples: probability 0 here too
        logits = logits.index_fill(-1, suppress, -1e30)  # finite: 0 * logit stays 0 below
    lse = torch.logsumexp(logits, dim=-1)
    logp = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
    if not with_entropy:
        return logp, torch.zeros_like(logp)
    entropy = lse - (torch.softmax(logits, dim=-1) * logits).sum(-1)
    return logp, entropy


CPU_CHUNK_TOKENS = 1024
"""The projection's chunk on CPU: small chunks stay in cache (30,000 tokens, vocabulary 1,100,
forward and backward on 2 cores: 0.51 s at 1,024 against 0.92 s at 8,192 and 1.17 s at 32,768)."""
GPU_LOGITS_BYTES = 256 * 2**20
"""On a GPU, one chunk's fp32 logits may take this much: few large chunks, since each chunk is
a dozen kernel launches forward and backward (a 2-layer model with a 1,030-token vocabulary on
an H100, 40,040 tokens, two epochs of two mini-batches: 0.222 s at 1,024 against 0.104 s at
16,384; ``benchmarks/logprob_chunks.py``)."""


def projection_chunk(configured: int, vocab: int, device: torch.device | str) -> int:
    """Tokens per chunk of the vocabulary projection: ``configured``, or for 0 one chosen by
    device: ``CPU_CHUNK_TOKENS`` on CPU; on a GPU as many as fit ``GPU_LOGITS_BYTES`` of fp32
    logits, from 1,024 to 65,536 (a 150k-token vocabulary gets 1,024, as before)."""
    if configured > 0:
        return configured
    if torch.device(device).type == "cpu":
        return CPU_CHUNK_TOKENS
    return max(1024, min(65536, GPU_LOGITS_BYTES // (4 * max(1, vocab))))


def token_logprobs(
    hidden_MH: torch.Tensor,
    weight_VH: torch.Tensor,
    bias_V: torch.Tensor | None,
    targets_M: torch.Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    chunk_tokens: int = 1024,
    suppress: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log softmax(hidden @ W.T / temperature)[target] per row, chunked over rows: (M,), (M,)|None.

    ``suppress``: token ids given probability 0 (a vision model's image-only tokens, which the
    inference server never samples), so trained and served logprobs stay the same."""
    if temperature <= 0:
        raise ConfigError(f"temperature must be > 0, got {temperature}")
    logps, ents = [], []
    grad = torch.is_grad_enabled() and (hidden_MH.requires_grad or weight_VH.requires_grad)
    for start in range(0, hidden_MH.shape[0], chunk_tokens):
        args = (
            hidden_MH[start : start + chunk_tokens],
            weight_VH,
            bias_V,
            targets_M[start : start + chunk_tokens],
            temperature,
            with_entropy,
            suppress,
        )
        if grad:
            # no randomness inside a chunk: skip saving / restoring the RNG states (host syncs)
            lp, ent = checkpoint(
                _chunk_scores, *args, use_reentrant=False, preserve_rng_state=False
            )
        else:
            lp, ent = _chunk_scores(*args)
        logps.append(lp)
        ents.append(ent)
    logp = torch.cat(logps) if logps else hidden_MH.new_zeros(0, dtype=torch.float32)
    return logp, (torch.cat(ents) if with_entropy and ents else None)


@dataclass(frozen=True, kw_only=True)
class ScoringPlan:
    """Where one micro-batch's next-token predictions come from and go to.

    Hidden state ``src`` (flat index into the forward's tokens) predicts token ``targets``,
    whose result lands at ``dest`` (flat index into the batch's (B * T) grid).
    """

    input_ids: torch.Tensor  # (b, t) padded, or (1, N) packed
    position_ids: torch.Tensor  # same shape as input_ids
    attention_mask: torch.Tensor | None  # (b, t) padded; None when packed
    src: torch.Tensor  # (M,)
    dest: torch.Tensor  # (M,)
    targets: torch.Tensor  # (M,)
    batch_shape: tuple[int, int]  # (B, T)
    images: ImageInputs | None = None  # the rows' images, row by row, in placeholder order


def plan_scoring(batch: TrainBatch, packed: bool, vision: Vision | None = None) -> ScoringPlan:
    """Pair every real token except each sequence's first with the hidden state before it.

    Rows with images need the model's ``vision``; such a batch is planned padded."""
    b, t = len(batch), batch.seq_len
    images = None
    if batch.has_images:
        if vision is None:
            raise TrainingError(
                "TrainBatch rows carry images but engine.model_path is a text-only model; "
                "train a vision-language model (agentrl.tiny.make_tiny_model(arch='qwen2_vl'))"
            )
        images = vision.pixels([u for row in batch.images for u in row])
        vision.check_tokens(batch.input_ids[batch.attention_mask.bool()].tolist(), images)
        images = images.to(batch.device)
        packed = False
    if packed:
        pk = batch.pack()
        n = pk.input_ids.shape[1]
        starts = torch.zeros(n, dtype=torch.bool, device=pk.input_ids.device)
        starts[pk.cu_seqlens[:-1].long()] = True
        nxt = (~starts[1:]).nonzero().squeeze(
            1
        ) + 1  # positions with a predecessor in their sequence
        return ScoringPlan(
            input_ids=pk.input_ids,
            position_ids=pk.position_ids,
            attention_mask=None,
            src=nxt - 1,
            dest=pk.flat_index[nxt],
            targets=pk.input_ids[0, nxt],
            batch_shape=(b, t),
        )
    ids = batch.input_ids
    valid = batch.attention_mask.clone()
    valid[:, 0] = 0
    dest = valid.reshape(-1).nonzero().squeeze(1)
    return ScoringPlan(
        input_ids=ids,
        position_ids=batch.position_ids,
        attention_mask=batch.attention_mask,
        src=dest - 1,
        dest=dest,
        targets=ids.reshape(-1)[dest],
        batch_shape=(b, t),
        images=images,
    )


def _scatter(values_M: torch.Tensor, plan: ScoringPlan) -> torch.Tensor:
    b, t = plan.batch_shape
    out = values_M.new_zeros(b, t)  # built (B, T) directly: FSDP2 roots should not return views
    return out.index_put((plan.dest // t, plan.dest % t), values_M)


class Scorer(nn.Module):
    """Root module: HF model -> per-token (logprobs, entropy) for a policy, values for a critic."""

    def __init__(
        self,
        model: nn.Module,
        *,
        critic: bool,
        chunk_tokens: int,
        suppress: Sequence[int] = (),
    ) -> None:
        super().__init__()
        self.model = model
        self.critic = critic
        self.chunk_tokens = chunk_tokens
        self.register_buffer(
            "suppress", torch.tensor(list(suppress), dtype=torch.long), persistent=False
        )

    def _hidden(self, plan: ScoringPlan) -> torch.Tensor:
        base = cast(nn.Module, self.model.base_model)
        if plan.images is not None:
            positions, _ = mrope_positions(
                self.model, plan.input_ids, plan.attention_mask, plan.images
            )
            out = base(
                input_ids=plan.input_ids,
                attention_mask=plan.attention_mask,
                position_ids=positions,  # (3, B, T)
                pixel_values=plan.images.pixel_values,
                image_grid_thw=plan.images.image_grid_thw,
                use_cache=False,
            )
        else:
            out = base(
                input_ids=plan.input_ids,
                attention_mask=plan.attention_mask,
                position_ids=plan.position_ids,
                use_cache=False,
            )
        hidden: torch.Tensor = out.last_hidden_state
        return hidden.reshape(-1, hidden.shape[-1])

    def forward(
        self, plan: ScoringPlan, temperature: float = 1.0, with_entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(logprobs (B, T), entropy (B, T) | None), or (values (B, T), None) for a critic."""
        hidden = self._hidden(plan)[plan.src]  # (M, H)
        if self.critic:
            head = cast(nn.Module, self.model.score)
            return _scatter(head(hidden).squeeze(-1).float(), plan), None
        lm_head = cast(nn.Linear, self.model.get_output_embeddings())  # type: ignore[operator]
        suppress = cast(torch.Tensor, self.suppress)
        logp, ent = token_logprobs(
            hidden,
            lm_head.weight,
            lm_head.bias,
            plan.targets,
            temperature=temperature,
            with_entropy=with_entropy,
            chunk_tokens=self.chunk_tokens,
            suppress=suppress if suppress.numel() else None,
        )
        return _scatter(logp, plan), (_scatter(ent, plan) if ent is not None else None)


def load_model(config: EngineConfig) -> nn.Module:
    """The HF model for ``config.role``, fp32 master weights, cache off."""
    from transformers import (
        AutoModelForCausalLM,
        AutoModelForImageTextToText,
        AutoModelForTokenClassification,
    )

    kwargs: dict[str, Any] = {
        "dtype": torch.float32,
        "attn_implementation": config.attn_implementation,
    }
    try:
        if config.role == "critic":
            model = AutoModelForTokenClassification.from_pretrained(
                config.model_path, num_labels=1, **kwargs
            )
            if not hasattr(model, "score"):
                raise ConfigError(
                    f"critic model {type(model).__name__} has no 'score' head; "
                    "use a decoder architecture with a token-classification head"
                )
        elif vision_model_type(config.model_path) is not None:
            model = AutoModelForImageTextToText.from_pretrained(config.model_path, **kwargs)
        else:
            model = AutoModelForCausalLM.from_pretrained(config.model_path, **kwargs)
    except OSError as e:
        raise ConfigError(
            f"engine.model_path {config.model_path!r} is not a loadable Hugging Face "
            f"directory ({e}); build one with agentrl.tiny.make_tiny_model or point "
            "it at a local checkpoint"
        ) from None
    model.config.use_cache = False
    if config.gradient_checkpointing and config.role != "ref":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if config.role == "ref":
        model.requires_grad_(False)
        model.eval()
    else:
        model.train()
    return model


def load_vision(config: EngineConfig) -> Vision | None:
    """The image side of a vision-language ``engine.model_path`` (None for a text model)."""
    from transformers import AutoTokenizer

    if vision_model_type(config.model_path) is None:
        return None
    tokenizer = AutoTokenizer.from_pretrained(config.model_path)
    return Vision.from_pretrained(config.model_path, tokenizer)


def shard(scorer: Scorer, config: EngineConfig, device: torch.device) -> None:
    """FSDP2: shard each decoder layer, then the root; gradients are summed across ranks."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(device.type, (torch.distributed.get_world_size(),))
    mp = MixedPrecisionPolicy(param_dtype=DTYPES[config.dtype], reduce_dtype=torch.float32)
    layer_classes = set(getattr(scorer.model, "_no_split_modules", None) or ())
    layers = [m for m in scorer.modules() if type(m).__name__ in layer_classes]
    if not layers:
        logger.warning("no decoder layers found via _no_split_modules; sharding the root only")
    for layer in layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(scorer, mesh=mesh, mp_policy=mp)
    for module in scorer.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)  # sum over ranks (see agentrl.engine)
            module.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM
