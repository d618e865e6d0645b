"""The static engine in-process on CPU: slot cache, batched prefill and decode, device sampling.

Checks what could break: logprobs against a teacher-forced HF forward (fp32, <= 1e-5), tokens
equal to the dynamic engine's greedy ones, seeded draws independent of the batch, requests
queueing when slots run out, slots reused after rows leave (the compaction moves), weight
updates seen by the next step, aborts, and a clear error for a cache that holds nothing.
"""

from __future__ import annotations

import concurrent.futures
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from agentrl.errors import ConfigError
from agentrl.inference.buckets import cache_shape, decode_buckets, graph_key
from agentrl.inference.device_sampling import sample_on_device, uniforms
from agentrl.inference.runner import ModelRunner
from agentrl.inference.runner_types import RequestParams, RunnerRequest, RunnerResult
from agentrl.inference.static_runner import StaticRunner, build_runner
from agentrl.inference.weights import apply_named_tensors
from agentrl.tiny import make_tiny_model


@pytest.fixture(scope="module")
def llama_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("static") / "llama", arch="llama", seed=3)


@pytest.fixture(scope="module")
def qwen3_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen3 (q/k norms before the rotary embedding), the tiny tokenizer's files."""
    import shutil

    from transformers import Qwen3Config, Qwen3ForCausalLM

    root = tmp_path_factory.mktemp("qwen3")
    base = make_tiny_model(root / "base", arch="llama", seed=3)
    c = AutoModelForCausalLM.from_pretrained(base).config
    torch.manual_seed(3)
    model = Qwen3ForCausalLM(
        Qwen3Config(
            vocab_size=c.vocab_size,
            hidden_size=c.hidden_size,
            intermediate_size=c.intermediate_size,
            num_hidden_layers=c.num_hidden_layers,
            num_attention_heads=c.num_attention_heads,
            num_key_value_heads=c.num_key_value_heads,
            head_dim=c.hidden_size // c.num_attention_heads,
            max_position_embeddings=c.max_position_embeddings,
            eos_token_id=c.eos_token_id,
            pad_token_id=c.pad_token_id,
        )
    )
    out = root / "qwen3"
    model.save_pretrained(out)
    for f in base.iterdir():
        if "token" in f.name or f.suffix == ".jinja":
            shutil.copy(f, out / f.name)
    return out


def _runner(model: Path, engine: str = "static", overlap: bool = False, **kw: Any) -> ModelRunner:
    """``overlap``: decode ahead (each step launched before the previous one is read), the
    CUDA-graph path's loop, run on CPU."""
    cfg = ModelRunner.Config(model=str(model), num_threads=1, engine=engine, **kw)  # type: ignore[arg-type]
    runner = build_runner(cfg)
    if overlap:
        assert isinstance(runner, StaticRunner)
        runner.overlap = True
    runner.start()
    return runner


def _send(
    runner: ModelRunner, prompts: list[list[int]], params: list[RequestParams], tag: str = "r"
) -> list[concurrent.futures.Future[RunnerResult]]:
    futs: list[concurrent.futures.Future[RunnerResult]] = []
    for i, (p, sp) in enumerate(zip(prompts, params, strict=True)):
        fut: concurrent.futures.Future[RunnerResult] = concurrent.futures.Future()
        futs.append(fut)
        runner.submit(
            RunnerRequest(rid=f"{tag}{i}", input_ids=p, params=sp, on_done=fut.set_result)
        )
    return futs


def _submit(
    runner: ModelRunner, prompts: list[list[int]], params: list[RequestParams], tag: str = "r"
) -> list[RunnerResult]:
    return [f.result(timeout=120) for f in _send(runner, prompts, params, tag)]


def _teacher_forced(model: Any, prompt: list[int], out: list[int], temp: float) -> torch.Tensor:
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + out])).logits[0, len(prompt) - 1 : -1]
    if temp > 0:
        logits = logits / temp
    return torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(out)[:, None])[:, 0]


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(1, 24, (n,), generator=g).tolist()
    return [torch.randint(5, 800, (k,), generator=g).tolist() for k in lens]


