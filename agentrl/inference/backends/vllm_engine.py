"""A vLLM weight-transfer engine that moves weights as safetensors files (works on CPU).

    trainer: safetensors bucket -> <root>/<bucket>.safetensors (tmpfs when there is one)
        POST /start_weight_update
        POST /update_weights {"update_info": {"path": ".../bucket.safetensors", "names": [...]}}
        ... one per bucket ...
        POST /finish_weight_update {"weight_version": "N"}
    vLLM worker (this engine): start -> layerwise reload begins; each update loads one file
        into ``model.load_weights`` (HF names, vLLM fuses q/k/v and gate/up itself);
        finish -> layerwise reload re-runs the kernel post-processing (CPU GEMM packing).

vLLM's built-in engines are NCCL and CUDA IPC, which need GPUs; this one plugs the same
``/init_weight_transfer_engine`` ... ``/finish_weight_update`` protocol into vLLM's
``WeightTransferEngineFactory`` under the name ``agentrl_file``. Only files under the
``root`` that the trainer names at ``/init_weight_transfer_engine`` are read.

This module imports vllm: it is loaded inside a vLLM server process only (``vllm_entry``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)

logger = logging.getLogger(__name__)

ENGINE_NAME = "agentrl_file"


@dataclass
class FileInitInfo(WeightTransferInitInfo):
    root: str = ""
    """A directory the trainer writes buckets under (each init adds one); others are refused."""


@dataclass
class FileUpdateInfo(WeightTransferUpdateInfo):
    path: str = ""
    """One safetensors bucket (HF tensor names)."""
    names: list[str] = field(default_factory=list)
    """The tensor names the file must hold (checked before loading)."""


class FileWeightTransferEngine(WeightTransferEngine[FileInitInfo, FileUpdateInfo]):
    """Loads safetensors buckets named by path into the served model (layerwise reload)."""

    init_info_cls = FileInitInfo
    update_info_cls = FileUpdateInfo
    supports_draft_weight_update = False

    def init_transfer_engine(self, init_info: FileInitInfo) -> None:
        if not init_info.root:
            raise ValueError("init_info.root is required: the directory buckets are written to")
        self.roots: set[Path] = {*getattr(self, "roots", ()), Path(init_info.root).resolve()}

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)
        if self.device.type == "cpu":
            self._repack_cpu_embeddings()

    def _repack_cpu_embeddings(self) -> None:
        """vLLM's CPU backend packs the LM head for oneDNN at load time. A tied LM head loads
        no tensor of its own during a reload, so its packed copy would keep the old weights:
        pack again every layer that kept its weight next to a packed copy (embeddings)."""
        for module in self.model.modules():
            weight = getattr(module, "weight", None)
            method = getattr(module, "quant_method", None)
            if hasattr(module, "cpu_linear") and weight is not None and weight.numel() and method:
                method.process_weights_after_loading(module)

    def update_weights(self, update_info: dict[str, Any]) -> None:
        self.receive_weights(self.parse_update_info(update_info))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def receive_weights(self, update_info: FileUpdateInfo) -> None:
        from safetensors.torch import load_file

        roots: set[Path] = getattr(self, "roots", set())
        if not roots:
            raise ValueError("call /init_weight_transfer_engine with {'root': DIR} first")
        path = Path(update_info.path).resolve()
        if not roots & set(path.parents):
            raise ValueError(f"update path {str(path)!r} is not under a root given at init")
        device = "cpu" if self.device.type == "cpu" else str(self.device)
        tensors = load_file(str(path), device=device)
        if update_info.names and sorted(update_info.names) != sorted(tensors):
            raise ValueError(
                f"{path.name} holds {len(tensors)} tensors, expected the {len(update_info.names)} "
                f"named in update_info; first missing: {sorted(set(update_info.names) - set(tensors))[:3]}"
            )
        self.model.load_weights(iter(tensors.items()))
        logger.debug("loaded %d tensors from %s", len(tensors), path)

    def shutdown(self) -> None:
        self.roots = set()


def register() -> None:
    """Add ``agentrl_file`` to vLLM's engine registry (idempotent; a vLLM general plugin)."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    if ENGINE_NAME not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(ENGINE_NAME, FileWeightTransferEngine)
