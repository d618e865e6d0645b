"""One rank of the two-process tensor-parallel CPU test (spawned by test_tensor_parallel_cpu)."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def run(rank: int, port: int, model_path: str, out_dir: str) -> None:
    here = Path(__file__).resolve().parent
    sys.path[:0] = [str(here), str(here.parent / "trainers")]
    import conftest  # noqa: F401  (the Triton-kernel stub, when Triton is missing)
    import torch
    import torch.distributed as dist
    from test_torch_engine import make_batch

    from agentrl.engine import EngineConfig
    from trainers.engines import ENGINES
    from trainers.engines.megatron.engine import MegatronConfig

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    if not torch.cuda.is_available():
        torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment,return-value]
    cfg = EngineConfig(model_path=model_path, device="cpu", role="ref", micro_batch_size=2)
    engine = ENGINES.make("megatron", config=cfg, parallel=MegatronConfig(tensor_parallel_size=2))
    engine.initialize()
    logprobs, entropy = engine.compute_logprobs(make_batch(), with_entropy=True)
    weights = dict(engine.named_weights())
    local = {n: p.detach().clone() for n, p in engine.model.named_parameters()}
    torch.save(
        {"logprobs": logprobs, "entropy": entropy, "weights": weights, "local": local},
        Path(out_dir) / f"rank{rank}.pt",
    )
    dist.destroy_process_group()
