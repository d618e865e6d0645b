"""State of the torch-native engine: per-tensor weights, checkpoints, HF export, offload.

    named_weights: HF-named full tensors, gathered from FSDP2 shards one at a time
    save/load:     torch.distributed.checkpoint (sharded model + optimizer) + scheduler/step/RNG
    export_hf:     full weights gathered on rank 0 -> model.safetensors + config + tokenizer
    move:          parameters, gradients and optimizer state to CPU and back

Checkpoint layout of ``save(dir)``::

    dir/dcp/            model and optimizer (torch.distributed.checkpoint, one shard per rank)
    dir/engine.pt       step, LR scheduler state (rank 0)
    dir/rng_rank{r}.pt  torch RNG states of rank r

Tied weights (e.g. ``lm_head.weight`` sharing ``embed_tokens.weight``) are yielded and exported
once, under the first name, as ``save_pretrained`` does.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from agentrl.errors import TrainingError

if TYPE_CHECKING:
    from trainers.engines.torch_model import Scorer
    from trainers.engines.torch_native import TorchEngine

logger = logging.getLogger(__name__)


def reshard(module: nn.Module) -> None:
    """Put FSDP2's root parameters back to their sharded form (a forward leaves them gathered)."""
    from torch.distributed.fsdp import FSDPModule

    if isinstance(module, FSDPModule):
        module.reshard()


def _barrier() -> None:
    if _distributed():
        dist.barrier()


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


@contextlib.contextmanager
def _quiet_dcp() -> Iterator[None]:
    """DCP warns that it 'assumes a single process' even when told so with no_dist=True."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _rank() -> int:
    return dist.get_rank() if _distributed() else 0


def named_weights(scorer: Scorer) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, full tensor) per unique parameter/buffer of the wrapped HF model."""
    reshard(scorer)
    hf_model = scorer.model
    seen: set[int] = set()
    for name, value in hf_model.state_dict(keep_vars=True).items():
        if id(value) in seen:
            continue  # a tied weight
        seen.add(id(value))
        tensor = value.full_tensor() if hasattr(value, "full_tensor") else value
        yield name, tensor.detach()


def save(engine: TorchEngine, path: Path) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    path.mkdir(parents=True, exist_ok=True)
    reshard(engine.scorer)
    state: dict[str, Any]
    if engine._optimizer is not None:
        model_sd, optim_sd = get_state_dict(engine.scorer, engine._optimizer)
        state = {"model": model_sd, "optim": optim_sd}
    else:
        state = {"model": get_model_state_dict(engine.scorer)}
    with _quiet_dcp():
        dcp.save(state, checkpoint_id=str(path / "dcp"), no_dist=not _distributed())
    rank = _rank()
    if rank == 0:
        scheduler = engine._scheduler.state_dict() if engine._scheduler is not None else None
        torch.save(
            {"step": engine.step, "scheduler": scheduler, "role": engine.config.role},
            path / "engine.pt",
        )
    rng = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state()
    torch.save(rng, path / f"rng_rank{rank}.pt")
    _barrier()
    logger.info("saved %s engine at step %d to %s", engine.config.role, engine.step, path)


def load(engine: TorchEngine, path: Path) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_state_dict,
        set_model_state_dict,
        set_state_dict,
    )

    if not (path / "engine.pt").is_file():
        raise TrainingError(
            f"no engine checkpoint at {str(path)!r} (expected engine.pt and dcp/); "
            "pass a directory written by engine.save()"
        )
    reshard(engine.scorer)
    state: dict[str, Any]
    if engine._optimizer is not None:
        model_sd, optim_sd = get_state_dict(engine.scorer, engine._optimizer)
        state = {"model": model_sd, "optim": optim_sd}
        with _quiet_dcp():
            dcp.load(state, checkpoint_id=str(path / "dcp"), no_dist=not _distributed())
        set_state_dict(
            engine.scorer,
            engine._optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optim"],
        )
    else:
        state = {"model": get_model_state_dict(engine.scorer)}
        with _quiet_dcp():
            dcp.load(state, checkpoint_id=str(path / "dcp"), no_dist=not _distributed())
        set_model_state_dict(engine.scorer, state["model"])
    extra = torch.load(path / "engine.pt", weights_only=False)
    engine.step = int(extra["step"])
    if engine._scheduler is not None and extra["scheduler"] is not None:
        engine._scheduler.load_state_dict(extra["scheduler"])
    rng_file = path / f"rng_rank{_rank()}.pt"
    if rng_file.is_file():
        rng = torch.load(rng_file, weights_only=False)
        torch.set_rng_state(rng["cpu"])
        if "cuda" in rng and torch.cuda.is_available():
            torch.cuda.set_rng_state(rng["cuda"])
    logger.info("loaded %s engine at step %d from %s", engine.config.role, engine.step, path)


def export_hf(engine: TorchEngine, path: Path) -> None:
    """Gather full weights on rank 0 and write an HF directory that from_pretrained loads."""
    from safetensors.torch import save_file

    rank = _rank()
    weights = {}
    for name, tensor in named_weights(engine.scorer):
        if rank == 0:
            weights[name] = tensor.to("cpu", copy=True).contiguous()
    if rank == 0:
        path.mkdir(parents=True, exist_ok=True)
        hf_model: Any = engine.scorer.model  # a transformers PreTrainedModel
        save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
        hf_model.config.save_pretrained(path)
        generation_config = getattr(hf_model, "generation_config", None)
        if generation_config is not None:
            generation_config.save_pretrained(path)
        _copy_tokenizer(engine.config.model_path, path)
        logger.info("exported %d tensors to %s", len(weights), path)
    _barrier()


def _copy_tokenizer(src: str, dst: Path) -> None:
    from transformers import AutoTokenizer

    try:
        AutoTokenizer.from_pretrained(src).save_pretrained(dst)
    except (OSError, ValueError) as e:
        logger.warning("no tokenizer copied from %s to %s: %s", src, dst, e)
    processor = Path(src) / "preprocessor_config.json"  # a vision-language model's images
    if processor.is_file():
        shutil.copyfile(processor, dst / processor.name)


def move(engine: TorchEngine, device: torch.device) -> None:
    """Move parameters, gradients and optimizer state to ``device`` (no-op on a CPU engine)."""
    if engine.device.type == "cpu":
        return
    engine.scorer.to(device)
    if engine._optimizer is not None:
        for state in engine._optimizer.state.values():
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and key != "step":
                    state[key] = value.to(device, non_blocking=True)
    if device.type == "cpu" and torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
