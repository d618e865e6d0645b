"""Engines: implementations of ``agentrl.engine.Engine``, looked up by name.

    engine = ENGINES.make("torch", config=EngineConfig(model_path=path))

``torch``: transformers model, FSDP2 across ranks (gloo on CPU, nccl on GPU); see
``trainers/engines/torch_native.py``. Entry points are import strings, so nothing heavy loads
until an engine is made.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentrl.registry import Registry

if TYPE_CHECKING:
    from agentrl.engine import Engine

ENGINES: Registry[Engine] = Registry("engine", hint="Known engines: `torch`, `megatron`.")
ENGINES.register(
    "torch",
    "trainers.engines.torch_native:TorchEngine",
    description="transformers model; FSDP2 when torch.distributed is initialised",
)
ENGINES.register(
    "megatron",
    "trainers.engines.megatron.engine:MegatronEngine",
    description="Megatron-core GPTModel (Llama/Qwen2/Qwen3); tensor/pipeline/data parallel",
)

__all__ = ["ENGINES"]
