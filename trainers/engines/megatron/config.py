"""The Megatron engine's own options: parallel layout and model-building switches.

Kept apart from ``engine.py`` so that run configs can name them without importing the engine.
In a recipe they sit under ``megatron:`` and apply when ``engine.backend: megatron``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentrl.errors import ConfigError


@dataclass(kw_only=True)
class MegatronConfig:
    """Parallel layout and Megatron options (the rest is the shared EngineConfig)."""

    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    context_parallel_size: int = 1
    """Needs Transformer Engine's attention; the SDPA core attention supports 1 only."""
    use_distributed_optimizer: bool = True
    """Shard fp32 master weights and Adam state over data-parallel ranks (ZeRO-1)."""
    vocab_multiple: int = 128
    """Pad the vocabulary to a multiple of this times tensor_parallel_size."""
    sdpa_attention: bool = True
    """SDPA core attention; False keeps Megatron's local (unfused) DotProductAttention."""
    compile_layers: bool = False
    """torch.compile the decoder layers (padded batches; the packed THD path still breaks on
    Megatron's THD RoPE)."""
    compile_scope: str = "decoder"
    """``decoder``: the whole stack of layers as one graph (least host time per step, fusions
    across layers; the first step compiles longer). ``layer``: each layer alone (one shared
    graph, quick to compile). With gradient checkpointing the engine compiles per layer."""
    compile_mode: str = "default"
    """torch.compile mode for compile_layers, e.g. ``max-autotune-no-cudagraphs`` (benchmarks
    Triton GEMM templates against cuBLAS at the first step; slower start, sometimes faster)."""
    fused_adam: bool = True
    """Without Apex / Transformer Engine Megatron falls back to ``torch.optim.AdamW``; run it
    with torch's fused CUDA kernel (one launch for all tensors) instead of the foreach one."""
    lean_optimizer_step: bool = True
    """Clip and step with ``optim.LeanStep`` (one device sync, foreach kernels) instead of
    Megatron's step, whose fallbacks without Apex sync once per parameter; same state and
    checkpoints. Falls back to Megatron's step where LeanStep does not apply (e.g. fp16)."""

    def validate_run(self, cfg: Any) -> None:
        """Checks against the whole run config (``RunConfig.validate`` calls it when an engine
        role uses ``backend: megatron``): the world size splits into model-parallel groups, and
        no critic runs on this engine."""
        world = cfg.train.world_size
        model_parallel = (
            self.tensor_parallel_size * self.pipeline_parallel_size * self.context_parallel_size
        )
        if model_parallel < 1 or world % model_parallel:
            raise ConfigError(
                f"train.world_size ({world}) must be a multiple of megatron.tensor_parallel_size "
                f"x pipeline_parallel_size x context_parallel_size ({model_parallel}); the rest "
                f"is data parallel. Try train.world_size={max(model_parallel, 1)}."
            )
        if cfg.algo.adv_estimator == "gae" and cfg.critic.backend == "megatron":
            raise ConfigError(
                "the megatron engine has no critic (value head); keep critic.backend=torch"
            )