@pytest.mark.parametrize(
    ("arch", "overlap", "compiled"),
    [
        ("qwen2", False, False),
        ("llama", False, False),
        ("llama", True, False),
        ("llama", True, True),
        ("qwen3", True, True),
    ],
)
def test_logprobs_match_teacher_forcing_with_rows_joining_and_leaving(
    arch: str,
    overlap: bool,
    compiled: bool,
    tiny_model: Path,
    llama_model: Path,
    qwen3_model: Path,
) -> None:
    """``compiled``: ``compile_pointwise``, its kernels compiled in the engine thread at the
    first prefill and decode step, then reused as rows join and leave (dynamic shapes)."""
    path = {"qwen2": tiny_model, "llama": llama_model, "qwen3": qwen3_model}[arch]
    ref = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    # 12 requests through 5 slots: queueing and slot moves
    runner = _runner(path, overlap=overlap, max_batch_size=5, compile_pointwise=compiled)
    try:
        prompts = _prompts(12)
        temps = [0.0, 1.0, 0.7, 1.3]
        params = [
            RequestParams(
                max_new_tokens=3 + (i * 7) % 17,
                temperature=temps[i % 4],
                top_p=0.9 if i % 3 == 0 else 1.0,
                top_k=20 if i % 5 == 0 else -1,
                ignore_eos=True,
            )
            for i in range(12)
        ]
        results = _submit(runner, prompts, params)
        for res, p, sp in zip(results, prompts, params, strict=True):
            assert res.error is None and len(res.output_ids) == sp.max_new_tokens
            served = torch.tensor(res.output_logprobs)
            want = _teacher_forced(ref, p, res.output_ids, sp.temperature)
            assert (served - want).abs().max().item() <= 1e-5
        assert runner.stats["max_batch_seen"] == 5
    finally:
        runner.shutdown()


def test_compiled_functions_are_not_compiled_again_for_new_batch_shapes(
    llama_model: Path,
) -> None:
    """``compile_pointwise`` compiles each decoder function for symbolic sizes once (plus the
    one-row and one-token special cases). Sizes that merely match at the first call (a batch
    as large as the cache's slots, a prompt as long as the q/k/v width) must not become
    guards that a later batch breaks: that recompiled for seconds in the middle of serving."""
    from torch._dynamo.utils import counters

    runner = _runner(llama_model, max_batch_size=8, compile_pointwise=True)
    try:
        g = torch.Generator().manual_seed(1)

        def wave(n: int, lo: int, hi: int, tag: str) -> None:
            lens = torch.randint(lo, hi, (n,), generator=g).tolist()
            prompts = [torch.randint(5, 800, (k,), generator=g).tolist() for k in lens]
            # different lengths: the batch shrinks row by row down to one
            params = [RequestParams(max_new_tokens=2 + i, ignore_eos=True) for i in range(n)]
            assert all(r.error is None for r in _submit(runner, prompts, params, tag))

        wave(8, 2, 24, "a")  # 8 rows = 8 slots: the sizes a duck-sizing compiler would tie
        wave(1, 30, 31, "b")  # one row: its own specialization
        compiled = counters["stats"]["unique_graphs"]
        wave(5, 20, 40, "c")
        wave(8, 40, 64, "d")
        wave(3, 9, 12, "e")
        assert counters["stats"]["unique_graphs"] == compiled
    finally:
        runner.shutdown()


def test_greedy_tokens_equal_the_dynamic_engine(tiny_model: Path) -> None:
    prompts = _prompts(6, seed=1)
    params = [RequestParams(max_new_tokens=12, temperature=0.0, ignore_eos=True)] * 6
    outs = {}
    for engine in ("static", "dynamic"):
        runner = _runner(tiny_model, engine)
        try:
            outs[engine] = [r.output_ids for r in _submit(runner, prompts, params)]
        finally:
            runner.shutdown()
    assert outs["static"] == outs["dynamic"]


