"""Control and weight-sync endpoints of the embedded server.

    POST /update_weights_from_disk  {"model_path", "weight_version"?, "abort_all_requests"?}
    POST /update_weights_from_tensor?flush=1&weight_version=N   body: safetensors bytes
    POST /update_weights_from_ipc  {"path", "buckets": [[offset, length], ...], "weight_version"?}
    GET  /weights_checksum[?per_tensor=0&kind=sha256|sum64]   GET /get_weight_version
    POST /init_weights_update_group, /update_weights_from_distributed,
         /destroy_weights_update_group   (a broadcast from the trainer: server_collective.py)
    POST /pause_generation {"mode"}   POST /continue_generation   POST /abort_request {"rid", "abort_all"}
    GET  /health   GET /health_generate   GET /get_model_info   GET /get_server_info   /flush_cache

Tensor updates over HTTP (the exact protocol):
1. The trainer serializes its tensors with ``weights.safetensors_buckets(named, bucket_bytes)``.
2. Each bucket but the last is POSTed with ``flush=0``: the server checks names and shapes
   against the served model (400 naming the bad tensors otherwise) and *stages* the tensors.
3. The last bucket (or an empty body) is POSTed with ``flush=1`` and optionally
   ``weight_version=N``: between two decode steps the server copies every staged tensor into
   the model, sets the version to N (or bumps it by one) and clears the stage. A model is
   therefore never served half-updated. ``abort_all_requests=1`` aborts in-flight requests first.
   (``HTTPTensorWeightSync`` streams each bucket from the tensors' memory; ``read_body``
   receives it into one buffer of its Content-Length.)
4. ``GET /weights_checksum`` returns a checksum per tensor and overall
   (``weights.checksum_named_tensors``: SHA-256 by default, ``kind=sum64`` for the fast word
   sum that ``WeightSync.verify`` asks for), computed between two decode steps from the
   weights the model holds now; the trainer compares it with its own.
Shared memory on one machine: ``POST /update_weights_from_ipc`` names a file (a trainer's memfd
as ``/proc/PID/fd/N``) and the (offset, length) of each safetensors blob in it; the server maps
it read-only, checks names, shapes and completeness, copies everything into the model in one
step with the version, and drops the mapping (``weight_sync/ipc.py``).
Weights go into the model between steps; running requests continue on the new weights and
their later tokens are tagged with the new version (``output_token_weight_versions``).
"""

from __future__ import annotations

import asyncio
import uuid
from typing import TYPE_CHECKING, Literal

import torch
from fastapi import FastAPI, Request, Response
from pydantic import BaseModel, ConfigDict

from agentrl import heap
from agentrl.errors import ConfigError
from agentrl.http import json_response, parse_body
from agentrl.inference.responses import error_response, parse_version, update_failure
from agentrl.inference.runner_types import RequestParams
from agentrl.inference.server_collective import add_collective_routes
from agentrl.inference.weights import (
    CHECKSUM_KINDS,
    ChecksumKind,
    apply_named_tensors,
    checksum_named_tensors,
    load_named_tensors,
    load_safetensors_bytes,
    map_shared_buckets,
    require_complete,
    validate_named_tensors,
)

if TYPE_CHECKING:
    from agentrl.inference.server import ServerState


class UpdateFromDiskRequest(BaseModel):
    """SGLang's ``UpdateWeightFromDiskReqInput`` (fields the embedded server uses, plus tolerated ones)."""

    model_config = ConfigDict(extra="ignore")
    model_path: str
    weight_version: int | str | None = None
    abort_all_requests: bool = False
    load_format: str | None = None
    flush_cache: bool = True


class UpdateFromIPCRequest(BaseModel):
    """Buckets a trainer on this machine wrote into shared memory (``IPCWeightSync``)."""

    model_config = ConfigDict(extra="forbid")
    path: str
    """The shared file, e.g. ``/proc/PID/fd/N`` (the trainer's memfd)."""
    buckets: list[tuple[int, int]]
    """(offset, length) of each safetensors blob in it."""
    weight_version: int | str | None = None
    abort_all_requests: bool = False


class PauseRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    mode: Literal["abort", "in_place", "retract"] = "abort"


class AbortRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    rid: str = ""
    abort_all: bool = False


