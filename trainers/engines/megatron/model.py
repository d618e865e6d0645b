"""Build a Megatron-core GPT model for a Hugging Face Llama / Qwen2 / Qwen3 checkpoint.

    HF config.json -> ModelShape (what the converter and the engine need)
                   -> TransformerConfig (+ TP/PP/CP sizes, dtype, recompute)
                   -> local layer spec with SDPACoreAttention -> GPTModel (this rank's stage)

The local spec (``get_gpt_layer_local_spec``) runs without Transformer Engine or Apex; its
core attention is swapped for ``SDPACoreAttention``. ``GPTModel`` is Megatron's dense decoder;
its successor ``HybridModel`` ships only Transformer-Engine layer specs, so the local path uses
``GPTModel`` (Megatron's deprecation notice at construction is expected).

The vocabulary is padded to a multiple of ``vocab_multiple * tensor_parallel_size`` rows
(zeros); the engine masks the padded logits, so they never enter a softmax.
"""

from __future__ import annotations

import types
import warnings
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from agentrl.errors import ConfigError

ARCHS = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")


@dataclass(frozen=True, kw_only=True)
class ModelShape:
    """The facts about a dense HF decoder that the Megatron model and the converter need."""

    arch: str
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int
    rope_theta: float
    norm_eps: float
    qkv_bias: bool
    qk_norm: bool
    tie_embeddings: bool

    @property
    def heads_per_group(self) -> int:
        return self.num_heads // self.num_kv_heads

    def padded_vocab(self, multiple: int) -> int:
        return -(-self.vocab_size // multiple) * multiple


def _rope_theta(hf_config: Any) -> float:
    params = getattr(hf_config, "rope_parameters", None) or {}
    scaling = getattr(hf_config, "rope_scaling", None) or {}
    kind = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    if kind != "default":
        raise ConfigError(
            f"the megatron engine supports plain RoPE only; the checkpoint uses rope_type={kind!r}. "
            "Use the torch engine for this model"
        )
    theta = params.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0))
    return float(theta)


