"""State of the Megatron engine: HF weights in and out, checkpoints, result broadcast, offload.

    load_hf_weights: *.safetensors -> convert.hf_to_megatron -> this (tp, pp) rank's slice
    named_weights:   local slice -> all-gather over TP -> broadcast over PP -> HF names
    save/load:       megatron.core.dist_checkpointing (model, reshardable) + per-rank fp32
                     master shards, Adam moments and RNG (same layout to resume)
    offload/onload:  DDP param/grad buffers and optimizer state storage freed / restored in place

Checkpoint layout of ``save(dir)``::

    dir/dist/           model weights (Megatron distributed checkpoint)
    dir/engine.pt       step (rank 0)
    dir/rank{r}.pt      rank r's optimizer shard (fp32 master weights, Adam moments) and RNG

Megatron's own optimizer checkpoint formats assume Apex/Transformer-Engine Adam (a single
``step``); with ``torch.optim.AdamW`` (no Apex) they fail to reload, so the optimizer shard is
saved per rank instead: resuming needs the same TP/PP/DP layout.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from agentrl.errors import ConfigError, TrainingError
from trainers.engines.megatron import convert
from trainers.engines.megatron.model import ModelShape

if TYPE_CHECKING:
    from trainers.engines.megatron.engine import MegatronConfig, MegatronEngine

logger = logging.getLogger(__name__)


def _read_hf(model_path: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(Path(model_path).glob("*.safetensors"))
    if not files:
        raise ConfigError(
            f"no *.safetensors in engine.model_path {model_path!r}; the megatron engine loads "
            "safetensors checkpoints (re-save the model with save_pretrained)"
        )
    out: dict[str, torch.Tensor] = {}
    for f in files:
        out.update(load_file(str(f)))
    return out


def load_hf_weights(
    model: Any, model_path: str, shape: ModelShape, parallel: MegatronConfig
) -> None:
    """Copy this rank's slice of the HF checkpoint into ``model`` (a stage's GPTModel)."""
    from megatron.core import parallel_state as ps

    tp = parallel.tensor_parallel_size
    padded = shape.padded_vocab(parallel.vocab_multiple * tp)
    full = convert.hf_to_megatron(_read_hf(model_path), shape, padded_vocab=padded)
    local = convert.local_state(
        full,
        shape,
        tp_rank=ps.get_tensor_model_parallel_rank(),
        tp_size=tp,
        pp_rank=ps.get_pipeline_model_parallel_rank(),
        pp_size=parallel.pipeline_parallel_size,
    )
    params = dict(model.named_parameters())
    missing = sorted(set(params) - set(local))
    if missing:
        raise TrainingError(f"converted checkpoint misses Megatron parameters {missing[:5]}")
    with torch.no_grad():
        for name, tensor in local.items():
            if name in params:
                params[name].copy_(tensor.to(params[name].dtype))


def _global_names(shape: ModelShape) -> Iterator[tuple[int, str, int | None, str]]:
    """(owning pp stage, global name, layer id or None, name inside the layer) in HF order."""
    from megatron.core import parallel_state as ps

    pp = ps.get_pipeline_model_parallel_world_size()
    yield 0, convert.EMBED, None, convert.EMBED
    for stage in range(pp):
        for i in convert.stage_layers(shape.num_layers, stage, pp):
            for name in convert.layer_names(shape):
                yield stage, convert.MG_LAYER.format(i=i) + name, i, name
    yield pp - 1, convert.FINAL_NORM, None, convert.FINAL_NORM
    if not shape.tie_embeddings:
        yield pp - 1, convert.OUTPUT, None, convert.OUTPUT


def _gather_tp(name: str, local: torch.Tensor) -> torch.Tensor:
    from megatron.core import parallel_state as ps

    size = ps.get_tensor_model_parallel_world_size()
    if size == 1 or convert._split_kind(name) == "replicated":
        return local
    parts = [torch.empty_like(local) for _ in range(size)]
    dist.all_gather(parts, local.contiguous(), group=ps.get_tensor_model_parallel_group())
    return convert.unshard(name, parts)


def _from_stage(stage: int, tensor: torch.Tensor | None, device: torch.device) -> torch.Tensor:
    """The owner stage's tensor on every stage of this pipeline (broadcast over PP).

    ``device``: where the stages that do not own it receive it (the model's device).
    """
    from megatron.core import parallel_state as ps

    if ps.get_pipeline_model_parallel_world_size() == 1:
        assert tensor is not None
        return tensor
    group = ps.get_pipeline_model_parallel_group()
    src = dist.get_global_rank(group, stage)
    meta = [None if tensor is None else (tuple(tensor.shape), tensor.dtype)]
    dist.broadcast_object_list(meta, src=src, group=group)
    shape, dtype = meta[0]  # type: ignore[misc]
    out = tensor if tensor is not None else torch.empty(shape, dtype=dtype, device=device)
    dist.broadcast(out, src=src, group=group)
    return out


def named_weights(model: Any, shape: ModelShape) -> Iterator[tuple[str, torch.Tensor]]:
    """Full HF-named tensors, one Megatron tensor at a time; every rank iterates."""
    from megatron.core import parallel_state as ps

    stage = ps.get_pipeline_model_parallel_rank()
    pp = ps.get_pipeline_model_parallel_world_size()
    local_ids = {i: n for n, i in enumerate(convert.stage_layers(shape.num_layers, stage, pp))}
    params = dict(model.named_parameters())
    device = next(iter(params.values())).device
    for owner, name, layer, inner in _global_names(shape):
        tensor = None
        if owner == stage:
            key = name if layer is None else convert.MG_LAYER.format(i=local_ids[layer]) + inner
            tensor = _gather_tp(name, params[key].detach())
        full = _from_stage(owner, tensor, device)
        if layer is not None:
            yield from convert.megatron_layer_to_hf(layer, inner, full, shape)
        elif name == convert.EMBED:
            yield "model.embed_tokens.weight", full[: shape.vocab_size]
        elif name == convert.FINAL_NORM:
            yield "model.norm.weight", full
        else:
            yield "lm_head.weight", full[: shape.vocab_size]


def broadcast_from_last_stage(tensor: torch.Tensor) -> None:
    from megatron.core import parallel_state as ps

    if ps.get_pipeline_model_parallel_world_size() == 1:
        return
    group = ps.get_pipeline_model_parallel_group()
    dist.broadcast(tensor, src=ps.get_pipeline_model_parallel_last_rank(), group=group)


def reduce_metrics(total: float, local: dict[str, float], device: torch.device) -> dict[str, float]:
    """train/loss summed over DP ranks, other metrics averaged; taken from the last PP stage."""
    from megatron.core import parallel_state as ps

    box: list[Any] = [(total, local)]
    if ps.get_pipeline_model_parallel_world_size() > 1:
        dist.broadcast_object_list(
            box,
            src=ps.get_pipeline_model_parallel_last_rank(),
            group=ps.get_pipeline_model_parallel_group(),
        )
    total, local = box[0]
    dp = ps.get_data_parallel_world_size()
    if dp == 1:
        return {"train/loss": total, **local}
    gathered: list[Any] = [None] * dp
    dist.all_gather_object(gathered, (total, local), group=ps.get_data_parallel_group())
    keys = sorted({k for _, g in gathered for k in g})
    merged = {
        k: sum(g[k] for _, g in gathered if k in g) / sum(k in g for _, g in gathered) for k in keys
    }
    return {"train/loss": sum(t for t, _ in gathered), **merged}


_CKPT_METADATA = {"singleton_local_shards": False}


def _torch_optimizers(engine: MegatronEngine) -> list[Any]:
    """The torch optimizers inside Megatron's (chained, distributed) optimizer."""
    opt = engine._optimizer
    if opt is None:
        return []
    inner = [getattr(o, "optimizer", None) for o in getattr(opt, "chained_optimizers", [opt])]
    return [o for o in inner if o is not None]


def _init_optimizer_state(engine: MegatronEngine) -> None:
    """Give a fresh optimizer its state tensors (and step) so saved values can be copied in.

    A zero-gradient step at lr 0 leaves the parameters and moments unchanged.
    """
    for torch_opt in _torch_optimizers(engine):
        params = [p for g in torch_opt.param_groups for p in g["params"]]
        if all(len(torch_opt.state[p]) for p in params):
            continue
        lrs = [g["lr"] for g in torch_opt.param_groups]
        for g in torch_opt.param_groups:
            g["lr"] = 0.0
        for p in params:
            p.grad = torch.zeros_like(p)
        torch_opt.step()
        torch_opt.zero_grad(set_to_none=True)
        for g, lr in zip(torch_opt.param_groups, lrs, strict=True):
            g["lr"] = lr


def _optimizer_state(engine: MegatronEngine) -> list[dict[str, Any]]:
    """This rank's fp32 master shards and Adam moments, per torch optimizer, on the CPU."""
    out = []
    for torch_opt in _torch_optimizers(engine):
        params = [p for g in torch_opt.param_groups for p in g["params"]]
        out.append(
            {
                "params": [p.detach().cpu() for p in params],
                "state": [
                    {
                        k: v.detach().cpu() if isinstance(v, torch.Tensor) else v
                        for k, v in torch_opt.state[p].items()
                    }
                    for p in params
                ],
            }
        )
    return out


def _restore_optimizer(engine: MegatronEngine, saved: list[dict[str, Any]]) -> None:
    _init_optimizer_state(engine)
    optimizers = _torch_optimizers(engine)
    if len(saved) != len(optimizers):
        raise TrainingError(
            f"checkpoint holds {len(saved)} optimizer(s), this engine has {len(optimizers)}; "
            "resume with the same parallel layout"
        )
    with torch.no_grad():
        for torch_opt, entry in zip(optimizers, saved, strict=True):
            params = [p for g in torch_opt.param_groups for p in g["params"]]
            if len(params) != len(entry["params"]):
                raise TrainingError("optimizer checkpoint does not match this parallel layout")
            for p, value, st in zip(params, entry["params"], entry["state"], strict=True):
                p.copy_(value)
                for k, v in st.items():
                    cur = torch_opt.state[p].get(k)
                    if isinstance(cur, torch.Tensor) and isinstance(v, torch.Tensor):
                        cur.copy_(v)
                    else:
                        torch_opt.state[p][k] = v


def save(engine: MegatronEngine, path: Path) -> None:
    from megatron.core import dist_checkpointing

    (path / "dist").mkdir(parents=True, exist_ok=True)
    model_sd = engine.model.sharded_state_dict(metadata=dict(_CKPT_METADATA))
    dist_checkpointing.save({"model": model_sd}, str(path / "dist"))
    rank = dist.get_rank()
    if rank == 0:
        torch.save({"step": engine.step, "role": engine.config.role}, path / "engine.pt")
    rng = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state()
    torch.save({"rng": rng, "optimizer": _optimizer_state(engine)}, path / f"rank{rank}.pt")
    dist.barrier()
    logger.info("saved megatron engine at step %d to %s", engine.step, path)


def load(engine: MegatronEngine, path: Path) -> None:
    from megatron.core import dist_checkpointing

    rank_file = path / f"rank{dist.get_rank()}.pt"
    if not (path / "engine.pt").is_file() or not rank_file.is_file():
        raise TrainingError(
            f"no engine checkpoint at {str(path)!r} (expected engine.pt, dist/ and "
            f"{rank_file.name}); pass a directory written by engine.save() with this layout"
        )
    model_sd = engine.model.sharded_state_dict(metadata=dict(_CKPT_METADATA))
    loaded = dist_checkpointing.load({"model": model_sd}, str(path / "dist"))
    engine.model.load_state_dict(loaded["model"], strict=False)
    extra = torch.load(rank_file, weights_only=False)
    if engine._optimizer is not None:
        _restore_optimizer(engine, extra["optimizer"])
    engine.step = int(torch.load(path / "engine.pt", weights_only=False)["step"])
    torch.set_rng_state(extra["rng"]["cpu"])
    if "cuda" in extra["rng"] and torch.cuda.is_available():
        torch.cuda.set_rng_state(extra["rng"]["cuda"])
    logger.info("loaded megatron engine at step %d from %s", engine.step, path)


def export_hf(engine: MegatronEngine, path: Path) -> None:
    """Gather full weights on rank 0 and write model.safetensors + config + tokenizer."""
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoTokenizer

    rank = dist.get_rank()
    weights = {}
    for name, tensor in engine.named_weights():
        if rank == 0:
            weights[name] = tensor.to("cpu", copy=True).contiguous()
    if rank == 0:
        path.mkdir(parents=True, exist_ok=True)
        save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
        AutoConfig.from_pretrained(engine.config.model_path).save_pretrained(path)
        try:
            AutoTokenizer.from_pretrained(engine.config.model_path).save_pretrained(path)
        except (OSError, ValueError) as e:
            logger.warning("no tokenizer copied to %s: %s", path, e)
    dist.barrier()


def _storages(engine: MegatronEngine) -> list[torch.Tensor]:
    """Tensors whose storage holds the engine's device memory (buffers, optimizer state)."""
    out: list[torch.Tensor] = []
    ddp = engine._ddp
    for buffer in getattr(ddp, "buffers", []):
        out += [t for t in (buffer.param_data, buffer.grad_data) if t is not None]
    if not out:
        out += [p.data for p in engine.model.parameters()]
    opt = engine._optimizer
    for inner in getattr(opt, "chained_optimizers", [opt]) if opt is not None else []:
        torch_opt = getattr(inner, "optimizer", None)
        if torch_opt is None:
            continue
        for group in torch_opt.param_groups:
            for p in group["params"]:
                out.append(p.data)
                out += [
                    v
                    for v in torch_opt.state.get(p, {}).values()
                    if isinstance(v, torch.Tensor) and v.device.type == "cuda"
                ]
    return [t for t in out if t.device.type == "cuda"]


def offload(engine: MegatronEngine) -> None:
    """Copy device storages to CPU and free them; views into them stay valid for ``onload``."""
    if engine.device.type != "cuda" or getattr(engine, "_offloaded", None):
        return
    saved = []
    seen: set[int] = set()
    for t in _storages(engine):
        storage = t.untyped_storage()
        if storage.data_ptr() in seen or storage.size() == 0:
            continue
        seen.add(storage.data_ptr())
        cpu = torch.empty(storage.size(), dtype=torch.uint8, pin_memory=True)
        cpu.untyped_storage().copy_(storage)
        saved.append((storage, cpu))
    torch.cuda.synchronize()
    for storage, _ in saved:
        storage.resize_(0)
    engine._offloaded = saved  # type: ignore[attr-defined]
    torch.cuda.empty_cache()


def onload(engine: MegatronEngine) -> None:
    saved = getattr(engine, "_offloaded", None)
    if not saved:
        return
    for storage, cpu in saved:
        storage.resize_(cpu.numel())
        storage.copy_(cpu.untyped_storage())
    torch.cuda.synchronize()
    engine._offloaded = None  # type: ignore[attr-defined]