def test_seeded_sampling_does_not_depend_on_the_batch(tiny_model: Path) -> None:
    sp = RequestParams(max_new_tokens=10, temperature=1.0, top_k=50, seed=11, ignore_eos=True)
    runner = _runner(tiny_model)
    try:
        alone = _submit(runner, [[5, 6, 7]], [sp], "a")[0].output_ids
        crowd = [*_prompts(7, seed=2), [5, 6, 7]]
        others = [RequestParams(max_new_tokens=4, temperature=1.0, ignore_eos=True)] * 7
        batched = _submit(runner, crowd, [*others, sp], "b")[-1].output_ids
        assert alone == batched
    finally:
        runner.shutdown()


def test_weight_update_between_steps_changes_the_next_tokens(
    tiny_model: Path, tiny_model_b: Path
) -> None:
    model_b = AutoModelForCausalLM.from_pretrained(tiny_model_b, dtype=torch.float32).eval()
    runner = _runner(tiny_model)
    try:
        prompt, sp = [5, 9, 11], RequestParams(max_new_tokens=6, temperature=0.0, ignore_eos=True)
        before = _submit(runner, [prompt], [sp], "x")[0]

        def update() -> int:
            apply_named_tensors(runner.model, dict(model_b.state_dict()))
            return runner.set_weight_version(None)

        assert runner.call(update).result(timeout=60) == 1
        after = _submit(runner, [prompt], [sp], "y")[0]
        assert after.weight_version == 1
        want = _teacher_forced(model_b, prompt, after.output_ids, 0.0)
        assert (torch.tensor(after.output_logprobs) - want).abs().max().item() <= 1e-5
        assert after.output_logprobs != pytest.approx(before.output_logprobs, abs=1e-3)
    finally:
        runner.shutdown()


def test_new_weights_without_a_new_version_never_reuse_older_kv(
    tiny_model: Path, tiny_model_b: Path
) -> None:
    """SGLang's collective update without ``weight_version`` overwrites the weights and keeps
    the version: a conversation's next turn must not copy its first turn's parked KV (made by
    the old weights), or its logprobs are the old model's."""
    model_b = AutoModelForCausalLM.from_pretrained(tiny_model_b, dtype=torch.float32).eval()
    runner = _runner(tiny_model)
    assert isinstance(runner, StaticRunner)
    try:
        sp = RequestParams(max_new_tokens=6, temperature=1.0, ignore_eos=True, seed=2)
        turn1 = list(range(40, 80))
        first = _submit(runner, [turn1], [sp], "t1")[0]
        assert runner.pool.entries  # turn 1's KV is parked

        def overwrite() -> None:
            apply_named_tensors(runner.model, dict(model_b.state_dict()))
            runner.weights_changed()

        runner.call(overwrite).result(timeout=60)
        hits = runner.stats["pool_hit_tokens"]
        turn2 = [*turn1, *first.output_ids, 7, 8, 9]
        second = _submit(runner, [turn2], [sp], "t2")[0]
        assert second.weight_version == first.weight_version == 0
        assert runner.stats["pool_hit_tokens"] == hits  # nothing copied from before
        want = _teacher_forced(model_b, turn2, second.output_ids, 1.0)
        assert (torch.tensor(second.output_logprobs) - want).abs().max().item() <= 1e-5
    finally:
        runner.shutdown()


def test_abort_frees_the_slot_for_waiting_requests(tiny_model: Path) -> None:
    runner = _runner(tiny_model, max_batch_size=1)
    try:
        long = RequestParams(max_new_tokens=3000, temperature=0.0, ignore_eos=True)
        short = RequestParams(max_new_tokens=2, temperature=0.0, ignore_eos=True)
        first: concurrent.futures.Future[RunnerResult] = concurrent.futures.Future()
        runner.submit(
            RunnerRequest(rid="long", input_ids=[5], params=long, on_done=first.set_result)
        )
        second: concurrent.futures.Future[RunnerResult] = concurrent.futures.Future()
        runner.submit(
            RunnerRequest(rid="short", input_ids=[6], params=short, on_done=second.set_result)
        )
        assert runner.abort("long").result(timeout=60) == 1
        assert first.result(timeout=60).finish_reason["type"] == "abort"
        assert len(second.result(timeout=60).output_ids) == 2
    finally:
        runner.shutdown()