def model_shape(hf_config: Any) -> ModelShape:
    """Read a transformers config (Llama, Qwen2 or Qwen3 dense) into a ModelShape."""
    archs = list(getattr(hf_config, "architectures", None) or [])
    arch = archs[0] if archs else ""
    if arch not in ARCHS:
        raise ConfigError(
            f"the megatron engine converts {', '.join(ARCHS)}; the checkpoint is {arch or 'unknown'}. "
            "Use the torch engine for other architectures"
        )
    heads = int(hf_config.num_attention_heads)
    hidden = int(hf_config.hidden_size)
    qkv_bias = arch == "Qwen2ForCausalLM" or bool(getattr(hf_config, "attention_bias", False))
    return ModelShape(
        arch=arch,
        num_layers=int(hf_config.num_hidden_layers),
        hidden_size=hidden,
        ffn_hidden_size=int(hf_config.intermediate_size),
        num_heads=heads,
        num_kv_heads=int(getattr(hf_config, "num_key_value_heads", None) or heads),
        head_dim=int(getattr(hf_config, "head_dim", None) or hidden // heads),
        vocab_size=int(hf_config.vocab_size),
        max_position_embeddings=int(hf_config.max_position_embeddings),
        rope_theta=_rope_theta(hf_config),
        norm_eps=float(hf_config.rms_norm_eps),
        qkv_bias=qkv_bias,
        qk_norm=arch == "Qwen3ForCausalLM",
        tie_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
    )


@dataclass(frozen=True, kw_only=True)
class Parallelism:
    tensor: int = 1
    pipeline: int = 1
    context: int = 1


def transformer_config(
    shape: ModelShape,
    *,
    dtype: torch.dtype,
    parallel: Parallelism,
    recompute: bool,
    cpu_init: bool,
    fused: bool = False,
) -> Any:
    """A TransformerConfig for ``shape``: RMSNorm, SwiGLU, RoPE, no dropout.

    ``fused`` turns on Megatron's SwiGLU and bias-dropout-add fusions (``torch.compile``d
    functions, no Transformer Engine needed); kernels that need Transformer Engine or Apex
    (fused RoPE, persistent layer norm, gradient-accumulation fusion) stay off.
    """
    from megatron.core.transformer.transformer_config import TransformerConfig

    if shape.num_layers % parallel.pipeline:
        raise ConfigError(
            f"pipeline_parallel_size={parallel.pipeline} must divide num_layers={shape.num_layers}"
        )
    if shape.num_kv_heads % parallel.tensor:
        raise ConfigError(
            f"tensor_parallel_size={parallel.tensor} must divide the {shape.num_kv_heads} "
            "key/value heads; pick a smaller tensor_parallel_size"
        )
    recompute_kwargs: dict[str, Any] = {}
    if recompute:
        recompute_kwargs = dict(
            recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1
        )
    return TransformerConfig(
        num_layers=shape.num_layers,
        hidden_size=shape.hidden_size,
        ffn_hidden_size=shape.ffn_hidden_size,
        num_attention_heads=shape.num_heads,
        num_query_groups=shape.num_kv_heads,
        kv_channels=shape.head_dim,
        normalization="RMSNorm",
        layernorm_epsilon=shape.norm_eps,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=shape.qkv_bias,
        qk_layernorm=shape.qk_norm,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=parallel.tensor,
        pipeline_model_parallel_size=parallel.pipeline,
        context_parallel_size=parallel.context,
        sequence_parallel=False,
        params_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        fp16=dtype == torch.float16,
        pipeline_dtype=dtype,
        use_cpu_initialization=cpu_init,
        perform_initialization=False,  # weights come from the HF checkpoint
        persist_layer_norm=False,
        bias_activation_fusion=fused,
        bias_dropout_fusion=fused,
        masked_softmax_fusion=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        calculate_per_token_loss=True,  # the engine sums losses; Megatron must not average them
        **recompute_kwargs,
    )


def layer_spec(shape: ModelShape, *, sdpa: bool = True) -> Any:
    """Megatron's local (no Transformer Engine) layer spec, core attention on SDPA."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    from trainers.engines.megatron.attention import SDPACoreAttention

    spec = get_gpt_layer_local_spec(normalization="RMSNorm", qk_layernorm=shape.qk_norm)
    if sdpa:
        spec.submodules.self_attention.submodules.core_attention = SDPACoreAttention
    return spec


def build_model(
    shape: ModelShape,
    config: Any,
    *,
    vocab_multiple: int,
    pre_process: bool = True,
    post_process: bool = True,
    sdpa: bool = True,
) -> Any:
    """This pipeline stage's GPTModel (weights uninitialised; load them with ``convert``)."""
    import warnings

    from megatron.core.models.gpt import GPTModel

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        return GPTModel(
            config=config,
            transformer_layer_spec=layer_spec(shape, sdpa=sdpa),
            vocab_size=shape.padded_vocab(vocab_multiple * config.tensor_model_parallel_size),
            max_sequence_length=shape.max_position_embeddings,
            pre_process=pre_process,
            post_process=post_process,
            share_embeddings_and_output_weights=shape.tie_embeddings,
            position_embedding_type="rope",
            rotary_base=int(shape.rope_theta),
            parallel_output=True,
        )


COMPILE_SCOPES = ("decoder", "layer")


def compile_layers(
    model: Any, mode: str = "default", backend: Any = "inductor", scope: str = "decoder"
) -> None:
    """torch.compile the decoder: the whole stack as one graph, or each layer on its own.

    ``scope="decoder"`` compiles the stack of decoder layers (``model.decoder``) into one graph:
    one guard check and one compiled autograd function per step instead of one per layer, and
    Inductor fuses across layer boundaries (one layer's residual add with the next one's
    RMSNorm). ``scope="layer"`` compiles each layer alone: all layers share one graph, which
    compiles in a fraction of the time, but every layer pays the compiled region's host cost
    in forward and again in backward, and a slow host then starves the GPU. Megatron's full
    activation recompute wraps the layers in its own checkpoint function, which dynamo does not
    trace: callers use ``scope="layer"`` with recompute.

    Megatron's linear layers call ``warnings.warn("... tp_group is None ...", DeprecationWarning)``
    inside forward (``RowParallelLinear`` passes ``tp_group=None`` to its matmul helper in
    ``megatron.core.utils``). Dynamo cannot reorder a warning that takes a class argument, so
    every linear split its layer: ~10 compiled regions per layer, each paying host time in
    forward and again in backward. ``megatron.core.utils`` therefore gets a ``warnings`` whose
    ``warn`` returns at once while dynamo traces and warns as before in eager code. Dynamo's own
    switch for this (``ignore_logging_functions``) breaks every compile on torch 2.11
    (pytorch/pytorch#178455), so it is not used. Padded ``sbhd`` inputs then trace whole; the
    packed THD path still breaks on Megatron's THD RoPE.
    """
    import megatron.core.utils as mcore_utils

    if scope not in COMPILE_SCOPES:
        raise ConfigError(f"compile scope must be one of {COMPILE_SCOPES}, got {scope!r}")
    if not isinstance(mcore_utils.warnings, _QuietWhileTracing):
        mcore_utils.warnings = _QuietWhileTracing()  # type: ignore[assignment]
    if scope == "decoder":
        model.decoder.compile(mode=mode, backend=backend)
        return
    for layer in model.decoder.layers:
        layer.compile(mode=mode, backend=backend)


class _QuietWhileTracing(types.ModuleType):
    """The ``warnings`` module, except that ``warn`` does nothing while dynamo traces."""

    def __init__(self) -> None:
        super().__init__("warnings")

    def __getattr__(self, name: str) -> Any:
        return getattr(warnings, name)

    @staticmethod
    def warn(message: Any, category: Any = None, stacklevel: int = 1, source: Any = None) -> None:
        if torch.compiler.is_compiling():
            return
        warnings.warn(message, category, stacklevel + 1, source)
