"""WeightSync against the embedded server (a real process over HTTP): disk, HTTP tensors and
SGLang's disk API; each push is versioned, changes what is served, and verifies."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from agentrl.errors import ConfigError
from agentrl.inference.client import InferenceClient
from agentrl.inference.launch import ServerProcess
from agentrl.inference.protocol import SamplingParams
from agentrl.inference.weight_sync import (
    DiskWeightSync,
    HTTPTensorWeightSync,
    SGLangWeightSync,
    VLLMWeightSync,
)
from agentrl.tiny import make_tiny_model

PROMPT = [5, 6, 7, 8, 9]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("ws")
    return make_tiny_model(root / "a", seed=0), make_tiny_model(root / "b", seed=1)


@pytest.fixture(scope="module")
def server(models: tuple[Path, Path]) -> Iterator[ServerProcess]:
    with ServerProcess(ServerProcess.Config(model=str(models[0]), num_threads=1)) as proc:
        yield proc


def state(path: Path) -> dict[str, torch.Tensor]:
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).state_dict()


async def logprobs(client: InferenceClient) -> list[float]:
    done = await client.generate(PROMPT, SamplingParams(max_new_tokens=6, temperature=0))
    return done.output_logprobs


@pytest.mark.parametrize("kind", ["disk", "http", "sglang_disk"])
async def test_push_changes_weights_and_verifies(
    server: ServerProcess, models: tuple[Path, Path], tmp_path: Path, kind: str
) -> None:
    a, b = state(models[0]), state(models[1])
    async with InferenceClient([server.url]) as client:
        cls: Any = {
            "disk": DiskWeightSync,
            "http": HTTPTensorWeightSync,
            "sglang_disk": SGLangWeightSync,
        }[kind]
        sync = cls(client, cls.Config(bucket_bytes=32 << 10, root=str(tmp_path)))
        await sync.push(a.items(), version=1)
        on_a = await logprobs(client)
        await sync.push(b.items(), version=2)
        assert await sync.verify()
        report = sync.last_report[server.url]
        assert report.matched == len(b) and report.version == 2 and not report.mismatched
        on_b = await logprobs(client)
        assert (await client.weight_versions()) == {server.url: 2}
        # Something else loads other weights: verify notices.
        await client.update_weights_from_disk(str(models[0]), version=2)
        assert not await sync.verify()
        assert sync.last_report[server.url].mismatched
    assert on_a != on_b
    if kind != "http":  # disk syncs keep only the served version's directory
        assert [p.name for p in tmp_path.glob("v*")] == ["v2"]


async def test_verify_before_push_and_wrong_backend(server: ServerProcess) -> None:
    async with InferenceClient([server.url]) as client:
        with pytest.raises(ConfigError, match="before push"):
            await DiskWeightSync(client).verify()
        with pytest.raises(ConfigError, match="vLLM servers"):
            VLLMWeightSync(client)
    mixed = InferenceClient([server.url, "vllm+http://127.0.0.1:9"])
    with pytest.raises(ConfigError, match="vllm server"):
        await mixed.update_weights_from_tensors({"x": torch.zeros(1)})
    await mixed.aclose()