def test_cache_size_follows_the_budget_and_refuses_an_empty_one(tiny_model: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    per_token = 2 * 2 * 2 * 16 * 4  # k and v, 2 layers, 2 kv heads, head_dim 16, fp32
    budget = 3 * 100 * per_token / 2**30
    cfg = ModelRunner.Config(model="m", max_seq_len=100, kv_cache_gb=budget, max_batch_size=8)
    assert cache_shape(cfg, model, torch.float32) == (3, 100)
    tiny = ModelRunner.Config(model="m", max_seq_len=100, kv_cache_gb=1e-9)
    with pytest.raises(ConfigError, match="kv_cache_gb"):
        cache_shape(tiny, model, torch.float32)


@pytest.mark.parametrize(
    ("slots", "max_len"), [(1, 16), (3, 64), (8, 100), (64, 512), (100, 1000), (256, 8192)]
)
def test_decode_buckets_are_every_graph_a_decode_step_can_ask_for(slots: int, max_len: int) -> None:
    """``capture_graphs`` eager captures ``decode_buckets`` at start: a bucket missing there
    would be captured in the middle of traffic, one never asked for would waste memory."""
    buckets = decode_buckets(slots, max_len)
    assert len(buckets) == len(set(buckets))
    # a step runs 1..slots rows and attends 1..max_len positions (max(lens) + 1 <= max_len)
    rows = {graph_key(b, 1, slots, max_len)[0] for b in range(1, slots + 1)}
    keys = {graph_key(1, k, slots, max_len)[1] for k in range(1, max_len + 1)}
    assert set(buckets) == {(r, k) for r in rows for k in keys}
    if slots * max_len <= 10_000:  # every pair, not just the two components
        asked = {
            graph_key(b, k, slots, max_len)
            for b in range(1, slots + 1)
            for k in range(1, max_len + 1)
        }
        assert asked == set(buckets)
    assert max(r for r, _ in buckets) == slots and max(k for _, k in buckets) == max_len


def test_capture_graphs_is_a_no_op_on_cpu(tiny_model: Path) -> None:
    runner = _runner(tiny_model, capture_graphs="all", max_seq_len=64, max_batch_size=4)
    try:
        assert isinstance(runner, StaticRunner) and not runner.use_graphs
        assert runner.capture_all(filtering=True) == 0
        sp = RequestParams(max_new_tokens=4, temperature=0.0, ignore_eos=True)
        assert len(_submit(runner, [[5, 6, 7]], [sp])[0].output_ids) == 4
        info = runner.info()
        assert info["graphs_captured"] == 0 and info["graphs_at_start"] == 0
        assert info["capture_s"] == 0.0
    finally:
        runner.shutdown()
    with pytest.raises(ConfigError, match="capture_graphs"):
        _runner(tiny_model, capture_graphs="sometimes")


@torch.inference_mode()
def test_a_filtering_step_over_free_slots_draws_valid_tokens(tiny_model: Path) -> None:
    """A CUDA graph runs the rows bucket, so its padding rows are free slots; in a top-k/top-p
    graph they must draw a valid token (a top-k of 0 drew index -1: a device assert)."""
    runner = _runner(tiny_model, max_seq_len=64, max_batch_size=4)
    try:
        assert isinstance(runner, StaticRunner)
        for sync in (False, True):  # the state at start, then as rebuilt between steps
            if sync:
                runner._sync_rows()
            tokens, _, _ = runner._step(runner.cache.slots, 64, filtering=True)
            assert ((tokens >= 0) & (tokens < runner.vocab_size)).all()
    finally:
        runner.shutdown()


def test_prompt_longer_than_a_slot_finishes_at_the_slot_length(tiny_model: Path) -> None:
    runner = _runner(tiny_model, max_seq_len=16)
    try:
        assert isinstance(runner, StaticRunner) and runner.max_context == 16
        sp = RequestParams(max_new_tokens=50, temperature=0.0, ignore_eos=True)
        res = _submit(runner, [list(range(5, 15))], [sp])[0]
        assert len(res.output_ids) == 6 and res.finish_reason["type"] == "length"
    finally:
        runner.shutdown()


def test_device_sampling_is_greedy_at_zero_and_filters_top_k() -> None:
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0))
    temp = torch.tensor([0.0, 1.0, 1.0, 1.0])
    top_k = torch.tensor([50, 1, 50, 50])
    top_p = torch.tensor([1.0, 1.0, 1e-6, 1.0])
    seeds, draws = torch.arange(4), torch.zeros(4, dtype=torch.long)
    tokens, lp, logp = sample_on_device(logits, temp, top_p, top_k, seeds, draws, True)
    assert tokens[:3].tolist() == logits[:3].argmax(-1).tolist()
    assert torch.allclose(lp, logp.gather(1, tokens[:, None])[:, 0])
    u = uniforms(torch.tensor([1, 1, 2, -5]), torch.tensor([0, 1, 0, 0]))
    assert ((u >= 0) & (u < 1)).all() and len(set(u.tolist())) == 4


