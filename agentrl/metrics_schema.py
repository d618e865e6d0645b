"""One schema for what a training step costs: timings, throughput and driver traffic.

    timer = Timer()
    with timer.time("generate"): ...                              # -> timing/generate_s
    counts = StepCounts(gen_tokens=..., train_tokens=..., samples=...)
    metrics = step_metrics(timer.pop(), step_s=..., counts=counts)

Keys (every loop that trains, RL or SFT, reports them the same way; later work - async
rollouts, GPU generation, more nodes - adds phases and keys here, never a second spelling):

``timing/<phase>_s``
    Wall-clock seconds of one phase of the step (``Timer``). The RL driver's phases, in order:
    ``generate`` (rollouts, group filtering included), ``baseline`` (ReMax greedy rollouts),
    ``logprob`` (old/ref logprobs and values), ``adv`` (rewards and advantages), ``update``
    (critic and policy), ``sync`` (weights to the inference servers). SFT has ``update``.
``timing/step_s``
    The whole step, phases and the driver's glue between them.
``throughput/gen_tokens``, ``throughput/gen_tokens_per_s``
    Tokens the inference servers generated in the ``generate`` phase (every rollout collected,
    also those that group filtering dropped), and that count / ``timing/generate_s``.
``throughput/train_tokens``, ``throughput/train_tokens_per_s``
    Real (non-padding) tokens fed through the trained model's forward and backward passes in
    the ``update`` phase (the batch's tokens x PPO epochs; SFT: the batch's tokens), and that
    count / ``timing/update_s``.
``throughput/samples_per_s``
    Trajectories (RL) or conversations (SFT) of the step / ``timing/step_s``.
``driver/bytes_out``, ``driver/bytes_in``
    Bytes the driver put into the Ray object store for the workers, and fetched back from
    them, during the step (``agentrl.distributed.traffic``; the weight sync's
    ``named_weights`` is part of ``bytes_in``).

``driver/generate_cpu_s``
    ``train.mode: sync`` without rollout workers only: CPU seconds the driver's own thread
    spent in the ``generate`` phase (prompts, tokenization, HTTP, env steps and rewards of
    every rollout). Near
    ``timing/generate_s``, collection is bound by the driver's Python, not by the servers.
``inference/engine_busy_s``, ``inference/engine_prefill_s``, ``inference/engine_decode_s``,
``inference/prefill_forwards``, ``inference/decode_steps``
    Embedded servers, summed over them: what their engines did since the previous step's
    report (``/get_server_info``): seconds the engine thread had work (prefill and decode
    forwards among it; the dynamic engine does not split its time, so it reports no
    prefill/decode seconds) and how many prefill forwards and decode steps it ran. In
    ``sync``, against ``timing/generate_s`` this says how much of generation the engines were
    computing; in the overlapped modes the work is for whichever batches were in flight, and
    against ``timing/step_s`` it says how busy the servers were.

``async/staleness_mean``, ``async/staleness_max``, ``async/staleness_frac_<k>``
    ``train.mode`` one_step_off and async only: how many weight versions the trained policy is
    ahead of the version that generated each trained (loss-mask) token; the mean, the maximum
    and the histogram as the fraction of trained tokens at staleness k (k = 0 .. the mode's
    bound). The maximum never exceeds the bound (the driver stops with an error if it would).
``async/buffer_groups``, ``async/in_flight_groups``
    When the step took its batch: finished groups waiting for a later step (the buffer's
    depth), and groups still generating.
``async/overlap_s``
    How long of the step's training (logprobs, advantages, update: the trainer's side) some
    rollout of a later batch was generating meanwhile: the overlap that the mode buys.
``async/trainer_wait_s``, ``async/generation_idle_s``
    The trainer's idle time (waiting for its batch; also ``timing/generate_s``) and the time
    since the last step in which no rollout was in flight (generation idle, e.g. held back by
    admission control).

A rate whose time or count is missing or zero is left out rather than logged as 0 or inf.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "BUFFER_GROUPS",
    "BYTES_IN",
    "BYTES_OUT",
    "ENGINE_COUNTERS",
    "GENERATE_CPU_S",
    "GENERATION_IDLE_S",
    "GEN_TOKENS",
    "GEN_TOKENS_PER_S",
    "IN_FLIGHT_GROUPS",
    "OVERLAP_S",
    "PHASES",
    "SAMPLES_PER_S",
    "STALENESS_MAX",
    "STALENESS_MEAN",
    "STEP_S",
    "TRAINER_WAIT_S",
    "TRAIN_TOKENS",
    "TRAIN_TOKENS_PER_S",
    "StepCounts",
    "staleness_frac_key",
    "step_metrics",
    "timing_key",
]

PHASES: tuple[str, ...] = ("generate", "baseline", "logprob", "adv", "update", "sync")
"""The RL driver's timed phases, in step order (``timing/<phase>_s``)."""