def _flag(request: Request, name: str, default: bool) -> bool:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    return raw.lower() in ("1", "true", "yes")


async def read_body(request: Request) -> bytes | bytearray:
    """The request body in one buffer. With a Content-Length, each received chunk is copied
    once into a buffer of that size (``request.body()`` keeps every chunk, then joins them)."""
    size = request.headers.get("content-length", "")
    if not size.isdigit():
        return await request.body()
    buf = bytearray(int(size))
    view, pos = memoryview(buf), 0
    async for chunk in request.stream():
        end = pos + len(chunk)
        if end > len(buf):
            raise ConfigError(f"request body is longer than its Content-Length ({size}).")
        view[pos:end] = chunk
        pos = end
    if pos != len(buf):
        raise ConfigError(f"request body ended after {pos} of its {size} bytes.")
    return buf


def _checksum_threads() -> int:
    return max(1, min(4, torch.get_num_threads()))


def add_control_routes(app: FastAPI, state: ServerState) -> None:

    engine = state.engine
    shapes = {n: t for n, t in engine.model.state_dict().items()}
    staged: dict[str, torch.Tensor] = {}
    lock = asyncio.Lock()

    async def in_engine(fn):  # type: ignore[no-untyped-def]
        return await asyncio.wrap_future(engine.call(fn))

    async def apply(
        named: dict[str, torch.Tensor], version: int | None, abort_all: bool, bump: bool = True
    ) -> int:
        """Copy ``named`` into the model between two steps and set ``version`` (None: bump it
        by one, or keep it when ``bump`` is False)."""

        def run() -> int:
            if abort_all:
                engine.abort_in_thread(None, "aborted for a weight update")
            apply_named_tensors(engine.model, named)
            if version is None and not bump:  # new weights, same version: no stale KV reuse
                engine.weights_changed()
                return engine.weight_version
            return engine.set_weight_version(version)

        return int(await in_engine(run))

    async def apply_keeping(
        named: dict[str, torch.Tensor], version: int | None, abort_all: bool
    ) -> int:
        async with lock:
            return await apply(named, version, abort_all, bump=False)

    add_collective_routes(app, state, apply_keeping, shapes)

    @app.post("/update_weights_from_disk")
    async def update_from_disk(request: Request) -> Response:
        try:
            req = parse_body(UpdateFromDiskRequest, await request.body())
            version = parse_version(req.weight_version)
            named = await asyncio.to_thread(load_named_tensors, req.model_path)
            validate_named_tensors(shapes, named)
            require_complete(shapes, named)
            async with lock:
                new = await apply(named, version, req.abort_all_requests)
        except ConfigError as exc:
            return update_failure(str(exc))
        return json_response(
            {
                "success": True,
                "message": f"loaded {len(named)} tensors from {req.model_path}",
                "num_paused_requests": 0,
                "weight_version": new,
            }
        )

    @app.post("/update_weights_from_tensor")
    async def update_from_tensor(request: Request) -> Response:
        if request.headers.get("content-type", "").startswith("application/json"):
            return error_response(
                "JSON serialized_named_tensors (SGLang's in-process format) is not accepted over "
                "HTTP; POST safetensors bytes from agentrl.inference.weights.safetensors_buckets() "
                "with Content-Type application/octet-stream.",
                415,
            )
        try:
            version = parse_version(request.query_params.get("weight_version"))
            named = await asyncio.to_thread(load_safetensors_bytes, await read_body(request))
            validate_named_tensors(shapes, named)
            async with lock:
                staged.update(named)
                if not _flag(request, "flush", True):
                    return json_response(
                        {
                            "success": True,
                            "message": "staged",
                            "staged_tensors": len(staged),
                            "weight_version": engine.weight_version,
                        }
                    )
                batch = dict(staged)
                staged.clear()
                new = await apply(batch, version, _flag(request, "abort_all_requests", False))
        except ConfigError as exc:
            return update_failure(str(exc))
        return json_response(
            {"success": True, "message": f"applied {len(batch)} tensors", "weight_version": new}
        )

    @app.post("/update_weights_from_ipc")
    async def update_from_ipc(request: Request) -> Response:
        try:
            req = parse_body(UpdateFromIPCRequest, await request.body())
            version = parse_version(req.weight_version)
            named = await asyncio.to_thread(map_shared_buckets, req.path, req.buckets)
            validate_named_tensors(shapes, named)
            require_complete(shapes, named, "send the whole state_dict in one IPC update")
            async with lock:
                new = await apply(named, version, req.abort_all_requests)
        except ConfigError as exc:
            return update_failure(str(exc))
        n = len(named)
        del named  # drops the mapping of the trainer's memory
        return json_response(
            {
                "success": True,
                "message": f"applied {n} tensors from {req.path}",
                "weight_version": new,
            }
        )

    @app.get("/weights_checksum")
    async def weights_checksum(request: Request) -> Response:
        asked = request.query_params.get("kind", "sha256")
        if asked not in CHECKSUM_KINDS:
            return error_response(f"kind={asked!r}: expected one of {list(CHECKSUM_KINDS)}.")
        kind: ChecksumKind = "sum64" if asked == "sum64" else "sha256"

        def run() -> tuple[int, dict[str, object]]:
            summary = checksum_named_tensors(
                engine.model.state_dict().items(), threads=_checksum_threads(), kind=kind
            )
            return engine.weight_version, summary.to_dict()

        version, body = await in_engine(run)
        if not _flag(request, "per_tensor", True):
            body.pop("tensors")
        return json_response({"weight_version": version, **body})

    @app.get("/get_weight_version")
    async def get_weight_version() -> Response:
        return json_response({"weight_version": engine.weight_version})

    @app.post("/pause_generation")
    async def pause_generation(request: Request) -> Response:
        try:
            req = parse_body(PauseRequest, await request.body())
        except ConfigError as exc:
            return error_response(str(exc))
        n = await asyncio.wrap_future(engine.pause(req.mode))
        return json_response({"success": True, "mode": req.mode, "num_aborted": n})

    @app.post("/continue_generation")
    async def continue_generation() -> Response:
        await asyncio.wrap_future(engine.resume())
        return json_response({"success": True})

    @app.post("/abort_request")
    async def abort_request(request: Request) -> Response:
        try:
            req = parse_body(AbortRequest, await request.body())
        except ConfigError as exc:
            return error_response(str(exc))
        if not req.abort_all and not req.rid:
            return error_response("send {'rid': ...} or {'abort_all': true}.")
        n = await asyncio.wrap_future(engine.abort(None if req.abort_all else req.rid))
        return json_response({"success": True, "num_aborted": n})

    @app.get("/health")
    async def health() -> Response:
        return json_response({"status": "ok"})

    @app.get("/health_generate")
    async def health_generate() -> Response:
        params = RequestParams(max_new_tokens=1, temperature=0.0, ignore_eos=True)
        try:
            res = await asyncio.wait_for(
                state.run(f"health-{uuid.uuid4().hex}", [engine.pad_id], params), 20
            )
        except TimeoutError:
            return error_response(
                "generation did not finish within 20 s (paused or overloaded)", 503
            )
        if res.error:
            return error_response(f"engine failed: {res.error}", 503)
        return json_response({"status": "ok"})

    @app.get("/get_model_info")
    async def get_model_info() -> Response:
        return json_response(
            {
                "model_path": engine.cfg.model,
                "tokenizer_path": engine.cfg.model,
                "served_model_name": state.model_name,
                "is_generation": True,
                "weight_version": engine.weight_version,
                "vocab_size": engine.vocab_size,
                "max_context_length": engine.max_context,
                "dtype": engine.cfg.dtype,
            }
        )

    @app.get("/get_server_info")
    async def get_server_info() -> Response:
        cfg = engine.cfg
        return json_response(
            {
                "backend": "embedded",
                "model_path": cfg.model,
                "dtype": cfg.dtype,
                "device": cfg.device,
                "max_batch_size": cfg.max_batch_size,
                "max_prefill_tokens": cfg.max_prefill_tokens,
                "seed": cfg.seed,
                "engine": engine.info(),
                "process": heap.pauses(),
            }
        )

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache() -> Response:
        dropped = await asyncio.wrap_future(engine.call(engine.drop_prefix_cache))
        return json_response(
            {"success": True, "message": f"dropped {dropped} cached prefixes", "dropped": dropped}
        )
