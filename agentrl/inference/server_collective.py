"""Collective weight updates on the embedded server: the trainer (rank 0) broadcasts, we receive.

SGLang's "update weights from distributed group" API, field for field ("SGLang for RL
Systems", https://github.com/sgl-project/sglang/blob/main/docs/advanced_features/sglang_for_rl.md,
rendered under docs.sglang.ai/advanced_features/):

    POST /init_weights_update_group {"master_address", "master_port", "rank_offset",
                                     "world_size", "group_name", "backend", "timeout_s"?}
        -> join_update_group(): TCPStore client at master_address:master_port -> the key
           prefixes of torch's ``_new_process_group_helper`` -> ProcessGroupGloo (cpu) or
           ProcessGroupNCCL (cuda) as rank ``rank_offset``; a group of its own, never the
           default one. Answers once every rank of the group, the trainer included, joined.
    POST /update_weights_from_distributed {"names", "dtypes", "shapes", "group_name",
                                           "flush_cache", "abort_all_requests", "weight_version"}
        -> check the request -> empty buffers (sent dtype and shape; engine device, CPU for
           gloo) -> receive rank 0's broadcasts in that order, in a worker thread (decoding and
           /health go on) -> between two decode steps copy the bucket into the model (cast
           to its dtype) and set the version when ``weight_version`` is given
    POST /destroy_weights_update_group {"group_name"}

Rank 0 must broadcast exactly the tensors the request names: a receive of another size kills
a gloo process, so every call either receives all of them or drops the group. Behaviour:
- Each call applies its own bucket (SGLang's semantics), so between the buckets of one push
  requests decode on partly new weights, still tagged with the old version; pause generation
  around a multi-bucket push (or send one bucket) when that matters. Without
  ``weight_version`` the version is unchanged (as SGLang); with it, tokens decoded afterwards
  carry it (``output_token_weight_versions``). ``flush_cache`` is accepted (a version change drops the
  prefix pool anyway).
- Unknown names or shapes unlike the model's: the bucket is still received (the group stays
  in step) and discarded; 400 naming the tensors, the model unchanged.
- A malformed request (unreadable body, lengths differ, unknown dtype, negative size, bad
  ``weight_version``, a ``load_format``): 400 without receiving; the group it names is dropped
  (rank 0's broadcasts of that call are never received), re-initialise it. Update before
  init, or of an unknown group: 400.
- No broadcast within ``timeout_s`` (or the trainer went away): 500, the group is dropped; the
  server keeps serving on its current weights.
- Init of a group name that exists replaces that group (SGLang's model runner overwrites it
  too), so a restarted trainer re-initialises without a destroy. Destroy of an unknown group: 400.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
from fastapi import FastAPI, Request, Response
from pydantic import BaseModel, ConfigDict

from agentrl.errors import ConfigError
from agentrl.http import json_response, parse_body
from agentrl.inference.responses import parse_version, update_failure

if TYPE_CHECKING:
    from agentrl.inference.server import ServerState

logger = logging.getLogger(__name__)
Apply = Callable[[dict[str, torch.Tensor], int | None, bool], Awaitable[int]]
"""(tensors, version or None to keep it, abort in-flight requests first) -> the new version."""


@dataclass(kw_only=True)
class UpdateGroup:
    """One joined weights-update group: the process group and the store that keeps it alive."""

    name: str
    rank: int
    world_size: int
    backend: str
    pg: Any  # ProcessGroupGloo | ProcessGroupNCCL
    store: Any  # the TCPStore (rank 0: its server)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def close(self) -> None:
        """Abort and drop the group (its sockets close; a peer's pending op fails)."""
        try:
            self.pg.abort()
        except Exception:  # already broken: nothing left to release
            logger.debug("abort of group %s failed", self.name, exc_info=True)
        self.pg = self.store = None


def join_update_group(
    *,
    address: str,
    port: int,
    rank: int,
    world_size: int,
    group_name: str,
    backend: str,
    timeout_s: float,
    listen_fd: int | None = None,
) -> UpdateGroup:
    """Join (rank 0: create, serving the store on ``listen_fd``) the group ``group_name``.
    Store keys are laid out as torch's ``_new_process_group_helper`` lays them out (SGLang
    joins through it), so either side may be a real SGLang server. Blocks until all joined."""
    from torch.distributed import PrefixStore, TCPStore

    timeout = timedelta(seconds=timeout_s)
    store = TCPStore(
        address, port, world_size, is_master=rank == 0, timeout=timeout, master_listen_fd=listen_fd
    )
    device = "cuda" if backend == "nccl" else "cpu"
    keys = PrefixStore(f"{device}/", PrefixStore(f"{group_name}/", PrefixStore(group_name, store)))
    pg: Any
    if backend == "nccl":
        from torch.distributed import ProcessGroupNCCL  # CUDA builds of torch only

        nccl = ProcessGroupNCCL.Options()
        nccl._timeout = timeout
        pg = ProcessGroupNCCL(keys, rank, world_size, nccl)
    else:
        from torch.distributed import ProcessGroupGloo

        gloo = ProcessGroupGloo._Options()  # type: ignore[attr-defined]
        gloo._timeout = timeout
        gloo._devices = [ProcessGroupGloo.create_device(hostname=local_address(address))]
        pg = ProcessGroupGloo(keys, rank, world_size, gloo)
    return UpdateGroup(
        name=group_name, rank=rank, world_size=world_size, backend=backend, pg=pg, store=store
    )


def local_address(peer: str) -> str:
    """This machine's address on the route to ``peer`` (loopback for a loopback peer)."""
    try:
        family, kind, _, _, addr = socket.getaddrinfo(peer, 9, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, kind) as s:
            s.connect(addr)
            return str(s.getsockname()[0])
    except OSError:
        return peer


class InitGroupRequest(BaseModel):
    """SGLang's ``InitWeightsUpdateGroupReqInput`` (+ ``timeout_s``, this server's own)."""

    model_config = ConfigDict(extra="ignore")
    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    group_name: str = "weight_update_group"
    backend: str = "nccl"
    timeout_s: float = 600.0
    """Longest wait to join, and for each broadcast of an update."""


class UpdateDistributedRequest(BaseModel):
    """SGLang's ``UpdateWeightsFromDistributedReqInput``."""

    model_config = ConfigDict(extra="ignore")
    names: list[str]
    dtypes: list[str]
    shapes: list[list[int]]
    group_name: str = "weight_update_group"
    flush_cache: bool = True
    abort_all_requests: bool = False
    weight_version: int | str | None = None
    load_format: str | None = None


class DestroyGroupRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    group_name: str = "weight_update_group"


def receive_plan(req: UpdateDistributedRequest) -> list[tuple[str, torch.dtype, list[int]]]:
    """(name, dtype, shape) per tensor rank 0 broadcasts; ConfigError if malformed."""
    if req.load_format is not None:
        raise ConfigError(
            f"load_format {req.load_format!r} is not supported by the embedded server; "
            "broadcast each tensor (load_format null)."
        )
    if not req.names or not len(req.names) == len(req.dtypes) == len(req.shapes):
        raise ConfigError(
            f"names, dtypes and shapes must be non-empty lists of one length; got "
            f"{len(req.names)}, {len(req.dtypes)} and {len(req.shapes)}."
        )
    plan = []
    for name, dtype_name, shape in zip(req.names, req.dtypes, req.shapes, strict=True):
        dtype = getattr(torch, dtype_name.removeprefix("torch."), None)
        if not isinstance(dtype, torch.dtype):
            raise ConfigError(
                f"dtype {dtype_name!r} of {name!r} is not a torch dtype; send names such as "
                "float32 or bfloat16."
            )
        if any(d < 0 for d in shape):
            raise ConfigError(f"shape {shape} of {name!r} has a negative size.")
        plan.append((name, dtype, shape))
    return plan


def model_mismatch(
    plan: list[tuple[str, torch.dtype, list[int]]], model: Mapping[str, torch.Tensor]
) -> str | None:
    """Why the bucket cannot go into the model (unknown names, other shapes), or None."""
    unknown = [n for n, _, _ in plan if n not in model]
    if unknown:
        return (
            f"{len(unknown)} tensor name(s) not in the served model, e.g. {unknown[:3]}; "
            f"expected state_dict names such as {sorted(model)[:3]}."
        )
    bad = [
        f"{n}: got {tuple(s)}, expected {tuple(model[n].shape)}"
        for n, _, s in plan
        if tuple(s) != tuple(model[n].shape)
    ]
    if bad:
        return (
            f"shape mismatch for {len(bad)} tensor(s): {'; '.join(bad[:3])}. "
            "The weights come from a different model configuration."
        )
    return None


def receive(
    group: UpdateGroup, plan: list[tuple[str, torch.dtype, list[int]]], device: torch.device
) -> dict[str, torch.Tensor]:
    """Post every receive of the bucket in order, then wait for all (a worker thread)."""
    out: dict[str, torch.Tensor] = {}
    works = []
    for name, dtype, shape in plan:
        buf = torch.empty(shape, dtype=dtype, device=device)
        works.append(group.pg.broadcast(buf, 0))
        out[name] = buf
    for work in works:
        work.wait()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return out


def add_collective_routes(
    app: FastAPI, state: ServerState, apply: Apply, model: Mapping[str, torch.Tensor]
) -> None:
    """Register the three endpoints. ``apply`` copies a bucket into the model between steps
    (``server_weights``); ``model`` is the served state_dict (names and shapes)."""
    engine = state.engine
    groups: dict[str, UpdateGroup] = {}
    joining = asyncio.Lock()

    def drop(name: str) -> None:
        group = groups.pop(name, None)
        if group is not None:
            group.close()

    @app.post("/init_weights_update_group")
    async def init_weights_update_group(request: Request) -> Response:
        try:
            req = parse_body(InitGroupRequest, await request.body())
            backend = check_init(req, str(engine.cfg.device))
        except ConfigError as exc:
            return update_failure(str(exc))
        async with joining:
            drop(req.group_name)  # re-init replaces the group of that name
            try:
                group = await asyncio.to_thread(
                    join_update_group,
                    address=req.master_address,
                    port=req.master_port,
                    rank=req.rank_offset,
                    world_size=req.world_size,
                    group_name=req.group_name,
                    backend=backend,
                    timeout_s=req.timeout_s,
                )
            except Exception as exc:  # store or group failed: nothing was registered
                return update_failure(
                    f"Failed to initialize weights update group {req.group_name!r}: {exc}"
                )
            groups[req.group_name] = group
        logger.info(
            "joined weights update group %s as rank %d of %d (%s)",
            req.group_name,
            req.rank_offset,
            req.world_size,
            backend,
        )
        return json_response(
            {
                "success": True,
                "message": f"joined {req.group_name!r} as rank "
                f"{req.rank_offset} of {req.world_size} ({backend})",
            }
        )

    def refuse(message: str, name: str) -> Response:
        """400 for an update whose broadcasts will not be received: the group is out of step."""
        if name in groups:
            drop(name)
            message += (
                f" Nothing was received, so the group {name!r} was dropped; "
                "POST /init_weights_update_group again."
            )
        return update_failure(message)

    @app.post("/update_weights_from_distributed")
    async def update_weights_from_distributed(request: Request) -> Response:
        body = await request.body()
        try:
            req = parse_body(UpdateDistributedRequest, body)
        except ConfigError as exc:
            return refuse(str(exc), _group_of(body))
        group = groups.get(req.group_name)
        if group is None:
            return update_failure(
                f"no weights update group {req.group_name!r} (known: {sorted(groups)}); "
                "POST /init_weights_update_group first."
            )
        try:
            version = parse_version(req.weight_version)
            plan = receive_plan(req)
        except ConfigError as exc:
            return refuse(str(exc), req.group_name)
        wrong = model_mismatch(plan, model)
        device = torch.device(engine.cfg.device if group.backend == "nccl" else "cpu")
        async with group.lock:
            try:
                named = await asyncio.to_thread(receive, group, plan, device)
            except Exception as exc:  # timeout, or rank 0 went away: the group is out of step
                if groups.get(req.group_name) is group:
                    drop(req.group_name)
                return update_failure(
                    f"receiving {len(plan)} tensor(s) from rank 0 of "
                    f"{req.group_name!r} failed ({exc}); the group was dropped and "
                    "the weights are unchanged: POST /init_weights_update_group "
                    "again.",
                    500,
                )
        if wrong is not None:
            return update_failure(
                f"{wrong} The bucket was received and discarded; nothing was applied."
            )
        new = await apply(named, version, req.abort_all_requests)
        return json_response(
            {"success": True, "message": f"applied {len(named)} tensors", "weight_version": new}
        )

    @app.post("/destroy_weights_update_group")
    async def destroy_weights_update_group(request: Request) -> Response:
        try:
            req = parse_body(DestroyGroupRequest, await request.body())
        except ConfigError as exc:
            return update_failure(str(exc))
        if req.group_name not in groups:
            return update_failure(
                f"no weights update group {req.group_name!r} to destroy (known: {sorted(groups)})."
            )
        drop(req.group_name)
        return json_response({"success": True, "message": f"destroyed {req.group_name!r}"})

    def close_groups() -> None:
        for name in list(groups):
            drop(name)

    app.router.on_shutdown.append(close_groups)


def _group_of(body: bytes) -> str:
    """The group an unreadable update names (its default when none can be read)."""
    try:
        name = json.loads(body).get("group_name", "weight_update_group")
    except (ValueError, AttributeError):
        return "weight_update_group"
    return name if isinstance(name, str) else "weight_update_group"


def check_init(req: InitGroupRequest, device: str) -> str:
    """The backend to join with; ConfigError when the request cannot work here."""
    backend = req.backend.lower()
    if backend not in ("gloo", "nccl"):
        raise ConfigError(f"backend {req.backend!r} is not supported; use gloo or nccl.")
    if backend == "nccl" and not device.startswith("cuda"):
        raise ConfigError(
            f"backend nccl needs a CUDA server; this one runs on {device}: use backend gloo."
        )
    if not 0 < req.rank_offset < req.world_size:
        raise ConfigError(
            f"rank_offset {req.rank_offset} must be in [1, world_size={req.world_size}): "
            "rank 0 is the trainer that broadcasts."
        )
    if not req.group_name:
        raise ConfigError("group_name must not be empty.")
    if req.timeout_s <= 0:
        raise ConfigError(f"timeout_s must be > 0, got {req.timeout_s}.")
    return backend
