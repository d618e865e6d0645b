"""One rank of the two-process LeanStep test (spawned by test_lean_step.py): DP=2 or TP=2."""

from __future__ import annotations

import sys
from pathlib import Path


def run(rank: int, port: int, model_path: str, out_dir: str, tp: int) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import conftest  # noqa: F401  (the Triton-kernel stub, when Triton is missing)
    import torch
    import torch.distributed as dist
    from cpu_optim import build, cuda_on_cpu, params
    from megatron.core import parallel_state
    from test_lean_step import _steps

    from agentrl.distributed.rendezvous import init_process_group_bound

    init_process_group_bound(
        backend="gloo", master_addr="127.0.0.1", master_port=port, rank=rank, world_size=2
    )
    with cuda_on_cpu():
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
        start = params(build(model_path, clip=0.5, tp=tp)[0])
        first = 10 * rank if tp == 1 else 0  # DP: each rank its own batches; TP: the same ones
        seeds = range(first, first + 3)
        ours, theirs, norms = _steps(Path(model_path), 0.5, seeds, tp=tp)
    torch.save(
        {"ours": ours, "theirs": theirs, "norms": norms, "start": start},
        Path(out_dir) / f"rank{rank}.pt",
    )
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()