STEP_S = "timing/step_s"
GEN_TOKENS = "throughput/gen_tokens"
GEN_TOKENS_PER_S = "throughput/gen_tokens_per_s"
TRAIN_TOKENS = "throughput/train_tokens"
TRAIN_TOKENS_PER_S = "throughput/train_tokens_per_s"
SAMPLES_PER_S = "throughput/samples_per_s"
BYTES_OUT = "driver/bytes_out"
BYTES_IN = "driver/bytes_in"
GENERATE_CPU_S = "driver/generate_cpu_s"
ENGINE_COUNTERS: dict[str, str] = {
    "busy_s": "inference/engine_busy_s",
    "prefill_s": "inference/engine_prefill_s",
    "decode_s": "inference/engine_decode_s",
    "prefill_forwards": "inference/prefill_forwards",
    "decode_steps": "inference/decode_steps",
}
"""An embedded engine's cumulative counters (``engine.info()``) -> their per-step metric."""
STALENESS_MEAN = "async/staleness_mean"
STALENESS_MAX = "async/staleness_max"
BUFFER_GROUPS = "async/buffer_groups"
IN_FLIGHT_GROUPS = "async/in_flight_groups"
TRAINER_WAIT_S = "async/trainer_wait_s"
GENERATION_IDLE_S = "async/generation_idle_s"
OVERLAP_S = "async/overlap_s"


def staleness_frac_key(k: int) -> str:
    """``async/staleness_frac_<k>``: the fraction of trained tokens k versions old."""
    return f"async/staleness_frac_{k}"


def timing_key(phase: str) -> str:
    """``timing/<phase>_s``, the key ``Timer.time(phase)`` reports."""
    return f"timing/{phase}_s"


@dataclass(frozen=True, slots=True)
class StepCounts:
    """What one step processed; ``step_metrics`` divides it by the matching phase's time."""

    gen_tokens: int = 0
    """Tokens generated by the inference servers (``generate`` phase)."""
    train_tokens: int = 0
    """Real tokens through forward + backward of the trained model (``update`` phase)."""
    samples: int = 0
    """Trajectories (RL) or conversations (SFT) in the step."""


def step_metrics(
    timings: Mapping[str, float], *, step_s: float, counts: StepCounts
) -> dict[str, float]:
    """``timings`` (``timing/<phase>_s`` from ``Timer.pop``) plus ``timing/step_s`` and the
    throughput keys of this module's docstring."""
    out = {**timings, STEP_S: step_s}
    if counts.gen_tokens:
        out[GEN_TOKENS] = float(counts.gen_tokens)
        _rate(out, GEN_TOKENS_PER_S, counts.gen_tokens, timings.get(timing_key("generate")))
    if counts.train_tokens:
        out[TRAIN_TOKENS] = float(counts.train_tokens)
        _rate(out, TRAIN_TOKENS_PER_S, counts.train_tokens, timings.get(timing_key("update")))
    _rate(out, SAMPLES_PER_S, counts.samples, step_s)
    return out


def _rate(out: dict[str, float], key: str, count: int, seconds: float | None) -> None:
    if count > 0 and seconds is not None and seconds > 0 and math.isfinite(seconds):
        out[key] = count / seconds
