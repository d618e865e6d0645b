"""Interrupting requests around a weight update (``InferenceClient.begin_interrupt``, issue 23).

Against the embedded server (the SGLang protocol: ``/pause_generation`` with abort,
``/continue_generation``) as a real process: a request in flight is aborted by the pause, waits
while the weights change, then asks for the rest of its tokens with its partial tokens
appended to its prompt. The caller gets one completion of the full length whose first tokens
were sampled by the old weights (their logprobs equal a teacher-forced forward of the old
model) and the rest by the new ones (equal to the new model's), tagged with each version.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from agentrl.inference.client import InferenceClient
from agentrl.inference.launch import ServerProcess
from agentrl.inference.protocol import Completion, SamplingParams, continuation, join_completions
from tests.conftest import process_env
from tests.inference.test_inference_server import teacher_forced, wait_running

N = 400  # long enough that the pause lands mid-generation on a tiny model


def _model(path: Path) -> Any:
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


async def test_an_interrupted_request_goes_on_under_the_new_weights(
    server: ServerProcess, tiny_model: Path, tiny_model_b: Path
) -> None:
    prompt = [5, 6, 7, 8]
    sp = SamplingParams(max_new_tokens=N, temperature=1.0, seed=7, ignore_eos=True)
    async with InferenceClient([server.url]) as client:
        task = asyncio.create_task(client.generate(prompt, sp, session_id="traj"))
        await wait_running(server.url)
        client.begin_interrupt()
        await client.pause("abort")
        # a request that starts during the interrupt waits for its end
        late = asyncio.create_task(
            client.generate(prompt, SamplingParams(max_new_tokens=3, temperature=0))
        )
        await client.update_weights_from_disk(str(tiny_model_b), version=1)
        await asyncio.sleep(0.2)
        assert not task.done() and not late.done()  # both held while the weights change
        await client.resume()
        client.end_interrupt()
        done, after = await task, await late
        try:
            assert client.resumed_requests == 1
        finally:  # the module's other tests expect the first weights
            await client.update_weights_from_disk(str(tiny_model), version=2)
    assert done.finish_reason == "length" and len(done.output_ids) == N
    assert len(done.output_logprobs) == N and len(done.output_versions) == N
    k = done.output_versions.count(0)
    assert 0 < k < N, "the pause did not land mid-generation"
    assert done.output_versions == [0] * k + [1] * (N - k)
    assert done.weight_version == 1 and done.prompt_tokens == len(prompt)
    assert after.weight_version == 1 and len(after.output_ids) == 3
    out = done.output_ids
    old = teacher_forced(_model(tiny_model), prompt, out[:k], 1.0)
    new = teacher_forced(_model(tiny_model_b), prompt + out[:k], out[k:], 1.0)
    assert torch.tensor(done.output_logprobs[:k]) == pytest.approx(old, abs=1e-4)
    assert torch.tensor(done.output_logprobs[k:]) == pytest.approx(new, abs=1e-4)


def test_join_and_continuation_keep_versions_and_change_the_seed() -> None:
    first = Completion(
        output_ids=[1, 2], output_logprobs=[-0.1, -0.2], finish_reason="abort",
        weight_version=3, prompt_tokens=5, latency_s=0.5,
    )  # fmt: skip
    rest = Completion(
        output_ids=[9], output_logprobs=[-0.9], finish_reason="length", weight_version=4,
        prompt_tokens=7, latency_s=0.25,
    )  # fmt: skip
    both = join_completions(first, rest)
    assert both.output_ids == [1, 2, 9] and both.output_logprobs == [-0.1, -0.2, -0.9]
    assert both.output_versions == [3, 3, 4] and both.weight_version == 4
    assert both.finish_reason == "length" and both.prompt_tokens == 5 and both.latency_s == 0.75
    sp = SamplingParams(max_new_tokens=10, seed=11, temperature=0.5)
    more = continuation(sp, 8, 2)
    assert more.max_new_tokens == 8 and more.temperature == 0.5
    assert more.seed is not None and more.seed != 11 and more.seed == continuation(sp, 8, 2).seed
    assert continuation(SamplingParams(max_new_tokens=4), 2, 2).seed is None


def test_server_processes_have_nvlink_multicast_off(server: ServerProcess) -> None:
    """The server's process environment holds ``agentrl.gpu_env.MULTICAST_OFF`` (issue 27)."""
    from agentrl.gpu_env import MULTICAST_OFF

    env = process_env(server.pid)
    assert {k: env.get(k) for k in MULTICAST_OFF} == MULTICAST_OFF