def test_group_prompts_reuse_the_running_prefix_and_match_teacher_forcing(
    tiny_model: Path,
) -> None:
    ref = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    runner = _runner(tiny_model)
    try:
        prompt = _prompts(1, seed=5)[0] * 4 + list(range(10, 40))  # > MIN_REUSE tokens
        sp = RequestParams(max_new_tokens=12, temperature=1.0, ignore_eos=True)
        turn2 = [*prompt, 7, 8, 9]  # a longer prompt sharing the whole first one
        results = _submit(runner, [prompt] * 4 + [turn2], [sp] * 5, "g")
        for res, p in zip(results, [prompt] * 4 + [turn2], strict=True):
            want = _teacher_forced(ref, p, res.output_ids, 1.0)
            assert (torch.tensor(res.output_logprobs) - want).abs().max().item() <= 1e-5
        info = runner.info()
        assert runner.stats["prefix_hit_tokens"] >= 3 * (len(prompt) - 1)
        assert 0.5 < info["prefix_hit_rate"] < 1.0
        assert len({tuple(r.output_ids) for r in results[:4]}) > 1  # own seeds, own tokens
    finally:
        runner.shutdown()


def test_prefix_made_by_older_weights_is_not_reused(tiny_model: Path, tiny_model_b: Path) -> None:
    model_b = AutoModelForCausalLM.from_pretrained(tiny_model_b, dtype=torch.float32).eval()
    runner = _runner(tiny_model)
    try:
        prompt = list(range(20, 60))
        long = RequestParams(max_new_tokens=3000, temperature=0.0, ignore_eos=True)
        first: concurrent.futures.Future[RunnerResult] = concurrent.futures.Future()
        runner.submit(
            RunnerRequest(rid="old", input_ids=prompt, params=long, on_done=first.set_result)
        )

        def update() -> int:
            apply_named_tensors(runner.model, dict(model_b.state_dict()))
            return runner.set_weight_version(None)

        while not runner.info()["running"]:
            time.sleep(0.01)
        runner.call(update).result(timeout=60)  # "old" runs on, its prompt KV from version 0
        sp = RequestParams(max_new_tokens=6, temperature=0.0, ignore_eos=True)
        after = _submit(runner, [prompt], [sp], "new")[0]
        assert runner.stats["prefix_hit_tokens"] == 0
        want = _teacher_forced(model_b, prompt, after.output_ids, 0.0)
        assert (torch.tensor(after.output_logprobs) - want).abs().max().item() <= 1e-5
        runner.abort("old").result(timeout=60)
    finally:
        runner.shutdown()


