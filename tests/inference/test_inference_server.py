"""The embedded server as a real process on loopback, driven over HTTP and by InferenceClient."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path
from typing import Any

import httpx2
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentrl.errors import InferenceError
from agentrl.inference.client import InferenceClient
from agentrl.inference.launch import ServerProcess
from agentrl.inference.protocol import Completion, Generator, SamplingParams
from agentrl.inference.weights import checksum_named_tensors
from agentrl.inference.wire import GenerateResponse


@pytest.fixture(scope="module")
def ref_model(tiny_model: Path) -> Any:
    return AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Path) -> Any:
    return AutoTokenizer.from_pretrained(tiny_model)


def teacher_forced(
    model: Any, prompt: list[int], output: list[int], temperature: float
) -> torch.Tensor:
    """log_softmax(logits / T) of each output token, from one full-sequence forward."""
    seq = torch.tensor([prompt + output])
    with torch.no_grad():
        logits = model(input_ids=seq).logits[0, len(prompt) - 1 : -1].float()  # (C, V)
    if temperature > 0:
        logits = logits / temperature
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(output)[:, None])[:, 0]


async def post(url: str, path: str, body: dict[str, Any], timeout: float = 60) -> httpx2.Response:
    async with httpx2.AsyncClient(timeout=timeout, trust_env=False) as http:
        return await http.post(url + path, json=body)


async def get(url: str, path: str) -> httpx2.Response:
    async with httpx2.AsyncClient(timeout=60, trust_env=False) as http:
        return await http.get(url + path)


def gen_body(ids: list[int], **sp: Any) -> dict[str, Any]:
    return {"input_ids": ids, "sampling_params": sp, "return_logprob": True}


async def engine_stats(url: str) -> dict[str, int]:
    return (await get(url, "/get_server_info")).json()["engine"]


async def wait_running(url: str, n: int = 1) -> None:
    for _ in range(400):
        if (await engine_stats(url))["running"] >= n:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("request never started running")


async def test_generate_matches_sglang_schema(server: ServerProcess) -> None:
    resp = await post(
        server.url,
        "/generate",
        gen_body([5, 6, 7], max_new_tokens=4, temperature=0, ignore_eos=True),
    )
    assert resp.status_code == 200, resp.text
    out = GenerateResponse.model_validate(resp.json())
    assert len(out.output_ids) == 4
    assert out.meta_info.finish_reason.type == "length"
    assert out.meta_info.prompt_tokens == 3 and out.meta_info.completion_tokens == 4
    assert [t for _, t, _ in out.meta_info.output_token_logprobs or []] == out.output_ids
    assert out.meta_info.weight_version == 0


async def test_the_start_up_heap_is_frozen_and_collector_pauses_are_reported(
    server: ServerProcess,
) -> None:
    """Torch, transformers and the model are out of the collector's full passes (a pass over
    them stopped the server for ~0.3 s mid-round on a GPU host), and the passes are timed."""
    process = (await get(server.url, "/get_server_info")).json()["process"]
    assert process["gc_frozen_objects"] > 50_000
    assert process["gc_gen0_passes"] >= 0 and process["gc_gen2_max_s"] <= process["gc_gen2_s"]
    text = (await get(server.url, "/metrics")).text
    assert "agentrl_gc_gen2_s " in text


async def test_batch_request_returns_one_result_per_prompt(server: ServerProcess) -> None:
    body = {"text": ["the answer is", "guess a number"], "sampling_params": {"max_new_tokens": 3}}
    resp = await post(server.url, "/generate", body)
    assert resp.status_code == 200
    items = resp.json()
    assert isinstance(items, list) and len(items) == 2
    assert all(GenerateResponse.model_validate(i).meta_info.completion_tokens <= 3 for i in items)
    # prompts sent without a rid get ids of their own, distinct across requests too
    again = (await post(server.url, "/generate", body | {"text": "the answer is"})).json()
    ids = [i["meta_info"]["id"] for i in items] + [again["meta_info"]["id"]]
    assert len(set(ids)) == 3 and all(ids)


async def test_concurrent_requests_are_batched(server: ServerProcess) -> None:
    before = await engine_stats(server.url)
    async with InferenceClient([server.url]) as client:
        assert isinstance(client, Generator)
        sp = SamplingParams(max_new_tokens=8, temperature=1.0)
        outs = await asyncio.gather(*(client.generate([5, 6, 7, 10 + i], sp) for i in range(24)))
    assert all(
        1 <= len(o.output_ids) <= 8 and len(o.output_logprobs) == len(o.output_ids) for o in outs
    )
    after = await engine_stats(server.url)
    assert after["batched_forwards"] > before["batched_forwards"]
    assert after["max_batch_seen"] > 1
    assert after["requests_finished"] - before["requests_finished"] >= 24


async def test_logprobs_match_teacher_forcing_mixed_lengths(
    server: ServerProcess, ref_model: Any
) -> None:
    rng = random.Random(0)
    vocab = ref_model.config.vocab_size
    prompts = [
        [rng.randrange(3, vocab) for _ in range(n)]
        for n in (2, 5, 9, 17, 33, 3, 12, 40, 7, 25, 4, 60)
    ]
    temps = [0.0, 0.7, 1.0, 1.3]
    before = await engine_stats(server.url)
    bodies = [
        gen_body(p, max_new_tokens=10, temperature=temps[i % 4], ignore_eos=True, top_k=-1)
        for i, p in enumerate(prompts)
    ]
    resps = await asyncio.gather(*(post(server.url, "/generate", b) for b in bodies))
    assert (await engine_stats(server.url))["batched_forwards"] > before["batched_forwards"]
    for i, (prompt, resp) in enumerate(zip(prompts, resps, strict=True)):
        data = resp.json()
        served = torch.tensor([lp for lp, _, _ in data["meta_info"]["output_token_logprobs"]])
        ref = teacher_forced(ref_model, prompt, data["output_ids"], temps[i % 4])
        assert (served - ref).abs().mean().item() <= 1e-4, (i, served, ref)


async def test_greedy_is_independent_of_batch_neighbours(server: ServerProcess) -> None:
    prompt = [11, 12, 13, 14, 15]
    alone = (
        await post(server.url, "/generate", gen_body(prompt, max_new_tokens=12, temperature=0))
    ).json()
    noise = [
        post(server.url, "/generate", gen_body([20 + i] * (3 + 5 * i), max_new_tokens=12))
        for i in range(8)
    ]
    together = await asyncio.gather(
        post(server.url, "/generate", gen_body(prompt, max_new_tokens=12, temperature=0)), *noise
    )
    assert together[0].json()["output_ids"] == alone["output_ids"]


async def test_seeded_sampling_is_reproducible(server: ServerProcess) -> None:
    async with InferenceClient([server.url]) as client:
        sp = SamplingParams(max_new_tokens=12, temperature=1.0, seed=1234)
        first = await client.generate([5, 6, 7], sp)
        crowd = [client.generate([8, 9], SamplingParams(max_new_tokens=12)) for _ in range(6)]
        again, *_ = await asyncio.gather(client.generate([5, 6, 7], sp), *crowd)
    assert again.output_ids == first.output_ids


async def test_finish_reasons_stop_token_stop_string_and_length(
    server: ServerProcess, tokenizer: Any
) -> None:
    prompt = [30, 31, 32]
    base = (
        await post(
            server.url,
            "/generate",
            gen_body(prompt, max_new_tokens=8, temperature=0, ignore_eos=True),
        )
    ).json()
    assert base["meta_info"]["finish_reason"] == {"type": "length", "length": 8}
    target = base["output_ids"][2]
    stop_at = base["output_ids"].index(target)
    by_id = (
        await post(
            server.url,
            "/generate",
            gen_body(
                prompt, max_new_tokens=8, temperature=0, ignore_eos=True, stop_token_ids=[target]
            ),
        )
    ).json()
    assert by_id["meta_info"]["finish_reason"] == {"type": "stop", "matched": target}
    assert by_id["output_ids"] == base["output_ids"][: stop_at + 1]
    text = tokenizer.decode(base["output_ids"][3:6])
    if text.strip():
        by_str = (
            await post(
                server.url,
                "/generate",
                gen_body(prompt, max_new_tokens=8, temperature=0, ignore_eos=True, stop=[text]),
            )
        ).json()
        fr = by_str["meta_info"]["finish_reason"]
        assert fr["type"] == "stop" and fr["matched"] == text
        assert text not in by_str["text"]


async def test_abort_by_rid_returns_partial_completion(server: ServerProcess) -> None:
    body = gen_body([5, 6], max_new_tokens=3000, ignore_eos=True) | {"rid": "long-abort-1"}
    task = asyncio.create_task(post(server.url, "/generate", body))
    await wait_running(server.url)
    resp = await post(server.url, "/abort_request", {"rid": "long-abort-1"})
    assert resp.json()["num_aborted"] == 1
    data = (await task).json()
    assert data["meta_info"]["finish_reason"]["type"] == "abort"
    assert 0 < len(data["output_ids"]) < 3000
    assert len(data["meta_info"]["output_token_logprobs"]) == len(data["output_ids"])


async def test_client_returns_abort_completion_on_pause_abort(server: ServerProcess) -> None:
    async with InferenceClient([server.url]) as client:
        # greedy from this prompt repeats one token and never reaches EOS
        task = asyncio.create_task(
            client.generate([5, 6, 7], SamplingParams(max_new_tokens=3000, temperature=0))
        )
        await wait_running(server.url)
        await client.pause(mode="abort")
        try:
            done = await task
        finally:
            await client.resume()
    assert done.finish_reason == "abort"
    assert 0 < len(done.output_ids) < 3000 and len(done.output_logprobs) == len(done.output_ids)


async def test_pause_in_place_holds_requests_until_resume(server: ServerProcess) -> None:
    await post(server.url, "/pause_generation", {"mode": "in_place"})
    try:
        task = asyncio.create_task(
            post(server.url, "/generate", gen_body([5], max_new_tokens=5, ignore_eos=True))
        )
        done, _ = await asyncio.wait({task}, timeout=0.5)
        assert not done  # nothing runs while paused
        assert (await engine_stats(server.url))["paused"]
    finally:
        await post(server.url, "/continue_generation", {})
    data = (await task).json()
    assert data["meta_info"]["finish_reason"]["type"] == "length" and len(data["output_ids"]) == 5


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (gen_body([5], max_tokens=3), "max_tokens: unknown field"),
        (gen_body([5, 999_999], max_new_tokens=3), "outside the vocabulary"),
        (gen_body([], max_new_tokens=3), "input_ids is empty"),
        (
            {"input_ids": [[5], [6]], "sampling_params": {}, "stream": True},
            "stream=true needs one prompt",
        ),
        (gen_body([5], frequency_penalty=0.5), "frequency_penalty"),
        (gen_body([5], temperature=-1), "temperature"),
        ({"sampling_params": {}}, "exactly one of 'text' or 'input_ids'"),
    ],
)
async def test_bad_input_gets_4xx_with_message(
    server: ServerProcess, body: dict[str, Any], fragment: str
) -> None:
    resp = await post(server.url, "/generate", body)
    assert resp.status_code == 400
    assert fragment in resp.json()["error"]["message"]


async def test_malformed_json_and_client_4xx_is_not_retried(server: ServerProcess) -> None:
    async with httpx2.AsyncClient(trust_env=False) as http:
        resp = await http.post(server.url + "/generate", content=b"{not json")
    assert resp.status_code == 400 and "invalid request" in resp.json()["error"]["message"]
    async with InferenceClient([server.url]) as client:
        with pytest.raises(InferenceError, match="outside the vocabulary"):
            await client.generate([10**7], SamplingParams(max_new_tokens=2))


async def test_info_endpoints(server: ServerProcess) -> None:
    assert (await get(server.url, "/health")).status_code == 200
    assert (await get(server.url, "/health_generate")).status_code == 200
    info = (await get(server.url, "/get_model_info")).json()
    assert info["is_generation"] is True and info["vocab_size"] > 0
    assert (await post(server.url, "/flush_cache", {})).json()["success"] is True
    assert isinstance((await get(server.url, "/get_weight_version")).json()["weight_version"], int)


async def test_openai_completions_and_chat(server: ServerProcess, tokenizer: Any) -> None:
    models = (await get(server.url, "/v1/models")).json()
    assert models["data"][0]["id"]
    comp = (
        await post(
            server.url,
            "/v1/completions",
            {"prompt": "the answer is", "max_tokens": 4, "logprobs": 1, "n": 2},
        )
    ).json()
    assert len(comp["choices"]) == 2 and comp["usage"]["completion_tokens"] <= 8
    assert len(comp["choices"][0]["logprobs"]["token_logprobs"]) <= 4
    tools = [
        {"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}
    ]
    messages = [{"role": "user", "content": "compute 12 * 7"}]
    chat = (
        await post(
            server.url,
            "/v1/chat/completions",
            {
                "messages": messages,
                "tools": tools,
                "max_tokens": 6,
                "return_token_ids": True,
                "logprobs": True,
            },
        )
    ).json()
    choice = chat["choices"][0]
    assert choice["message"]["role"] == "assistant"
    rendered = tokenizer.apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=True
    )
    assert choice["prompt_token_ids"] == tokenizer.encode(rendered, add_special_tokens=False)
    assert len(choice["logprobs"]["content"]) == len(choice["token_ids"])
    bad = await post(server.url, "/v1/chat/completions", {"messages": messages, "n": 2})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "n"


async def test_generate_streams_cumulative_output_ids_then_the_answer(
    server: ServerProcess,
) -> None:
    """SGLang's default stream: each event holds the ids so far; the last one is the answer."""
    async with InferenceClient([server.url]) as client:
        items = [
            item
            async for item in client.generate_stream(
                [5, 6, 7], SamplingParams(max_new_tokens=16, temperature=0.0)
            )
        ]
        whole = await client.generate([5, 6, 7], SamplingParams(max_new_tokens=16, temperature=0.0))
    *rest, done = items
    pieces = [p for p in rest if isinstance(p, list)]
    assert isinstance(done, Completion) and len(pieces) == len(rest)
    assert [t for p in pieces for t in p] == done.output_ids == whole.output_ids
    assert len(pieces) == len(done.output_ids) and done.output_logprobs == pytest.approx(
        whole.output_logprobs
    )


