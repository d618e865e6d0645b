"""The embedded inference server: FastAPI + uvicorn in front of the batching ModelRunner.

    POST /generate (SGLang JSON) -> GenerateRequest -> RunnerRequest -> engine thread (batched)
        -> RunnerResult -> generate_response() dict -> JSON

Run it as a real process (it binds 127.0.0.1 unless told otherwise):

    python -m agentrl.inference.server --model PATH --port 30000 [--host] [--dtype] \
        [--max-batch-size] [--seed]

Endpoints: ``/generate`` (``generate_route.py``); ``/v1/completions``, ``/v1/chat/completions``, ``/v1/models``
(``openai_api.py``); ``/health``, ``/health_generate``, ``/get_model_info``,
``/get_server_info``, ``/flush_cache``; weights (``/get_weight_version``,
``/update_weights_from_disk``, ``/update_weights_from_tensor``, ``/update_weights_from_ipc``,
``/weights_checksum``, in ``server_weights.py``; ``/init_weights_update_group``,
``/update_weights_from_distributed``, ``/destroy_weights_update_group``, in
``server_collective.py``); ``/pause_generation``, ``/continue_generation``, ``/abort_request``.
A vision-language model (``agentrl.vision``) takes SGLang's ``image_data`` with ``input_ids``:
one data URL (or bare base64) per image, in the order of the images' placeholder runs, which
must already be expanded (``Vision.expand``: one ``<|image_pad|>`` per image token, as the
trainer sees them); the server turns them into pixels with the model's processor and checks
that the placeholders match. Errors are ``{"error": {"message", "type", "code"}}`` with a 4xx for bad input and a 5xx when
the engine failed. ``HttpGuard`` (``agentrl.http.guard``) runs before any body is read: an
optional bearer token (``--api-key`` or ``AGENTRL_INFERENCE_API_KEY``, SGLang's and vLLM's
``Authorization: Bearer`` scheme; off by default, for loopback; ``/health`` stays open) and
a body cap (413): ``--max-body-mb`` (64) for every route but ``/update_weights_from_tensor``,
whose safetensors buckets have ``--max-weight-body-mb`` (16384; a bucket holds at least one
whole tensor, so keep it above the largest tensor and the sync's ``bucket_bytes``). Bodies are parsed from raw bytes and answers written as raw JSON, skipping
FastAPI's per-request encoders.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import logging
import os
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from fastapi import FastAPI, Response

from agentrl import heap
from agentrl.errors import ConfigError, TokenizationError
from agentrl.http import HttpGuard, is_loopback
from agentrl.inference.protocol import DEFAULT_MAX_BATCH_SIZE
from agentrl.inference.runner import ModelRunner
from agentrl.inference.runner_types import RequestParams, RunnerRequest, RunnerResult
from agentrl.inference.static_runner import build_runner
from agentrl.inference.wire import (
    GenerateRequest,
    WireSamplingParams,
    generate_response,
)
from agentrl.rust_tokenizer import rust_backend
from agentrl.vision import ImageInputs

if TYPE_CHECKING:
    pass

logger = logging.getLogger(__name__)
API_KEY_ENV = "AGENTRL_INFERENCE_API_KEY"
WEIGHT_BODY_ROUTES = ("/update_weights_from_tensor",)
"""Routes whose bodies are weights (safetensors buckets), capped by ``max_weight_body_bytes``."""


def guard_config(
    api_key: str = "", *, max_body_bytes: int = 64 << 20, max_weight_body_bytes: int = 16 << 30
) -> HttpGuard.Config:
    """The inference server's guard: optional bearer token, body caps (weights get their own)."""
    return HttpGuard.Config(
        token=api_key,
        max_body_bytes=max_body_bytes,
        route_caps={r: max_weight_body_bytes for r in WEIGHT_BODY_ROUTES},
        cap_hint="restart the server with a larger --max-body-mb "
        "(weight updates: --max-weight-body-mb)",
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class Job:
    """One prompt of a /generate call, ready for the engine."""

    rid: str
    input_ids: list[int]
    params: RequestParams
    return_logprob: bool
    skip_special_tokens: bool
    no_stop_trim: bool
    images: ImageInputs | None = None


def text_decoder(tokenizer: Any) -> Callable[[list[int], bool], str]:
    """``decode(ids, skip_special_tokens)`` as ``tokenizer.decode`` gives it, through the Rust
    tokenizer where it gives the same text (``agentrl.rust_tokenizer``): it runs on the HTTP
    thread, which shares the GIL with the engine, once per request."""
    backend = rust_backend(tokenizer)

    def slow(ids: list[int], skip: bool) -> str:
        return str(tokenizer.decode(ids, skip_special_tokens=skip))

    if backend is None:
        return slow

    def fast(ids: list[int], skip: bool) -> str:
        return str(backend.decode(ids, skip_special_tokens=skip))

    return fast


class ServerState:
    """What every handler shares: the engine, its tokenizer and the served model's name."""

    def __init__(self, engine: ModelRunner, model_name: str) -> None:
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.decode = text_decoder(engine.tokenizer)
        self.model_name = model_name
        # request ids for prompts that came without one: unique to this server process, and
        # cheaper than a uuid4 per request on the HTTP thread (which the engine waits on)
        self._rid_prefix = uuid.uuid4().hex[:12] + "-"
        self._rids = itertools.count()

    async def run(
        self,
        rid: str,
        input_ids: list[int],
        params: RequestParams,
        on_token: Callable[[int], None] | None = None,
        images: ImageInputs | None = None,
    ) -> RunnerResult:
        """Submit one request to the engine and wait; abort it if the caller goes away.

        ``on_token`` is called in this event loop with each token as it is sampled (before
        the result), for streaming."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[RunnerResult] = loop.create_future()

        def done(result: RunnerResult) -> None:
            loop.call_soon_threadsafe(_resolve, fut, result)

        token_cb = None
        if on_token is not None:

            def token_cb(tok: int) -> None:
                loop.call_soon_threadsafe(on_token, tok)

        self.engine.submit(
            RunnerRequest(
                rid=rid,
                input_ids=input_ids,
                params=params,
                on_done=done,
                on_token=token_cb,
                images=images,
            )
        )
        try:
            return await fut
        except asyncio.CancelledError:
            self.engine.abort(rid, "client disconnected")
            raise

    def check_prompt(self, ids: list[int]) -> None:
        if not ids:
            raise ConfigError("input_ids is empty; send at least one token id.")
        lo, hi = min(ids), max(ids)
        if lo < 0 or hi >= self.engine.vocab_size:
            bad = lo if lo < 0 else hi
            raise ConfigError(
                f"token id {bad} is outside the vocabulary [0, {self.engine.vocab_size}); "
                "tokenize with this model's tokenizer."
            )
        if len(ids) >= self.engine.max_context:
            raise ConfigError(
                f"prompt has {len(ids)} tokens; this server's context is "
                f"{self.engine.max_context} (the model's, or the static engine's --max-seq-len)."
            )

    def request_params(self, sp: WireSamplingParams, top_logprobs: int) -> RequestParams:
        bad = sp.unsupported()
        if bad:
            raise ConfigError(
                f"sampling_params {bad} are not supported by the embedded server; leave them at "
                "their defaults or serve with SGLang/vLLM."
            )
        seed = sp.sampling_seed if sp.sampling_seed is not None else sp.seed
        return RequestParams(
            max_new_tokens=sp.max_new_tokens,
            temperature=sp.temperature,
            top_p=sp.top_p,
            top_k=sp.top_k,
            stop_token_ids=frozenset(sp.stop_token_ids or ()),
            stop_strings=sp.stop_strings(),
            ignore_eos=sp.ignore_eos,
            seed=seed,
            top_logprobs=top_logprobs,
        )

    def plan(self, req: GenerateRequest) -> tuple[list[Job], bool]:
        """Turn a request into engine jobs (and whether it was a single prompt, not a batch);
        ConfigError on bad input."""
        if req.stream and (
            req.input_ids is None or (req.input_ids and not isinstance(req.input_ids[0], int))
        ):
            raise ConfigError(
                "stream=true needs one prompt given as input_ids (no batches, no text)."
            )
        if req.input_embeds is not None or req.lora_path is not None:
            raise ConfigError(
                "input_embeds and lora_path are not supported by the embedded server."
            )
        images = self.images(req)
        if req.logprob_start_len not in (None, -1) and not isinstance(req.logprob_start_len, list):
            raise ConfigError(
                "logprob_start_len must be -1: input-token logprobs are not supported."
            )
        if (req.text is None) == (req.input_ids is None):
            raise ConfigError("send exactly one of 'text' or 'input_ids'.")
        if req.input_ids is not None:
            single = not req.input_ids or isinstance(req.input_ids[0], int)
            prompts = cast(list[list[int]], [req.input_ids] if single else req.input_ids)
        else:
            single = isinstance(req.text, str)
            texts = [req.text] if single else req.text
            prompts = [self.tokenizer.encode(t, add_special_tokens=False) for t in texts]  # type: ignore[union-attr]
        n = len(prompts)
        sps, rids = (
            _per_item(req.sampling_params, n, "sampling_params"),
            _per_item(req.rid, n, "rid"),
        )
        lps, tops = (
            _per_item(req.return_logprob, n, "return_logprob"),
            _per_item(req.top_logprobs_num, n, "top_logprobs_num"),
        )
        jobs = []
        for i, ids in enumerate(prompts):
            self.check_prompt(ids)
            sp = sps[i] or WireSamplingParams()
            rid = rids[i] or (
                f"{self._rid_prefix}{next(self._rids)}"
                if single or req.rid is None
                else f"{req.rid}_{i}"
            )
            jobs.append(
                Job(
                    rid=rid,
                    input_ids=ids,
                    params=self.request_params(sp, tops[i] or 0),
                    return_logprob=bool(lps[i]),
                    skip_special_tokens=sp.skip_special_tokens,
                    no_stop_trim=sp.no_stop_trim,
                    images=images,
                )
            )
        if images is not None:
            assert self.engine.vision is not None
            try:
                self.engine.vision.check_tokens(prompts[0], images)
            except TokenizationError as e:
                raise ConfigError(str(e)) from None
        return jobs, single

    def images(self, req: GenerateRequest) -> ImageInputs | None:
        """The pixels of a request's ``image_data`` (None without images); ConfigError when
        the model is text-only or the images are not what a single token prompt needs."""
        data = req.image_data
        if data is None or data == []:
            return None
        vision = self.engine.vision
        if vision is None:
            raise ConfigError(
                "image_data was sent but the served model is text-only; send text-only "
                "prompts, or serve a vision-language model (e.g. agentrl.tiny.make_tiny_model("
                "arch='qwen2_vl'))."
            )
        if req.input_ids is None or (req.input_ids and not isinstance(req.input_ids[0], int)):
            raise ConfigError(
                "image_data needs one prompt given as input_ids (no batches, no text), with "
                "each image's placeholder already expanded."
            )
        urls = [data] if isinstance(data, str) else data
        if not isinstance(urls, list) or not all(isinstance(u, str) for u in urls):
            raise ConfigError(
                "image_data must be a list of image data URLs ('data:image/png;base64,...'), "
                "one per image placeholder in input_ids, in order."
            )
        try:
            return vision.pixels(urls)
        except TokenizationError as e:
            raise ConfigError(str(e)) from None

    def respond(self, job: Job, res: RunnerResult, latency: float) -> dict[str, object]:
        text = self.decode(res.output_ids, job.skip_special_tokens)
        matched = res.finish_reason.get("matched")
        if isinstance(matched, str) and not job.no_stop_trim and matched in text:
            text = text[: text.index(matched)]
        return generate_response(
            rid=res.rid,
            text=text,
            output_ids=res.output_ids,
            finish_reason=res.finish_reason,
            prompt_tokens=res.prompt_tokens,
            weight_version=res.weight_version,
            e2e_latency=latency,
            output_logprobs=res.output_logprobs if job.return_logprob else None,
            output_versions=res.output_versions,
            top_logprobs=res.top_logprobs if job.return_logprob else None,
        )


def _resolve(fut: asyncio.Future[RunnerResult], result: RunnerResult) -> None:
    if not fut.done():
        fut.set_result(result)


def _per_item(value: Any, n: int, name: str) -> list[Any]:
    if not isinstance(value, list):
        return [value] * n
    if len(value) != n:
        raise ConfigError(f"{name} has {len(value)} entries for {n} prompts; send one per prompt.")
    return value


def build_app(
    engine: ModelRunner, model_name: str, guard: HttpGuard.Config | None = None
) -> HttpGuard:
    """The ASGI app serving ``engine`` (which must already be started): ``guard`` (default:
    ``guard_config()``, no token) -> ``GenerateRoute`` -> the FastAPI app of the other routes."""
    from agentrl.inference.generate_route import GenerateRoute
    from agentrl.inference.openai_api import add_openai_routes
    from agentrl.inference.server_weights import add_control_routes

    state = ServerState(engine, model_name)
    app = FastAPI(title="agentrl embedded inference server", docs_url=None, redoc_url=None)
    app.state.server = state

    @app.get("/metrics")
    async def metrics() -> Response:
        info = {**engine.info(), **heap.pauses()}
        return Response(prometheus_metrics(info), media_type="text/plain; version=0.0.4")

    add_control_routes(app, state)
    add_openai_routes(app, state)
    return HttpGuard(GenerateRoute(app, state), config=guard or guard_config())


METRICS = {
    "running": "requests decoding now",
    "queue_length": "requests waiting for a slot",
    "kv_use": "fraction of the KV cache's token positions in use (static engine)",
    "prefix_hit_rate": "prompt tokens served from the prefix cache / prompt tokens",
    "pool_hit_rate": "prompt tokens copied from finished requests' parked KV / prompt tokens",
    "pool_entries": "finished requests' KV parked in free slots (static engine)",
    "tokens_per_s": "generated tokens per second since the server started",
    "gc_gen2_s": "seconds full garbage-collector passes stopped the server's threads",
    "tokens_generated": "generated tokens",
    "requests_finished": "finished requests",
    "weight_version": "weight version",
}


def prometheus_metrics(info: dict[str, Any]) -> str:
    """``engine.info()`` as Prometheus text: the gauges of ``METRICS`` that the engine has."""
    lines = []
    for key, help_text in METRICS.items():
        if key in info:
            lines += [
                f"# HELP agentrl_{key} {help_text}",
                f"# TYPE agentrl_{key} gauge",
                f"agentrl_{key} {float(info[key])}",
            ]
    return "\n".join(lines) + "\n"


def _watch_parent(pid: int, interval_s: float = 1.0) -> None:
    """SIGTERM ourselves (a clean uvicorn shutdown) once ``pid`` is no longer our parent."""
    import os
    import signal
    import threading
    import time

    def watch() -> None:
        while os.getppid() == pid:
            time.sleep(interval_s)
        logger.warning("parent process %d is gone; shutting down", pid)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def main(argv: list[str] | None = None) -> None:
    """``python -m agentrl.inference.server --model PATH --port N``."""
    import uvicorn

    p = argparse.ArgumentParser(description="agentrl embedded inference server")
    p.add_argument("--model", required=True, help="local Hugging Face model directory")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--device", default="cpu")
    p.add_argument("--max-batch-size", type=int, default=DEFAULT_MAX_BATCH_SIZE)
    p.add_argument("--max-prefill-tokens", type=int, default=16384)
    p.add_argument(
        "--engine",
        default="auto",
        choices=("auto", "static", "dynamic"),
        help="static: slot KV cache + CUDA graphs; dynamic: transformers' DynamicCache; "
        "auto: static for llama/mistral/qwen2/qwen3 models, dynamic otherwise",
    )
    p.add_argument("--max-seq-len", type=int, default=0, help="static: tokens per request slot")
    p.add_argument(
        "--kv-cache-gb", type=float, default=0.0, help="static: KV cache memory (0: automatic)"
    )
    p.add_argument("--no-cuda-graphs", action="store_true", help="static: eager decode steps")
    p.add_argument(
        "--capture-graphs",
        default="eager",
        choices=("eager", "lazy", "all"),
        help="static on CUDA: capture every decode graph bucket at start, before the server "
        "answers (eager: sampling without top-k/top-p; all: with too), or each on first use "
        "(lazy); no-op on CPU",
    )
    p.add_argument(
        "--compile-pointwise",
        action="store_true",
        help="static: torch.compile the decoder's elementwise runs (add+RMSNorm, rotary, "
        "activation) into one kernel each (on CUDA before capturing graphs; ~16 s at start)",
    )
    p.add_argument(
        "--batch-wait-ms",
        type=float,
        default=20.0,
        help="an idle engine waits up to this long for the rest of a burst of requests (each "
        "within --batch-quiet-ms of the last) so they start as one prefill; 0: at once",
    )
    p.add_argument(
        "--batch-quiet-ms",
        type=float,
        default=2.0,
        help="the gap between requests that ends a burst (see --batch-wait-ms)",
    )
    p.add_argument(
        "--prefill-every",
        type=int,
        default=1,
        help="while requests decode, admit waiting ones at most every N decode steps, so "
        "next turns that come back a few a step share one prefill (1: every step)",
    )
    p.add_argument(
        "--no-prefix-pool",
        action="store_true",
        help="static: do not keep finished requests' KV in free slots for the next turn",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-threads", type=int, default=0)
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--log-level", default="info")
    p.add_argument(
        "--api-key",
        default=os.environ.get(API_KEY_ENV, ""),
        help=f"bearer token every route but /health requires (default: ${API_KEY_ENV}; "
        "none: open to anyone who can reach the port)",
    )
    p.add_argument(
        "--max-body-mb",
        type=float,
        default=64.0,
        help="largest request body; larger ones get 413 unread",
    )
    p.add_argument(
        "--max-weight-body-mb",
        type=float,
        default=16384.0,
        help="largest /update_weights_from_tensor body (one safetensors bucket)",
    )
    p.add_argument(
        "--exit-with-parent",
        type=int,
        default=0,
        metavar="PID",
        help="shut down when process PID exits (launchers pass their own pid, so a killed "
        "driver does not leave servers behind); 0 disables",
    )
    p.add_argument(
        "--switch-interval",
        type=float,
        default=0.0005,
        help="sys.setswitchinterval: how soon the HTTP thread gets the GIL back from the model thread",
    )
    a = p.parse_args(argv)
    sys.setswitchinterval(a.switch_interval)
    logging.basicConfig(
        level=a.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if not a.api_key and not is_loopback(a.host):
        logger.warning(
            "serving on %s without --api-key: anyone who can reach it can generate "
            "and replace the weights",
            a.host,
        )
    guard = guard_config(
        a.api_key,
        max_body_bytes=int(a.max_body_mb * (1 << 20)),
        max_weight_body_bytes=int(a.max_weight_body_mb * (1 << 20)),
    )
    engine = build_runner(
        ModelRunner.Config(
            model=a.model,
            dtype=a.dtype,
            device=a.device,
            max_batch_size=a.max_batch_size,
            max_prefill_tokens=a.max_prefill_tokens,
            seed=a.seed,
            num_threads=a.num_threads,
            engine=a.engine,
            max_seq_len=a.max_seq_len,
            kv_cache_gb=a.kv_cache_gb,
            cuda_graphs=not a.no_cuda_graphs,
            capture_graphs=a.capture_graphs,
            compile_pointwise=a.compile_pointwise,
            prefix_pool=not a.no_prefix_pool,
            batch_wait_ms=a.batch_wait_ms,
            batch_quiet_ms=a.batch_quiet_ms,
            prefill_every=a.prefill_every,
        )
    )
    engine.start()
    if a.exit_with_parent:
        _watch_parent(a.exit_with_parent)
    app = build_app(engine, a.served_model_name or a.model, guard)
    # everything built so far lives as long as the server: out of the collector's full passes
    # (each walked ~500k objects, ~0.3 s with every thread stopped; see agentrl/heap.py)
    frozen = heap.freeze()
    heap.watch()
    logger.info("serving %s on http://%s:%d (%d objects frozen)", a.model, a.host, a.port, frozen)
    try:
        # Keep-alive outlives the client's idle gaps (a trajectory's env step between turns):
        # uvicorn's 5 s default closes pooled connections that clients are about to reuse,
        # and thousands of concurrent rollouts then see dropped requests. The backlog absorbs
        # bursts of new connections.
        uvicorn.run(
            app,
            host=a.host,
            port=a.port,
            log_level=a.log_level,
            access_log=False,
            timeout_graceful_shutdown=5,
            timeout_keep_alive=900,
            backlog=4096,
        )
    finally:
        engine.shutdown()


if __name__ == "__main__":
    main()
