"""One rank of the two-process pipeline-parallel CPU test (spawned by test_pipeline_cpu).

Each rank builds the Megatron engine with PP=2 (one decoder layer per stage) and runs the
asked steps in order, saving each step's result to ``out_dir/rank{r}_{step}.pt`` as soon as
it has it; a step that raises ends the process (the spawner then stops the other rank, which
would otherwise wait in a collective), so the steps before it are still on disk.

    logprobs: padded compute_logprobs(with_entropy=True), this stage's parameters
    weights:  named_weights() (full HF tensors) and export_hf(out_dir/export)
    packed:   packed (THD) compute_logprobs(with_entropy=True)
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any


def _cpu_shims() -> None:
    """Megatron's CUDA calls answered on CPU (tests only): p2p buffers, syncs, tied embeddings.

    The pipeline schedule allocates its p2p buffers on ``torch.cuda.current_device()``, its
    token counter with ``torch.zeros(..., device="cuda")`` and synchronises CUDA after batched
    p2p; with tied embeddings the last stage's output-layer copy is all-reduced from the first
    stage after ``weight.data.cuda()``.
    """
    import types

    import torch
    from megatron.core.pipeline_parallel import schedules

    if torch.cuda.is_available():
        return

    class _CpuTorch(types.ModuleType):
        def __getattr__(self, name: str) -> Any:
            return getattr(torch, name)

        @staticmethod
        def zeros(*args: Any, device: Any = None, **kw: Any) -> torch.Tensor:
            return torch.zeros(*args, device="cpu" if device == "cuda" else device, **kw)

    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment,return-value]
    torch.cuda.synchronize = lambda *args: None  # type: ignore[assignment]
    torch.Tensor.cuda = lambda self, *args, **kw: self  # type: ignore[method-assign,assignment]
    schedules.torch = _CpuTorch("torch")  # type: ignore[attr-defined]


def run(rank: int, port: int, model_path: str, out_dir: str, steps: tuple[str, ...]) -> None:
    here = Path(__file__).resolve().parent
    sys.path[:0] = [str(here), str(here.parent / "trainers")]
    import conftest  # noqa: F401  (the Triton-kernel stub, when Triton is missing)
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from test_torch_engine import make_batch

    from agentrl.distributed.rendezvous import init_process_group_bound
    from agentrl.engine import EngineConfig
    from trainers.engines import ENGINES
    from trainers.engines.megatron.engine import MegatronConfig

    init_process_group_bound(
        backend="gloo", master_addr="127.0.0.1", master_port=port, rank=rank, world_size=2
    )
    _cpu_shims()
    engines: dict[bool, Any] = {}

    def engine(packed: bool) -> Any:
        if packed not in engines:
            cfg = EngineConfig(
                model_path=model_path, device="cpu", role="ref", micro_batch_size=2, packed=packed
            )
            parallel = MegatronConfig(pipeline_parallel_size=2)
            engines[packed] = ENGINES.make("megatron", config=cfg, options=parallel)
            engines[packed].initialize()
        return engines[packed]

    for step in steps:
        out: dict[str, Any]
        if step in ("logprobs", "packed"):
            e = engine(step == "packed")
            logprobs, entropy = e.compute_logprobs(make_batch(), with_entropy=True)
            out = {"logprobs": logprobs, "entropy": entropy}
            out["stage"] = (ps.is_pipeline_first_stage(), ps.is_pipeline_last_stage())
            out["local"] = {n: p.detach().clone() for n, p in e.model.named_parameters()}
        else:
            e = engine(False)
            out = {"weights": {n: t.clone() for n, t in e.named_weights()}}
            e.export_hf(Path(out_dir) / "export")
        torch.save(out, Path(out_dir) / f"rank{rank}_{step}.pt")
    dist.destroy_process_group()
