"""One rank of the two-process tensor-parallel CPU test (spawned by test_tensor_parallel_cpu)."""

from __future__ import annotations

import sys
from pathlib import Path


def run(rank: int, port: int, model_path: str, out_dir: str) -> None:
    here = Path(__file__).resolve().parent
    sys.path[:0] = [str(here), str(here.parent / "trainers")]
    import conftest  # noqa: F401  (the Triton-kernel stub, when Triton is missing)
    import torch
    import torch.distributed as dist
    from test_torch_engine import make_batch

    from agentrl.distributed.rendezvous import init_process_group_bound
    from agentrl.engine import EngineConfig
    from trainers.engines import ENGINES
    from trainers.engines.megatron.engine import MegatronConfig

    init_process_group_bound(
        backend="gloo", master_addr="127.0.0.1", master_port=port, rank=rank, world_size=2
    )
    if not torch.cuda.is_available():
        torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment,return-value]
    cfg = EngineConfig(model_path=model_path, device="cpu", role="ref", micro_batch_size=2)
    engine = ENGINES.make("megatron", config=cfg, options=MegatronConfig(tensor_parallel_size=2))
    engine.initialize()
    logprobs, entropy = engine.compute_logprobs(make_batch(), with_entropy=True)
    weights = dict(engine.named_weights())
    local = {n: p.detach().clone() for n, p in engine.model.named_parameters()}
    torch.save(
        {
            "logprobs": logprobs,
            "entropy": entropy,
            "weights": weights,
            "local": local,
            **_vocab_parallel_grad(rank),
        },
        Path(out_dir) / f"rank{rank}.pt",
    )
    dist.destroy_process_group()


def _vocab_parallel_grad(rank: int) -> dict[str, object]:
    """Gradient of sum(logprob + entropy) w.r.t. replicated hidden states, this rank's vocab half."""
    import torch

    from trainers.engines.megatron.logprobs import vocab_parallel_logprobs

    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(6, 8, generator=gen).requires_grad_(True)
    weight = torch.randn(16, 8, generator=gen)  # padded vocab 16, true vocab 13
    targets = torch.tensor([0, 3, 7, 8, 12, 5])
    logp, ent = vocab_parallel_logprobs(
        hidden,
        weight.chunk(2)[rank],
        targets,
        true_vocab=13,
        tp_rank=rank,
        tp_size=2,
        with_entropy=True,
        chunk_tokens=4,
    )
    assert ent is not None
    (logp.sum() + ent.sum()).backward()
    assert hidden.grad is not None
    return {"vp_logp": logp.detach(), "vp_grad": hidden.grad.detach()}