def test_decoding_ahead_keeps_stops_top_logprobs_and_versions(
    tiny_model: Path, tiny_model_b: Path
) -> None:
    """The overlapped loop reads a step after launching the next: a row that stops at the
    earlier step must not get the later step's token, top_logprobs still come, and a weight
    update between steps tags the tokens after it."""
    model_b = AutoModelForCausalLM.from_pretrained(tiny_model_b, dtype=torch.float32).eval()
    prompts = _prompts(8, seed=7)
    free = [RequestParams(max_new_tokens=40, temperature=1.0, seed=i) for i in range(8)]
    runs = {}
    for overlap in (False, True):
        runner = _runner(tiny_model, overlap=overlap, max_batch_size=4)
        try:
            runs[overlap] = _submit(runner, prompts, free, f"o{overlap}")
        finally:
            runner.shutdown()
    # stop on the 3rd token each request drew: both loops must end every row right there
    stops = [
        RequestParams(
            max_new_tokens=40,
            temperature=1.0,
            seed=i,
            stop_token_ids=frozenset([r.output_ids[2]]) if len(r.output_ids) > 3 else frozenset(),
            top_logprobs=3 if i == 5 else 0,
        )
        for i, r in enumerate(runs[False])
    ]
    runner = _runner(tiny_model, overlap=True, max_batch_size=4)
    try:
        stopped = _submit(runner, prompts, stops, "s")
        for res, base in zip(stopped, runs[False], strict=True):
            cut = base.output_ids.index(base.output_ids[2]) + 1 if len(base.output_ids) > 3 else 40
            assert res.output_ids == base.output_ids[:cut]
            assert res.output_logprobs == pytest.approx(base.output_logprobs[:cut], abs=1e-5)
        assert [r.output_ids for r in runs[True]] == [r.output_ids for r in runs[False]]
        top = stopped[5].top_logprobs
        assert top is not None and len(top) == len(stopped[5].output_ids)
        assert stopped[4].top_logprobs is None
        long = RequestParams(max_new_tokens=3000, temperature=0.0, ignore_eos=True)
        fut: concurrent.futures.Future[RunnerResult] = concurrent.futures.Future()
        runner.submit(RunnerRequest(rid="v", input_ids=[5, 6], params=long, on_done=fut.set_result))
        while not runner.info()["running"]:
            time.sleep(0.01)

        def update() -> int:
            apply_named_tensors(runner.model, dict(model_b.state_dict()))
            return runner.set_weight_version(None)

        runner.call(update).result(timeout=60)
        runner.abort("v").result(timeout=60)
        res = fut.result(timeout=60)
        versions = res.output_versions
        assert versions is not None and versions[0] == 0 and versions[-1] == 1
        assert versions == sorted(versions) and len(versions) == len(res.output_ids)
    finally:
        runner.shutdown()


def test_retracted_request_prefills_again_under_the_new_weights(
    tiny_model: Path, tiny_model_b: Path
) -> None:
    """pause(retract) frees the running request's KV; after a weight update and resume, its
    next prefill recomputes prompt and tokens so far with the new weights, so the tokens after
    the update equal a teacher-forced forward of the new model over the whole prefix."""
    model_b = AutoModelForCausalLM.from_pretrained(tiny_model_b, dtype=torch.float32).eval()
    runner = _runner(tiny_model, max_seq_len=128)
    try:
        prompt = [5, 6, 7, 8]
        sp = RequestParams(max_new_tokens=3000, temperature=1.0, seed=4, ignore_eos=True)
        fut: concurrent.futures.Future[RunnerResult] = concurrent.futures.Future()
        runner.submit(RunnerRequest(rid="r", input_ids=prompt, params=sp, on_done=fut.set_result))
        while runner.info()["tokens_generated"] < 3:
            time.sleep(0.001)
        runner.pause("retract").result(timeout=60)
        info = runner.info()
        assert info["running"] == 0 and info["waiting"] == 1 and not fut.done()

        def update() -> int:
            apply_named_tensors(runner.model, dict(model_b.state_dict()))
            return runner.set_weight_version(None)

        runner.call(update).result(timeout=60)
        runner.resume().result(timeout=60)
        res = fut.result(timeout=120)
        assert res.finish_reason["type"] == "length" and len(prompt) + len(res.output_ids) == 128
        versions = res.output_versions
        assert versions is not None and versions == sorted(versions) and versions[0] == 0
        k = versions.index(1)
        assert k >= 3
        want = _teacher_forced(model_b, prompt + res.output_ids[:k], res.output_ids[k:], 1.0)
        assert (torch.tensor(res.output_logprobs[k:]) - want).abs().max().item() <= 1e-5
    finally:
        runner.shutdown()


