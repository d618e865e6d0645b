"""A lean optimizer step over Megatron's distributed optimizer: same state, far less host work.

Without Apex or Transformer Engine, Megatron's optimizer step spends most of its time on the
host, with the GPU idle:

- its grad-norm fallback (``local_multi_tensor_l2_norm``) turns every parameter's norm into a
  Python float, one device sync per parameter;
- gradient clipping launches a multiply and a copy per parameter;
- copying the model's gradients to the fp32 master shards looks up each parameter's ranges in
  several dicts, every step.

``LeanStep`` keeps Megatron's optimizer objects (master shards, Adam state, checkpoints,
offload all unchanged) and replaces only the part before Adam:

    DDP fp32 grad buffer --(views cached once)--> .grad of each fp32 master shard
        -> one foreach norm over the shards that count (not shared, not a TP replica)
        -> all-reduce over the grad-stats group
        -> clip with one foreach multiply (by a device scalar: min(1, clip / norm))
        -> torch AdamW on the master shards -> one foreach copy into the bf16 param buffer
        -> (data parallel > 1) Megatron's all-gather of the updated param buffer

With torch's fused AdamW (the engine's default) nothing waits for the norm: a zero or
non-finite norm sets the fused kernel's ``found_inf`` flag on the device, and the kernel then
leaves weights, moments and step count alone. The norm is copied to the host as soon as it is
known and read after the whole update is queued, so the GPU never idles while the host decides.
Without the fused kernel the norm is read first (one device sync) and the update is skipped on
the host.

The gradient views stay attached between steps: DDP's ``zero_grad_buffer`` zeroes the buffer
they look into, so the optimizer's own ``zero_grad`` (another walk over every parameter) is
not needed.

It applies to the distributed optimizer with bf16 or fp32 params (no loss scaler, no
precision-aware or FSDP variants, no separate grad-norm groups); ``LeanStep.unsupported``
says why when it does not, and the engine then keeps Megatron's own step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from trainers.engines.readback import HostCopy


@dataclass(frozen=True)
class _Shard:
    """One parameter's slice of this rank's master weights and where its gradient lives."""

    model_param: torch.nn.Parameter
    start: int
    end: int
    main_param: torch.Tensor  # fp32 master shard (the torch optimizer's parameter)
    model_shard: torch.Tensor  # this rank's slice of the param buffer the model reads


def _inner(optimizer: Any) -> list[Any]:
    """The DistributedOptimizers inside ``optimizer``, without stubs (ranks with no params)."""
    inner = list(getattr(optimizer, "chained_optimizers", None) or [optimizer])
    return [o for o in inner if not getattr(o, "is_stub_optimizer", False)]


def unsupported(optimizer: Any) -> str | None:
    """Why ``LeanStep`` cannot drive ``optimizer`` (None when it can)."""
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer
    from megatron.core.optimizer.optimizer import SEPARATE_GRAD_NORM_GROUPS

    for opt in _inner(optimizer):
        if not isinstance(opt, DistributedOptimizer):
            return f"{type(opt).__name__} is not Megatron's DistributedOptimizer"
        c = opt.config
        if opt.grad_scaler is not None:
            return "a loss scaler is in use (fp16)"
        if c.use_precision_aware_optimizer or opt.ddp_config.use_megatron_fsdp:
            return "precision-aware optimizer or Megatron-FSDP"
        if opt.ddp_config.fp8_param_gather or getattr(opt.ddp_config, "fp4_param_gather", False):
            return "low-precision parameter gather"
    if any(optimizer.has_grad_norm_group(g) for g in SEPARATE_GRAD_NORM_GROUPS):
        return "parameters in separate grad-norm groups"
    return None


class LeanStep:
    """Clip and step a Megatron DistributedOptimizer without stopping the GPU's queue.

    step = LeanStep(optimizer, clip_grad=1.0)   # once, after get_megatron_optimizer
    stepped, grad_norm, reason = step()         # reason: None, "zero_grad" or "nonfinite_grad"
    ddp.zero_grad_buffer()                      # and no optimizer.zero_grad()
    """

    def __init__(self, optimizer: Any, clip_grad: float) -> None:
        self.optimizer = optimizer
        self.clip_grad = clip_grad
        self.shards: list[_Shard] = []
        for opt in _inner(optimizer):
            groups = [
                (opt.model_float16_groups, opt.shard_fp32_from_float16_groups),
                (opt.model_fp32_groups, opt.shard_fp32_groups),
            ]
            for model_groups, main_groups in groups:
                for model_group, main_group in zip(model_groups, main_groups, strict=True):
                    for model_param, main_param in zip(model_group, main_group, strict=True):
                        self.shards.append(_shard(opt, model_param, main_param))
        self.group = optimizer.get_grad_stats_parallel_group()  # also on a stub-only rank
        self._for_norm: list[int] | None = None  # indices into shards, found at the first step
        self._grads: list[torch.Tensor] | None = None

    def _attach_grads(self) -> list[torch.Tensor]:
        """Each master shard's .grad: a view of the fp32 grad buffer (attached once)."""
        if self._grads is not None and all(
            s.main_param.grad is g for s, g in zip(self.shards, self._grads, strict=True)
        ):
            return self._grads
        grads = []
        for s in self.shards:
            g = s.model_param.main_grad.view(-1)[s.start : s.end]  # type: ignore[attr-defined]
            s.main_param.grad = g if g.dtype == torch.float32 else g.float()
            grads.append(s.main_param.grad)
        views = all(g.dtype == torch.float32 for g in grads)
        self._grads = grads if views else None  # copies (non-fp32 buffers) are made every step
        return grads

    def _update(self, found_inf: torch.Tensor | None = None) -> None:
        """AdamW on the master shards, copy them into the param buffer, gather it over DP.

        ``found_inf`` (fused Adam only): a device flag; when 1 the kernel changes nothing.
        """
        for opt in _inner(self.optimizer):
            inner = opt.optimizer
            inner.found_inf = found_inf  # read by torch's fused Adam; None: no device skip
            try:
                inner.step()
            finally:
                del inner.found_inf
        if self.shards:
            torch._foreach_copy_(
                [s.model_shard for s in self.shards], [s.main_param for s in self.shards]
            )
        for opt in _inner(self.optimizer):
            if dist.get_world_size(opt.data_parallel_group) > 1:
                opt.start_param_sync_for_bucket_group_subset()

    def _norm_indices(self) -> list[int]:
        """Which shards count toward the norm: Megatron's own filter, asked once."""
        counted: set[int] = set()
        for opt in _inner(self.optimizer):
            counted |= {id(g) for g in opt.get_grads_for_grad_norm()}
        return [i for i, s in enumerate(self.shards) if id(s.main_param.grad) in counted]

    def skips_on_device(self) -> bool:
        """Whether every inner optimizer is torch's fused Adam, which reads ``found_inf``."""
        return bool(self.shards) and all(
            isinstance(opt.optimizer, torch.optim.Adam | torch.optim.AdamW)
            and all(g.get("fused") for g in opt.optimizer.param_groups)
            for opt in _inner(self.optimizer)
        )

    def _sum_of_squares(self, grads: list[torch.Tensor]) -> torch.Tensor:
        """Squared L2 norm over every rank's counted shards, on the device (one all-reduce)."""
        if self._for_norm is None:
            self._for_norm = self._norm_indices()
        counted = [grads[i] for i in self._for_norm]
        # a rank may own no shard at all (many DP ranks, small model): it still joins the reduce
        device = grads[0].device if grads else _collective_device()
        total = torch.zeros((), dtype=torch.float32, device=device)
        if counted:
            norms = torch._foreach_norm(counted)
            total = torch.linalg.vector_norm(torch.stack(norms)).square()
        if self.group is not None and dist.get_world_size(self.group) > 1:
            dist.all_reduce(total, group=self.group)
        return total

    def grad_norm(self, grads: list[torch.Tensor]) -> float:
        """The global grad norm as a float (waits for it)."""
        return math.sqrt(float(self._sum_of_squares(grads)))

    def __call__(self) -> tuple[bool, float, str | None]:
        grads = self._attach_grads()
        if not self.skips_on_device():
            return self._step_on_host(grads)
        # in float64, as the host path and Megatron compute it: the same clip factor to the bit
        norm = self._sum_of_squares(grads).double().sqrt()
        host_norm = HostCopy(norm)  # read once the update is queued
        found_inf = (~torch.isfinite(norm) | (norm == 0)).float()
        if self.clip_grad > 0:
            # Megatron's rule, min(1, clip / (norm + 1e-6)); times 1.0 leaves a gradient as it is
            coeff = (self.clip_grad / (norm + 1e-6)).clamp(max=1.0)
            torch._foreach_mul_(grads, coeff.float())
        self._update(found_inf)
        value = float(host_norm.get())
        reason = _skip_reason(value)
        return reason is None, value, reason

    def _step_on_host(self, grads: list[torch.Tensor]) -> tuple[bool, float, str | None]:
        """Read the norm first (one sync), then skip or clip and update."""
        norm = self.grad_norm(grads)
        reason = _skip_reason(norm)
        if reason is not None:
            return False, norm, reason
        coeff = self.clip_grad / (norm + 1e-6)
        if self.clip_grad > 0 and coeff < 1.0 and grads:
            torch._foreach_mul_(grads, coeff)
        self._update()
        return True, norm, None


def _skip_reason(norm: float) -> str | None:
    if not math.isfinite(norm):
        return "nonfinite_grad"
    if norm == 0.0:
        return "zero_grad"
    return None


def _collective_device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _shard(opt: Any, model_param: torch.nn.Parameter, main_param: torch.Tensor) -> _Shard:
    """Where ``model_param``'s gradient slice and its param-buffer slice are, for this rank."""
    ranges = opt._get_model_param_range_map(model_param)
    grad, world = ranges["param"], ranges["gbuf_world_in_bucket"]
    gbuf_index, _, bucket_id = opt.model_param_gbuf_map[model_param]
    buffer = opt.buffers[gbuf_index].buckets[bucket_id].param_data
    model_shard = buffer.view(-1)[world.start : world.end]
    return _Shard(model_param, grad.start, grad.end, main_param, model_shard)
