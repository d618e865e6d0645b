"""SGLang's native protocol, spoken by ``SGLangDialect``, against the embedded server (a real
process on loopback): the /generate request and answer field by field, abort, pause/continue,
/update_weights_from_disk with SGLang's string ``weight_version``, and /get_model_info.

``SGLangWeightSync(mode="disk")`` against the same server is covered in
``tests/inference_vllm/test_weight_sync_embedded.py`` (default run, no vLLM needed).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx2
import pytest

from agentrl.errors import InferenceError
from agentrl.inference.backends.sglang import SGLangDialect
from agentrl.inference.client import InferenceClient
from agentrl.inference.launch import ServerProcess
from agentrl.inference.protocol import SamplingParams

PROMPT = [5, 6, 7, 8]


@pytest.fixture
async def http() -> AsyncIterator[httpx2.AsyncClient]:
    async with httpx2.AsyncClient(timeout=60, trust_env=False) as client:
        yield client


async def running(http: httpx2.AsyncClient, url: str) -> None:
    for _ in range(400):
        if (await http.get(url + "/get_server_info")).json()["engine"]["running"]:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("request never started running")


async def test_generate_request_and_answer_fields(
    server: ServerProcess, http: httpx2.AsyncClient
) -> None:
    dialect = SGLangDialect()
    sp = SamplingParams(
        max_new_tokens=5, temperature=1.0, top_p=0.9, top_k=20, stop_token_ids=(3,), seed=42
    )
    body = dialect.request_body(PROMPT, sp, return_logprob=True)
    sent = json.loads(body)
    assert set(sent) == {"input_ids", "sampling_params", "return_logprob"}
    assert sent["sampling_params"] == {
        "max_new_tokens": 5,
        "temperature": 1.0,
        "top_p": 0.9,
        "top_k": 20,
        "stop_token_ids": [3],
        "sampling_seed": 42,
    }
    resp = await http.post(server.url + dialect.generate_path, content=body)
    assert resp.status_code == 200, resp.text
    data = resp.json()
    meta = data["meta_info"]
    assert {"output_ids", "meta_info"} <= set(data)
    assert meta["finish_reason"]["type"] in ("stop", "length")
    assert meta["prompt_tokens"] == len(PROMPT)
    assert meta["completion_tokens"] == len(data["output_ids"])
    lps = meta["output_token_logprobs"]  # [[logprob, token id, text or None], ...]
    assert [row[1] for row in lps] == data["output_ids"] and all(row[0] <= 0 for row in lps)
    done = dialect.completion(data, server.url, 0.0)
    assert done.output_ids == data["output_ids"] and done.output_logprobs == [r[0] for r in lps]
    assert done.prompt_tokens == len(PROMPT) and done.weight_version == meta["weight_version"]
    # sampling_seed makes the request reproducible on its own.
    again = await http.post(server.url + "/generate", content=body)
    assert again.json()["output_ids"] == data["output_ids"]


async def test_abort_request_abort_all_returns_partial(server: ServerProcess) -> None:
    async with InferenceClient([server.url]) as client:
        task = asyncio.create_task(
            client.generate(PROMPT, SamplingParams(max_new_tokens=3000, temperature=0))
        )
        await running(client.http, server.url)
        await SGLangDialect().abort_all(client.http, server.url)  # {"abort_all": true}
        done = await task
    assert done.finish_reason == "abort"
    assert 0 < len(done.output_ids) < 3000 and len(done.output_logprobs) == len(done.output_ids)


async def test_pause_generation_in_place_then_continue(
    server: ServerProcess, http: httpx2.AsyncClient
) -> None:
    dialect = SGLangDialect()
    await dialect.pause(http, server.url, "in_place")
    try:
        info = (await http.get(server.url + "/get_server_info")).json()
        assert info["engine"]["paused"]
        body = dialect.request_body(PROMPT, SamplingParams(max_new_tokens=3, temperature=0), True)
        task = asyncio.create_task(http.post(server.url + "/generate", content=body))
        finished, _ = await asyncio.wait({task}, timeout=0.5)
        assert not finished  # held while paused
    finally:
        await dialect.resume(http, server.url)
    done = dialect.completion((await task).json(), server.url, 0.0)
    assert done.finish_reason == "length" and len(done.output_ids) == 3


async def test_update_weights_from_disk_with_string_version(
    server: ServerProcess, http: httpx2.AsyncClient, tiny_model: Path, tiny_model_b: Path
) -> None:
    dialect = SGLangDialect()
    sp = SamplingParams(max_new_tokens=6, temperature=0)
    body = dialect.request_body(PROMPT, sp, True)

    async def greedy() -> list[float]:
        data = (await http.post(server.url + "/generate", content=body)).json()
        return dialect.completion(data, server.url, 0.0).output_logprobs

    on_a = await greedy()
    raw = await http.post(
        server.url + "/update_weights_from_disk",
        json={"model_path": str(tiny_model_b), "weight_version": "7"},
    )
    assert raw.status_code == 200 and raw.json()["success"] is True
    assert await dialect.weight_version(http, server.url) == 7
    on_b = await greedy()
    # No version given: the server bumps its own.
    assert await dialect.load_from_disk(http, server.url, str(tiny_model), None) == 8
    assert await greedy() == on_a != on_b
    with pytest.raises(InferenceError, match="update_weights_from_disk -> 400"):
        await dialect.load_from_disk(http, server.url, str(tiny_model / "missing"), 9)
    assert await dialect.weight_version(http, server.url) == 8  # a failed load changes nothing


async def test_get_model_info_fields(
    server: ServerProcess, http: httpx2.AsyncClient, tiny_model: Path
) -> None:
    info = (await http.get(server.url + "/get_model_info")).json()
    assert info["model_path"] == str(tiny_model) and info["tokenizer_path"] == str(tiny_model)
    assert info["is_generation"] is True
    assert isinstance(info["weight_version"], int)
    version = (await http.get(server.url + "/get_weight_version")).json()["weight_version"]
    assert info["weight_version"] == version
