"""The embedded server on a CUDA device gives the CPU server's tokens and logprobs (gpu marker)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from agentrl.inference.client import InferenceClient
from agentrl.inference.launch import ServerProcess
from agentrl.inference.protocol import Completion, SamplingParams

pytestmark = pytest.mark.gpu


async def _generate(url: str, prompts: list[list[int]], sp: SamplingParams) -> list[Completion]:
    async with InferenceClient([url]) as client:
        return list(await asyncio.gather(*(client.generate(p, sp) for p in prompts)))


def test_cuda_server_matches_cpu_server(tiny_model: Path, tmp_path: Path) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    prompts = [[5, 6, 7, 10 + i] for i in range(12)]  # batched: prefill, decode, select, merge
    greedy = SamplingParams(max_new_tokens=16, temperature=0.0)
    sampled = SamplingParams(max_new_tokens=16, temperature=1.0, top_p=0.9, top_k=20, seed=7)
    results = {}
    for device in ("cpu", "cuda"):
        cfg = ServerProcess.Config(
            model=str(tiny_model),
            log_path=str(tmp_path / f"{device}.log"),
            num_threads=1,
            extra_args=["--device", device],
        )
        with ServerProcess(cfg) as proc:
            results[device] = (
                asyncio.run(_generate(proc.url, prompts, greedy)),
                asyncio.run(_generate(proc.url, prompts, sampled)),
            )
    for cpu, gpu in zip(results["cpu"][0], results["cuda"][0], strict=True):
        assert gpu.output_ids == cpu.output_ids
        pairs = zip(gpu.output_logprobs, cpu.output_logprobs, strict=True)
        diff = max(abs(a - b) for a, b in pairs)
        assert diff < 1e-4
    same = sum(
        g.output_ids == c.output_ids
        for c, g in zip(results["cpu"][1], results["cuda"][1], strict=True)
    )
    assert same >= len(prompts) - 1  # seeded draws are the same; a near-tie may flip one