async def test_openai_chat_streams_chunks_while_the_engine_samples(server: ServerProcess) -> None:
    """The first content chunk of a 256-token completion arrives while it is still running."""
    body = {
        "messages": [{"role": "user", "content": "tell me a long story"}],
        "stream": True,
        "max_tokens": 256,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    before = (await engine_stats(server.url))["requests_finished"]
    events: list[Any] = []
    at_first: dict[str, int] | None = None
    async with (
        httpx2.AsyncClient(timeout=60, trust_env=False) as http,
        http.stream("POST", server.url + "/v1/chat/completions", json=body) as r,
    ):
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            data = line[6:]
            events.append(data if data == "[DONE]" else json.loads(data))
            delta = (
                events[-1]["choices"][0]["delta"]
                if events[-1] != "[DONE]" and events[-1]["choices"]
                else {}
            )
            if delta.get("content") and at_first is None:
                at_first = await engine_stats(server.url)
    assert at_first is not None and at_first["requests_finished"] == before  # still sampling
    assert events[-1] == "[DONE]" and events[-2]["usage"]["completion_tokens"] == 256
    assert events[-3]["choices"][0]["finish_reason"] == "length"
    assert (
        sum(1 for e in events[:-1] if e["choices"] and e["choices"][0]["delta"].get("content")) > 10
    )


# ---- weights (these run last in the module and restore the original weights) ---------------


async def test_update_from_tensor_rejects_unknown_names(server: ServerProcess) -> None:
    async with InferenceClient([server.url]) as client:
        before = (await client.weights_checksum(per_tensor=False))[server.url]
        with pytest.raises(InferenceError, match="not in the served model"):
            await client.update_weights_from_tensors({"no.such.weight": torch.zeros(2)})
        after = (await client.weights_checksum(per_tensor=False))[server.url]
    assert after.overall == before.overall and after.weight_version == before.weight_version


async def test_weight_updates_change_outputs_and_checksums(
    server: ServerProcess, ref_model: Any, tiny_model_b: Path
) -> None:
    model_b = AutoModelForCausalLM.from_pretrained(tiny_model_b, dtype=torch.float32).eval()
    prompt = [40, 41, 42, 43]
    body = gen_body(prompt, max_new_tokens=8, temperature=0, ignore_eos=True)
    async with InferenceClient([server.url]) as client:
        original = (await post(server.url, "/generate", body)).json()
        versions = await client.update_weights_from_disk(str(tiny_model_b), version=5)
        assert versions == {server.url: 5}
        sums = await client.weights_checksum()
        assert (
            sums[server.url].overall == checksum_named_tensors(model_b.state_dict().items()).overall
        )
        on_b = (await post(server.url, "/generate", body)).json()
        assert on_b["meta_info"]["weight_version"] == 5
        served = torch.tensor([lp for lp, _, _ in on_b["meta_info"]["output_token_logprobs"]])
        assert (
            served - teacher_forced(model_b, prompt, on_b["output_ids"], 0.0)
        ).abs().mean() <= 1e-4
        assert on_b["output_ids"] != original["output_ids"] or not torch.allclose(
            served, teacher_forced(ref_model, prompt, on_b["output_ids"], 0.0)
        )
        # back to the original weights over HTTP, in several buckets
        versions = await client.update_weights_from_tensors(
            ref_model.state_dict(), bucket_bytes=64 << 10
        )
        assert versions == {server.url: 6}
        sums = await client.weights_checksum()
        expected = checksum_named_tensors(ref_model.state_dict().items())
        assert sums[server.url].overall == expected.overall
        assert sums[server.url].tensors == expected.tensors
        restored = (await post(server.url, "/generate", body)).json()
    assert restored["output_ids"] == original["output_ids"]


async def test_in_flight_request_survives_weight_update(
    server: ServerProcess, ref_model: Any
) -> None:
    body = gen_body([5, 6, 7], max_new_tokens=1500, ignore_eos=True, temperature=0)
    task = asyncio.create_task(post(server.url, "/generate", body))
    await wait_running(server.url)
    async with InferenceClient([server.url]) as client:
        new = (await client.update_weights_from_tensors(ref_model.state_dict()))[server.url]
    data = (await task).json()
    meta = data["meta_info"]
    assert meta["finish_reason"]["type"] == "length" and len(data["output_ids"]) == 1500
    assert meta["weight_version"] == new
    versions = meta.get("output_token_weight_versions")
    assert versions is not None and versions[0] == new - 1 and versions[-1] == new