@pytest.mark.parametrize("overlap", [False, True])
def test_next_turn_reuses_the_finished_turn_from_the_pool_and_matches_teacher_forcing(
    tiny_model: Path, overlap: bool
) -> None:
    """Turn 2 repeats turn 1's prompt and answer: their KV comes from the slot turn 1 left
    (parked in the pool), even after other requests churned through the free slots, and the
    logprobs still equal a teacher-forced forward."""
    ref = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    runner = _runner(tiny_model, overlap=overlap, max_batch_size=4)
    try:
        assert isinstance(runner, StaticRunner)
        sp = RequestParams(max_new_tokens=12, temperature=1.0, ignore_eos=True)
        turn1 = list(range(30, 70))
        # a longer request beside turn 1 moves into turn 1's slot when turn 1 finishes
        longer = RequestParams(max_new_tokens=30, temperature=1.0, ignore_eos=True)
        out1 = _submit(runner, [turn1, list(range(600, 640))], [sp, longer], "t1-")[0].output_ids
        # other traffic through the 4 slots: its prefills land where turn 1 is parked (which
        # then moves up to a free slot)
        others = [list(range(200 + 40 * i, 230 + 40 * i)) for i in range(2)]
        _submit(runner, others, [sp] * 2, "other")
        turn2 = [*turn1, *out1, *range(500, 510)]
        res = _submit(runner, [turn2], [sp], "t2-")[0]
        want = _teacher_forced(ref, turn2, res.output_ids, 1.0)
        assert (torch.tensor(res.output_logprobs) - want).abs().max().item() <= 1e-5
        # turn 1's last token was sampled, never fed: its KV is the one position missing
        assert runner.stats["pool_hit_tokens"] >= len(turn1) + len(out1) - 1
        info = runner.info()
        assert info["pool_hit_rate"] > 0 and info["pool_parked"] >= 4
    finally:
        runner.shutdown()


def test_the_pool_is_dropped_when_the_weights_change(tiny_model: Path, tiny_model_b: Path) -> None:
    model_b = AutoModelForCausalLM.from_pretrained(tiny_model_b, dtype=torch.float32).eval()
    runner = _runner(tiny_model)
    try:
        assert isinstance(runner, StaticRunner)
        sp = RequestParams(max_new_tokens=8, temperature=0.0, ignore_eos=True)
        turn1 = list(range(30, 70))
        out1 = _submit(runner, [turn1], [sp], "t1-")[0].output_ids
        assert len(runner.pool) == 1

        def update() -> int:
            apply_named_tensors(runner.model, dict(model_b.state_dict()))
            return runner.set_weight_version(None)

        runner.call(update).result(timeout=60)
        assert len(runner.pool) == 0
        turn2 = [*turn1, *out1, 5, 6, 7]
        res = _submit(runner, [turn2], [sp], "t2-")[0]
        assert runner.stats["pool_hit_tokens"] == 0
        want = _teacher_forced(model_b, turn2, res.output_ids, 0.0)
        assert (torch.tensor(res.output_logprobs) - want).abs().max().item() <= 1e-5
    finally:
        runner.shutdown()


