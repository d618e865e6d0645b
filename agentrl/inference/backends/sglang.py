"""SGLang's native API as a dialect (the embedded server speaks it too), and an SGLang launcher.

    request:  POST /generate {"input_ids", "sampling_params", "return_logprob",
              "top_logprobs_num" (when asked)}
    answer:   {"output_ids", "meta_info": {"output_token_logprobs": [[lp, id, text], ...],
               "output_top_logprobs": [[[lp, id, text], ...], ...] (when asked),
               "finish_reason": {"type": stop|length|abort}, "prompt_tokens", "weight_version"}}
    stream:   the same with "stream": true and "rid": SSE events with the output ids so far;
              the one with meta_info.finish_reason set is the whole answer; then [DONE]
    control:  /pause_generation {"mode"}  /continue_generation  /abort_request {"abort_all"}
              /abort_request {"rid"} (one request: its stream ends with what was sampled)
              /update_weights_from_disk {"model_path", "weight_version"}  /get_weight_version

The field names follow SGLang's ``GenerateReqInput`` and ``UpdateWeightFromDiskReqInput``
(see ``agentrl/inference/wire.py``). SGLang sends ``weight_version`` as a string; the embedded
server sends an int; ``parse_weight_version`` accepts both. Documentation this follows:

- native API (/generate, /get_model_info, /get_server_info, /health, /flush_cache, weight
  updates): https://docs.sglang.io/basic_usage/native_api.html
- RL integration (pause/continue generation, update_weights_from_disk / _from_distributed,
  weight versions): https://docs.sglang.io/advanced_features/sglang_for_rl.html
- the full route list the docs point to: https://github.com/sgl-project/sglang/blob/main/python/sglang/srt/entrypoints/http_server.py

``tests/inference/test_inference_sglang_protocol.py`` drives this dialect (and
``SGLangWeightSync`` in disk mode) against the embedded server, field by field.

``SGLangServer`` starts ``python -m sglang.launch_server`` the way ``ServerProcess`` starts the
embedded server. It is written against SGLang's documented command line; sglang is not
installable on the CPU machines agentrl is tested on, so it has not been run here.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx2

from agentrl.inference.backends.base import Dialect, PauseMode, StreamAnswer, call
from agentrl.inference.launch import ServerProcess
from agentrl.inference.protocol import Completion, FinishReason, SamplingParams
from agentrl.inference.wire import parse_weight_version


class SGLangDialect(Dialect):
    """SGLang ``/generate``. Caches the ``sampling_params`` dict per ``SamplingParams`` value."""

    name = "sglang"
    generate_path = "/generate"

    def __init__(self) -> None:
        self._sp_cache: dict[SamplingParams, dict[str, Any]] = {}

    def request_body(
        self,
        input_ids: list[int],
        sampling: SamplingParams,
        return_logprob: bool,
        *,
        images: Sequence[str] = (),
    ) -> bytes:
        body = {
            "input_ids": input_ids,
            "sampling_params": self._sampling_dict(sampling),
            "return_logprob": return_logprob,
        }
        if sampling.top_logprobs:
            body["top_logprobs_num"] = sampling.top_logprobs
        if images:  # SGLang's field: one image (URL or base64) per placeholder, in order
            body["image_data"] = list(images)
        return json.dumps(body, separators=(",", ":")).encode()

    def stream_body(
        self, input_ids: list[int], sampling: SamplingParams, return_logprob: bool, rid: str
    ) -> bytes:
        """SSE events, each with the output ids so far (SGLang's default, cumulative); the
        last one (``meta_info.finish_reason`` set) is the whole answer."""
        body = {
            "input_ids": input_ids,
            "sampling_params": self._sampling_dict(sampling),
            "return_logprob": return_logprob,
            "stream": True,
            "rid": rid,
        }
        if sampling.top_logprobs:
            body["top_logprobs_num"] = sampling.top_logprobs
        return json.dumps(body, separators=(",", ":")).encode()

    def stream_event(self, event: dict[str, Any], answer: StreamAnswer) -> list[int]:
        ids = event.get("output_ids") or []
        new = ids[len(answer.ids) :]
        answer.ids = ids
        meta = event.get("meta_info") or {}
        lps = meta.get("output_token_logprobs")
        if lps:
            answer.logprobs = [x[0] for x in lps]
        if meta.get("finish_reason"):
            answer.final = event
        return new  # type: ignore[no-any-return]

    def stream_completion(
        self, answer: StreamAnswer, server: str, latency: float
    ) -> Completion | None:
        if answer.final is None:
            return None
        return self.completion(answer.final, server, latency)

    async def abort(self, http: httpx2.AsyncClient, url: str, rid: str) -> None:
        await call(http, "POST", url + "/abort_request", json={"rid": rid})

    def _sampling_dict(self, s: SamplingParams) -> dict[str, Any]:
        d = self._sp_cache.get(s)
        if d is None:
            d = {
                "max_new_tokens": s.max_new_tokens,
                "temperature": s.temperature,
                "top_p": s.top_p,
                "top_k": s.top_k,
            }
            if s.stop_token_ids:
                d["stop_token_ids"] = list(s.stop_token_ids)
            if s.seed is not None:
                d["sampling_seed"] = s.seed
            if s.ignore_eos:
                d["ignore_eos"] = True
            if s.stop:
                d["stop"] = list(s.stop)
                d["no_stop_trim"] = True  # the ids and text keep what was sampled
            if len(self._sp_cache) > 4096:
                self._sp_cache.clear()
            self._sp_cache[s] = d
        return d

    def completion(self, data: dict[str, Any], server: str, latency: float) -> Completion:
        meta = data["meta_info"]
        lps = meta.get("output_token_logprobs")
        fr = meta.get("finish_reason")
        reason: FinishReason = fr["type"] if fr else "stop"
        version = meta.get("weight_version", 0)
        return Completion(
            output_ids=data["output_ids"],
            output_logprobs=[x[0] for x in lps] if lps else [],
            finish_reason=reason,
            weight_version=version if type(version) is int else parse_weight_version(version),
            prompt_tokens=meta["prompt_tokens"],
            cached_tokens=meta.get("cached_tokens") or 0,
            server=server,
            latency_s=latency,
            output_versions=meta.get("output_token_weight_versions") or [],
            output_top_logprobs=_top_rows(meta.get("output_top_logprobs")),
        )

    async def pause(self, http: httpx2.AsyncClient, url: str, mode: PauseMode) -> None:
        await call(http, "POST", url + "/pause_generation", json={"mode": mode})

    async def resume(self, http: httpx2.AsyncClient, url: str) -> None:
        await call(http, "POST", url + "/continue_generation", json={})

    async def abort_all(self, http: httpx2.AsyncClient, url: str) -> None:
        await call(http, "POST", url + "/abort_request", json={"abort_all": True})

    async def load_from_disk(
        self, http: httpx2.AsyncClient, url: str, path: str, version: int | None
    ) -> int:
        body: dict[str, object] = {"model_path": path}
        if version is not None:
            body["weight_version"] = str(version)  # SGLang's field is a string; ours takes both
        out = await call(http, "POST", url + "/update_weights_from_disk", json=body)
        if isinstance(out, dict) and "weight_version" in out:
            return parse_weight_version(out["weight_version"])
        return await self.weight_version(http, url)

    async def weight_version(self, http: httpx2.AsyncClient, url: str) -> int:
        out = await call(http, "GET", url + "/get_weight_version")
        return parse_weight_version(out.get("weight_version") if isinstance(out, dict) else out)


def _top_rows(rows: list[Any] | None) -> list[list[tuple[float, int]]] | None:
    """``meta_info.output_top_logprobs`` ([[logprob, id, text], ...] per token) as pairs."""
    if rows is None:
        return None
    return [[(x[0], x[1]) for x in row] if row else [] for row in rows]


class SGLangServer(ServerProcess):
    """``python -m sglang.launch_server`` in a subprocess on loopback (documented flags only)."""

    @dataclass(kw_only=True)
    class Config(ServerProcess.Config):
        python: str = sys.executable
        """Interpreter that has sglang installed."""
        dtype: str = "auto"
        mem_fraction_static: float | None = None
        startup_timeout_s: float = 600.0

    cfg: SGLangServer.Config

    def __init__(self, cfg: SGLangServer.Config) -> None:
        super().__init__(cfg)

    def command(self) -> list[str]:
        c = self.cfg
        cmd = [
            c.python,
            "-m",
            "sglang.launch_server",
            "--model-path",
            c.model,
            "--host",
            c.host,
            "--port",
            str(self.port),
            "--dtype",
            c.dtype,
            "--random-seed",
            str(c.seed),
        ]
        if c.mem_fraction_static is not None:
            cmd += ["--mem-fraction-static", str(c.mem_fraction_static)]
        return [*cmd, *c.extra_args]
