"""The batching model runner behind the embedded server: continuous batching over a KV cache.

    HTTP handlers --submit()/abort()/call()--> inbox (thread-safe) --> engine thread:
        loop: drain inbox -> admit waiting requests (one batched, left-padded prefill)
              -> merge their KV rows into the running batch -> one decode step for every row
              -> finished rows leave the batch -> on_done(result) back to the event loop

Why this design: a transformers model on CPU is dominated by per-forward overhead, so the
number of forwards per generated token is what matters. Every running request advances one
token per decode step (B rows, one forward), and requests that arrive while a step runs are
prefilled together at the next step boundary and join the batch (continuous batching at the
decode-step level). Rows are left-padded: the attention mask hides padding, ``position_ids``
count real tokens only, so a row's logits do not depend on its neighbours (verified against a
teacher-forced forward pass to ~1e-6 in fp32). The KV cache is one ``DynamicCache`` whose
per-layer tensors are merged (left-padded to a common length) when rows join, indexed when rows
leave, and trimmed when the longest row leaves. The model runs in one dedicated thread, so the
asyncio event loop that serves HTTP never blocks on a forward pass.

A vision-language model (``agentrl.vision``, Qwen2-VL) runs here too: a request may carry its
images' pixels (``RunnerRequest.images``); a prefill passes the rows' pixels in row order with
Qwen2-VL's multimodal rotary positions (left padding handled by the attention mask), and a
row's ``next_pos`` starts at its real length plus its rotary offset, so decode steps feed plain
(B, 1) positions, which the model uses on all three rotary axes, as the trainer's forward does.

Everything that touches the model (weight updates, checksums) runs in that thread between
steps through ``call()``, so an update never lands in the middle of a forward pass. Tokens
generated after an update are tagged with the new version (``output_versions``).
"""

from __future__ import annotations

import concurrent.futures
import inspect
import itertools
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import torch

from agentrl.cpus import available_cpus
from agentrl.errors import ConfigError
from agentrl.inference.batch_state import BatchState, prefill_inputs
from agentrl.inference.protocol import DEFAULT_MAX_BATCH_SIZE
from agentrl.inference.runner_types import RequestParams, RunnerRequest, RunnerResult
from agentrl.inference.sampling import RowSampling, sample_rows
from agentrl.inference.wire import finish_reason_dict
from agentrl.vision import ImageInputs, Vision, mrope_positions

# The request types live in runner_types.py and stay importable from here, their public home.
__all__ = ["ModelRunner", "RequestParams", "RunnerRequest", "RunnerResult"]

logger = logging.getLogger(__name__)
T = TypeVar("T")