def test_prefix_pool_off_keeps_nothing(tiny_model: Path) -> None:
    runner = _runner(tiny_model, prefix_pool=False)
    try:
        assert isinstance(runner, StaticRunner)
        sp = RequestParams(max_new_tokens=8, temperature=0.0, ignore_eos=True)
        turn1 = list(range(30, 70))
        out1 = _submit(runner, [turn1], [sp], "t1-")[0].output_ids
        _submit(runner, [[*turn1, *out1, 5, 6]], [sp], "t2-")
        assert len(runner.pool) == 0 and runner.stats["pool_hit_tokens"] == 0
    finally:
        runner.shutdown()


@pytest.mark.parametrize("engine", ["static", "dynamic"])
def test_a_burst_of_requests_starts_as_one_prefill(engine: str, tiny_model: Path) -> None:
    """An idle engine waits for the rest of a burst (requests within batch_quiet_ms of each
    other) before its first prefill; with batch_wait_ms=0 the first request starts alone."""
    sp = RequestParams(max_new_tokens=4, temperature=0.0, ignore_eos=True)
    prompts = _prompts(4, seed=5)
    forwards, held, busy = {}, {}, {}
    for wait_ms in (5000.0, 0.0):
        runner = _runner(tiny_model, engine, batch_wait_ms=wait_ms, batch_quiet_ms=1000.0)
        try:
            futs = _send(runner, prompts[:1], [sp], tag="first")
            time.sleep(0.3)  # the burst's stragglers: within the quiet gap, not at once
            futs += _send(runner, prompts[1:], [sp] * 3, tag="rest")
            assert all(len(f.result(timeout=120).output_ids) == 4 for f in futs)
            forwards[wait_ms] = runner.stats["prefill_forwards"]
            time.sleep(0.05)  # the engine goes idle: its busy time stops growing
            info = runner.info()
            held[wait_ms], busy[wait_ms] = info["gather_s"], info["busy_s"]
            assert runner.info()["busy_s"] == busy[wait_ms]
        finally:
            runner.shutdown()
    assert forwards[5000.0] == 1 and forwards[0.0] >= 2
    # the burst was held back for its straggler, and that counts as busy time
    assert 0.25 < held[5000.0] <= busy[5000.0] and held[0.0] < 0.01 and busy[0.0] > 0


@pytest.mark.parametrize("engine", ["static", "dynamic"])
def test_prefill_every_gathers_late_arrivals_into_one_prefill(
    engine: str, tiny_model: Path
) -> None:
    """While a request decodes, requests arriving a few steps apart are admitted at every step
    boundary (a prefill each) by default, and together with a large ``prefill_every``; the
    tokens are the same either way."""
    long = RequestParams(max_new_tokens=300, temperature=0.0, ignore_eos=True)
    short = RequestParams(max_new_tokens=4, temperature=0.0, ignore_eos=True)
    prompts = _prompts(4, seed=7)
    forwards, outputs = {}, {}
    for every in (1, 10_000):
        runner = _runner(tiny_model, engine, batch_wait_ms=0.0, prefill_every=every)
        try:
            futs = _send(runner, prompts[:1], [long], tag="long")
            for i in range(1, 4):  # each lands at a step boundary of its own
                time.sleep(0.03)
                futs += _send(runner, prompts[i : i + 1], [short], tag=f"late{i}")
            assert not futs[0].done()  # every late request came while the long one ran
            outputs[every] = [f.result(timeout=120).output_ids for f in futs]
            forwards[every] = runner.stats["prefill_forwards"]
        finally:
            runner.shutdown()
    assert outputs[1] == outputs[10_000]
    assert forwards[1] == 4  # the long request's prefill, then one per late arrival
    assert forwards[10_000] == 2  # the late three waited for the long one and went together


def test_bad_batch_wait_is_a_config_error(tiny_model: Path) -> None:
    with pytest.raises(ConfigError, match="batch_wait_ms and batch_quiet_ms must be >= 0"):
        build_runner(ModelRunner.Config(model=str(tiny_model), batch_wait_ms=-1.0))
    with pytest.raises(ConfigError, match="prefill_every must be >= 1"):
        build_runner(ModelRunner.Config(model=str(tiny_model), prefill_every=0))