class ModelRunner:
    """Loads an HF causal LM and serves ``RunnerRequest``s from its own thread."""

    @dataclass(kw_only=True)
    class Config:
        model: str
        """Local Hugging Face model directory."""
        dtype: str = "float32"
        device: str = "cpu"
        max_batch_size: int = DEFAULT_MAX_BATCH_SIZE
        """Most rows decoded together."""
        max_prefill_tokens: int = 16384
        """Most padded tokens in one prefill forward (at least one request is always admitted)."""
        seed: int = 0
        """Seeds requests that do not carry their own seed."""
        num_threads: int = 0
        """torch intra-op threads; 0 = one less than the CPU count (at least 1) on CPU, so the
        HTTP thread keeps a core (OpenMP workers spin between ops and would starve it), and 2 on
        CUDA, where the host runs only small sampling ops."""
        engine: Literal["auto", "static", "dynamic"] = "auto"
        """static: a preallocated slot KV cache, our own forward, CUDA graphs on CUDA
        (``static_runner.py``); dynamic: transformers' forward over a ``DynamicCache`` (this
        class); auto: static for the models it supports, dynamic otherwise."""
        max_seq_len: int = 0
        """static: tokens per slot, prompt and output (0: the model's context, at most 8192);
        a longer prompt is refused."""
        kv_cache_gb: float = 0.0
        """static: memory for the KV cache (0: 60% of the free GPU memory on CUDA, a quarter
        of the RAM on CPU);
        with ``max_seq_len`` it sets how many requests run at once (at most
        ``max_batch_size``); the rest wait."""
        cuda_graphs: bool = True
        """static on CUDA: replay each decode step as a CUDA graph (one per batch-size and
        length bucket)."""
        capture_graphs: Literal["eager", "lazy", "all"] = "eager"
        """static on CUDA, with ``cuda_graphs``: when the decode graphs are captured. eager:
        every (batch-size, length) bucket's graph for sampling without top-k/top-p, at start
        (before the server answers; the top-k/top-p variants on first use); all: their
        top-k/top-p variants too; lazy: each graph on first use (100-300 ms in the middle of
        traffic). A no-op on CPU."""
        compile_pointwise: bool = False
        """static: ``torch.compile`` the decoder's runs of elementwise ops (residual
        add with the next RMSNorm, rotary embedding, the MLP's activation times up) into one
        generated kernel each, before the graphs are captured: fewer kernels a decode step,
        for ~16 s more at start (337M Llama, H100). On CPU it compiles C++ kernels (a
        compiler is needed; tests use it there, a CPU server gains little)."""
        batch_wait_ms: float = 20.0
        """An idle engine that gets a request waits for the rest of its burst (requests sent
        together arrive over HTTP a fraction of a millisecond apart) before its first prefill:
        it keeps admitting while each request comes within ``batch_quiet_ms`` of the last,
        for at most this long, so a GRPO batch starts as one prefill instead of one small
        prefill per decode step. 0: start at once."""
        batch_quiet_ms: float = 2.0
        """The gap that ends a burst (see ``batch_wait_ms``): a lone request waits this long."""
        prefill_every: int = 1
        """While requests decode, admit waiting ones at most every this many decode steps (1:
        every step): next turns coming back a few a step then share one prefill forward, each
        waiting up to this many steps. An idle engine admits at once (after ``batch_wait_ms``)."""
        prefix_pool: bool = True
        """static: keep a finished request's KV in a free slot until the slot is needed, so a
        request that starts with its tokens (the next turn of a conversation) copies it
        instead of prefilling it again (``prefix_pool.py``)."""

    def __init__(self, cfg: ModelRunner.Config) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.cfg = cfg
        if cfg.max_batch_size < 1:
            raise ConfigError(f"max_batch_size must be >= 1, got {cfg.max_batch_size}.")
        if cfg.prefill_every < 1:
            raise ConfigError(f"prefill_every must be >= 1, got {cfg.prefill_every}")
        if cfg.batch_wait_ms < 0 or cfg.batch_quiet_ms < 0:
            raise ConfigError(
                f"batch_wait_ms and batch_quiet_ms must be >= 0 (0: no waiting), got "
                f"{cfg.batch_wait_ms} and {cfg.batch_quiet_ms}"
            )
        dtype = getattr(torch, cfg.dtype, None)
        if not isinstance(dtype, torch.dtype):
            raise ConfigError(f"dtype {cfg.dtype!r} is not a torch dtype; try float32 or bfloat16.")
        torch.set_num_threads(cfg.num_threads or _default_threads(cfg.device))
        self.tokenizer: Any = AutoTokenizer.from_pretrained(cfg.model)
        self.vision: Vision | None = Vision.from_pretrained(cfg.model, self.tokenizer)
        model: Any
        if self.vision is not None:
            from transformers import AutoModelForImageTextToText

            model = AutoModelForImageTextToText.from_pretrained(cfg.model, dtype=dtype)
        else:
            model = AutoModelForCausalLM.from_pretrained(cfg.model, dtype=dtype)
        self.model: Any = model.to(cfg.device).eval()
        self.dtype = dtype
        self._suppress = (
            torch.tensor(self.vision.special_ids, device=cfg.device)
            if self.vision is not None
            else None
        )
        self.vocab_size = int(self.model.get_input_embeddings().weight.shape[0])
        text_config = self.model.config.get_text_config()
        self.max_context = int(getattr(text_config, "max_position_embeddings", 1 << 30))
        self.eos_ids = _eos_ids(self.model, self.tokenizer)
        pad = self.tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else min(self.eos_ids, default=0))
        BatchState.check_supported(self.model)
        self._cache_kw = _cache_keyword(self.model)
        self.weight_version = 0
        self.paused = False
        self.stats: dict[str, int] = dict.fromkeys(
            (
                "prefill_forwards",
                "decode_steps",
                "batched_forwards",
                "max_batch_seen",
                "requests_finished",
                "tokens_generated",
            ),
            0,
        )
        self._inbox: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._waiting: deque[RunnerRequest] = deque()
        self._batch: BatchState | None = None
        self._by_rid: dict[str, RunnerRequest] = {}
        self._seeds = itertools.count()
        self._thread: threading.Thread | None = None
        self._started = time.monotonic()
        # engine-thread wall time with work (waiting or running requests), and the part of
        # it spent holding a burst's first prefill back (_gather): a round's time outside
        # them is the HTTP side's (requests not yet arrived, answers not yet read)
        self._busy: tuple[float, float | None] = (0.0, None)  # (seconds so far, busy since)
        self._gather_s = 0.0
        self._steps_since_prefill = 0  # decode steps since waiting requests were last admitted

    # ---- API (any thread) ---------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="agentrl-engine", daemon=True)
        self._thread.start()

    def shutdown(self, timeout_s: float = 10.0) -> None:
        self._inbox.put(None)
        if self._thread is not None:
            self._thread.join(timeout_s)

    def submit(self, req: RunnerRequest) -> None:
        self._inbox.put(lambda: self._admit_request(req))

    def abort(
        self, rid: str | None, message: str = "aborted by request"
    ) -> concurrent.futures.Future[int]:
        """Abort one request (by rid) or, with ``None``, every waiting and running request.
        The future gives how many were aborted."""
        return self.call(lambda: self._abort(rid, message))

    def pause(
        self, mode: Literal["abort", "in_place", "retract"] = "abort"
    ) -> concurrent.futures.Future[int]:
        """Stop stepping. ``abort`` also finishes every request with finish_reason abort;
        ``in_place`` keeps them (and their KV) to continue on resume; ``retract`` (static
        engine) frees their KV and, after resume, prefills each again, prompt and tokens so
        far, with the weights served then (the dynamic engine keeps the KV, as ``in_place``)."""

        def run() -> int:
            self.paused = True
            if mode == "retract":
                self._retract()
            return self._abort(None, "aborted by pause_generation") if mode == "abort" else 0

        return self.call(run)

    def resume(self) -> concurrent.futures.Future[None]:
        def run() -> None:
            self.paused = False

        return self.call(run)

    def call(self, fn: Callable[[], T]) -> concurrent.futures.Future[T]:
        """Run ``fn`` in the engine thread between steps (works while paused)."""
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            try:
                fut.set_result(fn())
            except BaseException as exc:  # delivered to the caller, never kills the loop
                fut.set_exception(exc)

        self._inbox.put(run)
        return fut

    def info(self) -> dict[str, Any]:
        running = len(self._running())
        busy, since = self._busy  # one tuple, replaced whole by the engine thread
        return {
            **self.stats,
            "running": running,
            "waiting": len(self._waiting),
            "queue_length": len(self._waiting),
            "engine": "dynamic",
            "tokens_per_s": self.stats["tokens_generated"]
            / max(time.monotonic() - self._started, 1e-9),
            "paused": self.paused,
            "weight_version": self.weight_version,
            "busy_s": busy + (time.monotonic() - since if since is not None else 0.0),
            "gather_s": self._gather_s,
        }

    # ---- engine thread only (inside call()) ---------------------------------------------
    def abort_in_thread(self, rid: str | None, message: str) -> int:
        """``abort`` for code already running in the engine thread (e.g. a weight update)."""
        return self._abort(rid, message)

    def set_weight_version(self, version: int | None) -> int:
        """Bump (``None``) or set the version; in-flight requests record the boundary."""
        self.weight_version = self.weight_version + 1 if version is None else int(version)
        for req in self._running():
            req.version_marks.append((len(req.output_ids), self.weight_version))
        return self.weight_version

    # ---- engine thread ------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            idle = self.paused or (not self._waiting and not self._has_running())
            busy, since = self._busy
            if idle and since is not None:
                self._busy = (busy + time.monotonic() - since, None)
            if not self._drain(block=idle):
                break
            if self._busy[1] is None and (self._waiting or self._has_running()):
                self._busy = (self._busy[0], time.monotonic())
            if idle and self._waiting and not self.paused and not self._gather():
                break
            if self.paused:
                continue
            try:
                due = (  # admit now: nothing runs, or prefill_every steps since the last
                    not self._has_running() or self._steps_since_prefill >= self.cfg.prefill_every
                )
                if self._waiting and self._room() > 0 and due:
                    self._prefill()
                    self._steps_since_prefill = 0
                if self._has_running():
                    self._decode()
                    self._steps_since_prefill += 1
            except Exception as exc:  # a failed forward must not take the server down
                logger.exception("engine step failed")
                self._fail_all(f"{type(exc).__name__}: {exc}")

    def _drain(self, block: bool) -> bool:
        """Run queued commands; False once shutdown was requested."""
        try:
            cmd = self._inbox.get() if block else self._inbox.get_nowait()
        except queue.Empty:
            return True
        while self._run(cmd):
            try:
                cmd = self._inbox.get_nowait()
            except queue.Empty:
                return True
        return False

    def _run(self, cmd: Callable[[], None] | None) -> bool:
        """Run one queued command; ``None`` is shutdown: fail what is left, return False."""
        if cmd is None:
            self._fail_all("server shutting down")
            return False
        cmd()
        return True

    def _gather(self) -> bool:
        """Idle, with work just arrived: keep admitting while requests come within
        ``batch_quiet_ms`` of each other, for at most ``batch_wait_ms`` or until the slots
        are full, so a burst starts as one prefill. False once shutdown was requested."""
        start = time.monotonic()
        deadline = start + self.cfg.batch_wait_ms / 1000
        quiet = self.cfg.batch_quiet_ms / 1000
        try:
            while len(self._waiting) < self._room() and not self.paused:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    cmd = self._inbox.get(timeout=min(quiet, left))
                except queue.Empty:
                    break
                if not self._run(cmd):
                    return False
            return True
        finally:
            self._gather_s += time.monotonic() - start

    def weights_changed(self) -> None:
        """Engine thread: the weights were overwritten without a version change (SGLang's
        collective update without ``weight_version``): KV made before must not be reused.
        This engine reuses none."""

    def drop_prefix_cache(self) -> int:
        """Engine thread: forget every cached prefix (``/flush_cache``); how many were
        dropped. This engine caches none."""
        return 0

    def _retract(self) -> None:
        """``pause(mode="retract")``: this engine keeps its KV cache, as ``in_place``."""

    def _running(self) -> list[RunnerRequest]:
        batch = self._batch  # read once: info() calls this from another thread
        return list(batch.reqs) if batch is not None else []

    def _has_running(self) -> bool:
        return self._batch is not None

    def _remove_running(self, ids: set[int]) -> None:
        """Take the running requests whose ``id()`` is in ``ids`` out of the batch."""
        if self._batch is not None:
            keep = [i for i, r in enumerate(self._batch.reqs) if id(r) not in ids]
            self._batch = self._batch.select(keep) if keep else None

    def _room(self) -> int:
        return self.cfg.max_batch_size - (self._batch.size if self._batch is not None else 0)

    def _admit_request(self, req: RunnerRequest) -> None:
        if req.rid in self._by_rid:
            req.on_done(
                self._result(
                    req,
                    finish_reason_dict("abort", message=f"duplicate rid {req.rid!r}"),
                    error=None,
                )
            )
            return
        p = req.params
        if p.max_new_tokens == 0:
            req.on_done(self._result(req, finish_reason_dict("length", length=0)))
            return
        gen, seed = None, 0
        if p.temperature > 0.0:
            seed = p.seed if p.seed is not None else (self.cfg.seed << 32) + next(self._seeds)
            gen = torch.Generator().manual_seed(seed)
        req.row = RowSampling(
            temperature=p.temperature,
            top_p=p.top_p,
            top_k=p.top_k,
            top_logprobs=p.top_logprobs,
            generator=gen,
            seed=seed,
        )
        self._by_rid[req.rid] = req
        self._waiting.append(req)

    def _take_waiting(self) -> list[RunnerRequest]:
        room, longest = self._room(), 0
        taken: list[RunnerRequest] = []
        while self._waiting and len(taken) < room:
            n = len(self._waiting[0].input_ids)
            if taken and max(longest, n) * (len(taken) + 1) > self.cfg.max_prefill_tokens:
                break
            longest = max(longest, n)
            taken.append(self._waiting.popleft())
        return taken

    @torch.inference_mode()
    def _prefill(self) -> None:
        reqs = self._take_waiting()
        for r in reqs:
            r.start_version = self.weight_version  # the version that makes its first token
        ids, mask, pos = prefill_inputs([r.input_ids for r in reqs], self.pad_id, self.cfg.device)
        cache = BatchState.new_cache(self.model)
        extra: dict[str, Any] = {}
        next_pos = mask.sum(-1)
        if self.vision is not None:
            parts = [r.images for r in reqs if r.images is not None]
            images = None
            if parts:
                images = ImageInputs(
                    torch.cat([p.pixel_values for p in parts]),
                    torch.cat([p.image_grid_thw for p in parts]),
                ).to(self.cfg.device)
                extra = {
                    "pixel_values": images.pixel_values,
                    "image_grid_thw": images.image_grid_thw,
                }
            pos, delta = mrope_positions(self.model, ids, mask, images)  # (3, B, P), (B,)
            next_pos = next_pos + delta.to(next_pos.device)
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=pos,
            use_cache=True,
            logits_to_keep=1,
            **extra,
            **{self._cache_kw: cache},
        )
        self._count_forward(len(reqs), "prefill_forwards")
        batch = BatchState(
            reqs=reqs,
            cache=cache,
            mask=mask,
            next_pos=next_pos,
            last_tokens=ids.new_zeros(len(reqs)),
        )
        fresh = self._advance(batch, out.logits[:, -1])
        if fresh is not None:
            self._batch = fresh if self._batch is None else self._batch.merge(fresh)

    @torch.inference_mode()
    def _decode(self) -> None:
        batch = self._batch
        assert batch is not None
        ids, mask, pos = batch.decode_inputs()
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=pos,
            use_cache=True,
            **{self._cache_kw: batch.cache},
        )
        batch.mask = mask
        batch.next_pos = batch.next_pos + 1
        self._count_forward(batch.size, "decode_steps")
        self._batch = self._advance(batch, out.logits[:, -1])

    def _advance(self, batch: BatchState, logits: torch.Tensor) -> BatchState | None:
        """Sample one token per row, finish rows that are done, return the rows that go on."""
        rows = [r.row for r in batch.reqs]
        if self._suppress is not None:  # image-only tokens: never sampled (agentrl.vision)
            logits = logits.index_fill(-1, self._suppress, float("-inf"))
        sampled = sample_rows(logits, rows)  # type: ignore[arg-type]
        keep: list[int] = []
        for i, req in enumerate(batch.reqs):
            tok = sampled.tokens[i]
            req.output_ids.append(tok)
            req.logprobs.append(sampled.logprobs[i])
            if sampled.top[i] is not None:
                req.top.append(sampled.top[i])  # type: ignore[arg-type]
            if req.on_token is not None:
                req.on_token(tok)
            reason = self._finish_reason(req, tok)
            if reason is None:
                keep.append(i)
            else:
                self._finish(req, reason)
        self.stats["tokens_generated"] += batch.size
        batch.last_tokens = torch.tensor(sampled.tokens, dtype=torch.long, device=logits.device)
        if not keep:
            return None
        return batch if len(keep) == batch.size else batch.select(keep)

    def _finish_reason(self, req: RunnerRequest, tok: int) -> dict[str, object] | None:
        p = req.params
        if tok in p.stop_token_ids or (not p.ignore_eos and tok in self.eos_ids):
            return finish_reason_dict("stop", matched=tok)
        n = len(req.output_ids)
        if n >= p.max_new_tokens:
            return finish_reason_dict("length", length=p.max_new_tokens)
        if p.stop_strings:
            width = max(len(s) for s in p.stop_strings) + 2
            tail = self.tokenizer.decode(req.output_ids[-width:], skip_special_tokens=False)
            for s in p.stop_strings:
                if s in tail:
                    return finish_reason_dict("stop", matched=s)
        if len(req.input_ids) + n >= self.max_context:
            return finish_reason_dict("length", length=n)
        return None

    def _count_forward(self, size: int, key: str) -> None:
        self.stats[key] += 1
        if size > 1:
            self.stats["batched_forwards"] += 1
        self.stats["max_batch_seen"] = max(self.stats["max_batch_seen"], size)

    def _result(
        self, req: RunnerRequest, reason: dict[str, object], error: str | None = None
    ) -> RunnerResult:
        versions = None
        if req.version_marks:
            versions, v, marks = [], req.start_version, iter(req.version_marks)
            mark = next(marks, None)
            for i in range(len(req.output_ids)):
                while mark is not None and mark[0] <= i:
                    v, mark = mark[1], next(marks, None)
                versions.append(v)
        return RunnerResult(
            rid=req.rid,
            output_ids=req.output_ids,
            output_logprobs=req.logprobs,
            finish_reason=reason,
            weight_version=self.weight_version,
            output_versions=versions,
            prompt_tokens=len(req.input_ids),
            top_logprobs=req.top if req.params.top_logprobs else None,
            error=error,
        )

    def _finish(
        self, req: RunnerRequest, reason: dict[str, object], error: str | None = None
    ) -> None:
        self._by_rid.pop(req.rid, None)
        self.stats["requests_finished"] += 1
        try:
            req.on_done(self._result(req, reason, error))
        except Exception:
            logger.exception("on_done callback failed for %s", req.rid)

    def _abort(self, rid: str | None, message: str, error: str | None = None) -> int:
        doomed = [r for r in self._by_rid.values() if rid is None or r.rid == rid]
        if not doomed:
            return 0
        ids = {id(r) for r in doomed}
        self._waiting = deque(r for r in self._waiting if id(r) not in ids)
        self._remove_running(ids)
        for req in doomed:
            self._finish(req, finish_reason_dict("abort", message=message), error)
        return len(doomed)

    def _fail_all(self, message: str) -> None:
        self._abort(None, message, error=message)


def _default_threads(device: str) -> int:
    if device.startswith("cuda"):
        return 2
    return max(1, available_cpus() - 1)


def _cache_keyword(model: Any) -> str:
    """The forward argument that takes the KV cache: ``cache`` (recent transformers, e.g. 5.24)
    or ``past_key_values`` (older ones, e.g. 5.17). A wrong name is swallowed by ``**kwargs`` and the model
    silently builds a cache of its own, so look it up instead of guessing."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _eos_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    ids: set[int] = set()
    for source in (
        getattr(model.generation_config, "eos_token_id", None),
        getattr(model.config.get_text_config(), "eos_token_id", None),
        tokenizer.eos_token_id,
    ):
        if isinstance(source, int):
            ids.add(source)
        elif isinstance(source, list | tuple):
            ids.update(int(x) for x in source)
    return frozenset(ids)
