"""The gateway against what sits behind it: top-k logprobs from the server, stop strings cut on
our side (token-exact on every backend), failover before a stream starts and a stream that
breaks mid-way. A real embedded server (tiny model) answers unless a test says otherwise.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import httpx2
import openai
import pytest

from agentrl.agent import register_agent
from agentrl.chat import ChatTemplate
from agentrl.inference.client import InferenceClient
from agentrl.inference.launch import ServerProcess, free_port
from agentrl.inference.protocol import Completion, Generator, SamplingParams
from agentrl.rollout.collector import CollectorConfig, RolloutCollector
from agentrl.rollout.testing import ScriptedGenerator
from agentrl.types import RolloutStatus, Sample, Trajectory
from agents.gateway_agent import GatewayAgentLoop, GatewayTask

_names = itertools.count()


async def collect(
    gen: Generator, template: ChatTemplate, agent: Any, max_new_tokens: int = 24
) -> Trajectory:
    name = f"test-gw-upstream-{next(_names)}"
    register_agent(name, GatewayAgentLoop, agent=agent, grade="none", honor_sampling=True)
    config = CollectorConfig(
        group_size=1, agent=name, max_new_tokens=max_new_tokens, check_ledger=True
    )
    [group] = await RolloutCollector(config, gen, template).collect(
        [Sample(env_id="test-agents/Calc-v0")]
    )
    return group.trajectories[0]


def oa(task: GatewayTask) -> Any:
    return openai.AsyncOpenAI(
        base_url=task.base_url,
        api_key=task.api_key,
        max_retries=0,
        http_client=openai.DefaultAsyncHttpxClient(),
    )


async def tokens_generated(url: str) -> int:
    async with httpx2.AsyncClient(trust_env=False) as http:
        info = (await http.get(url + "/get_server_info")).json()
    return int(info["engine"]["tokens_generated"])


# --- top_logprobs ---------------------------------------------------------------------------
async def test_top_logprobs_are_the_servers_alternatives(
    server: ServerProcess, tiny_model_path: Path
) -> None:
    got: list[Any] = []

    async def agent(task: GatewayTask) -> None:
        client = oa(task)
        kw: dict[str, Any] = {"temperature": 0.0, "max_tokens": 8, "logprobs": True}
        r = await client.chat.completions.create(
            model="m", messages=task.messages, top_logprobs=3, **kw
        )
        got.append(r.choices[0].logprobs.content)
        msgs = [*task.messages, {"role": "assistant", "content": r.choices[0].message.content}]
        stream = await client.chat.completions.create(
            model="m", messages=[*msgs, {"role": "user", "content": "more"}], stream=True,
            top_logprobs=2, **kw,
        )  # fmt: skip
        chunks = [c async for c in stream if c.choices and c.choices[0].logprobs]
        got.append([x for c in chunks for x in c.choices[0].logprobs.content])

    template = ChatTemplate.from_pretrained(tiny_model_path)
    async with InferenceClient([server.url]) as client:
        t = await collect(client, template, agent)
    assert t.status.value in ("completed", "truncated_length"), t.error
    for k, entries, turn in zip((3, 2), got, t.turns, strict=True):
        assert [e.logprob for e in entries] == pytest.approx(turn.completion_logprobs, abs=1e-5)
        for e, tok in zip(entries, turn.completion_ids, strict=True):
            assert len(e.top_logprobs) == k
            lps = [a.logprob for a in e.top_logprobs]
            assert lps == sorted(lps, reverse=True)
            # greedy: the sampled token is the most likely one
            assert e.top_logprobs[0].token == template.decode([tok])
            assert e.top_logprobs[0].logprob == pytest.approx(e.logprob, abs=1e-5)


async def test_top_logprobs_a_generator_cannot_give_are_a_400(chatml: ChatTemplate) -> None:
    errors: list[Any] = []

    async def agent(task: GatewayTask) -> None:
        client = oa(task)
        try:
            await client.chat.completions.create(
                model="m", messages=task.messages, logprobs=True, top_logprobs=2
            )
        except openai.BadRequestError as e:
            errors.append(e)
        r = await client.chat.completions.create(model="m", messages=task.messages, logprobs=True)
        assert r.choices[0].logprobs.content[0].top_logprobs == []

    t = await collect(ScriptedGenerator(chatml, ["The answer is 84."]), chatml, agent)
    [e] = errors
    assert e.body["param"] == "top_logprobs" and e.body["code"] == "top_logprobs_unsupported"
    assert "ScriptedGenerator" in e.body["message"]
    assert len(t.turns) == 1 and len(t.segments) == 1  # the refused request recorded nothing


# --- stop strings ---------------------------------------------------------------------------
async def test_stop_strings_cut_token_exact_where_the_backend_cannot_stop(
    chatml: ChatTemplate,
) -> None:
    """ScriptedGenerator ignores stop strings, as vLLM's token mode does: the gateway must
    end the reply at the token that completes the string and record nothing after it."""
    reply = "alpha beta STOP gamma delta"
    seen: list[str] = []

    async def agent(task: GatewayTask) -> None:
        client = oa(task)
        r = await client.chat.completions.create(model="m", messages=task.messages, stop="STOP")
        seen.append(r.choices[0].message.content)
        seen.append(r.choices[0].finish_reason)
        msgs = [*task.messages, {"role": "assistant", "content": seen[0]}]
        stream = await client.chat.completions.create(
            model="m", messages=[*msgs, {"role": "user", "content": "again"}],
            stop=["nothing", "TOP g"], stream=True,
        )  # fmt: skip
        seen.append("".join([c.choices[0].delta.content or "" async for c in stream]))

    t = await collect(ScriptedGenerator(chatml, [reply]), chatml, agent, max_new_tokens=64)
    assert t.status is RolloutStatus.COMPLETED, t.error
    assert seen == ["alpha beta ", "stop", "alpha beta S"]
    ids = chatml.encode(reply)
    for turn, stop in zip(t.turns, ("STOP", "TOP g"), strict=True):
        n = next(i for i in range(1, len(ids) + 1) if stop in chatml.decode(ids[:i]))
        assert turn.completion_ids == ids[:n] and turn.finish_reason == "stop"
    assert len(t.segments) == 1 and t.metrics["ledger_mismatch"] == 0
    seg = t.segments[0]
    assert sum(seg.loss_mask) == sum(len(turn.completion_ids) for turn in t.turns)


async def test_a_stop_string_ends_the_request_on_the_server(
    server: ServerProcess, tiny_model_path: Path
) -> None:
    """Against the embedded server, which is not sent the string: the recorded ids are the
    greedy run's up to the token that completes it, and the server stopped sampling there."""
    template = ChatTemplate.from_pretrained(tiny_model_path)
    prompt = template.render(
        [{"role": "user", "content": "Count to ten."}], add_generation_prompt=True
    )
    greedy = SamplingParams(max_new_tokens=200, temperature=0.0, ignore_eos=True)
    async with InferenceClient([server.url]) as client:
        full = await client.generate(prompt, greedy)
        before = await tokens_generated(server.url)
        got: list[list[int] | Completion] = [
            x async for x in client.generate_stream(prompt, greedy, cut=lambda ids: 5 * (len(ids) >= 5) or None)
        ]  # fmt: skip
        spent = await tokens_generated(server.url) - before
    done = got[-1]
    assert isinstance(done, Completion) and done.finish_reason == "stop"
    assert done.output_ids == full.output_ids[:5]
    assert done.output_logprobs == pytest.approx(full.output_logprobs[:5], abs=1e-5)
    assert spent < 100, spent  # aborted, not run to its 200 tokens

    text = template.decode(full.output_ids)
    stop = text[len(text) // 3 : len(text) // 3 + 3]
    n = next(i for i in range(1, 201) if stop in template.decode(full.output_ids[:i]))
    replies: list[Any] = []

    async def agent(task: GatewayTask) -> None:
        client = oa(task)
        msgs = [{"role": "user", "content": "Count to ten."}]
        kw: dict[str, Any] = {"temperature": 0.0, "max_tokens": 200, "stop": [stop]}
        kw["extra_body"] = {"ignore_eos": True, "return_token_ids": True}
        replies.append(await client.chat.completions.create(model="m", messages=msgs, **kw))
        stream = await client.chat.completions.create(model="m", messages=msgs, stream=True, **kw)
        replies.append("".join([c.choices[0].delta.content or "" async for c in stream]))

    async with InferenceClient([server.url]) as client:
        t = await collect(client, template, agent, max_new_tokens=200)
    assert t.status is RolloutStatus.COMPLETED, t.error
    r, streamed = replies
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.content == streamed == text[: text.index(stop)]
    for turn in t.turns:  # both: the greedy ids up to the one that completes the string
        assert turn.completion_ids == full.output_ids[:n] and turn.finish_reason == "stop"
    assert t.metrics["ledger_mismatch"] == 0


# --- failover and broken streams ------------------------------------------------------------
async def test_a_stream_not_yet_started_fails_over(
    server: ServerProcess, tiny_model_path: Path
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    texts: list[str] = []

    async def agent(task: GatewayTask) -> None:
        stream = await oa(task).chat.completions.create(
            model="m", messages=task.messages, stream=True, max_tokens=8, temperature=0.0
        )
        texts.append("".join([c.choices[0].delta.content or "" async for c in stream]))

    template = ChatTemplate.from_pretrained(tiny_model_path)
    async with InferenceClient([dead, server.url]) as client:
        t = await collect(client, template, agent)
        assert client._sessions[t.sample.uid].url == server.url  # re-pinned
    assert t.status.value in ("completed", "truncated_length"), t.error
    assert texts == [t.messages[-1].text] and t.turns[0].completion_ids


async def test_a_stream_that_breaks_midway_is_an_error_with_its_tokens_masked(
    tiny_model_path: Path, tmp_path: Path
) -> None:
    cfg = ServerProcess.Config(model=str(tiny_model_path), max_batch_size=2, num_threads=1)
    seen: dict[str, Any] = {"content": ""}
    with ServerProcess(cfg) as doomed:

        async def agent(task: GatewayTask) -> None:
            stream = await oa(task).chat.completions.create(
                model="m", messages=task.messages, stream=True, max_tokens=256,
                temperature=0.0, extra_body={"ignore_eos": True},
            )  # fmt: skip
            try:
                async for c in stream:
                    if c.choices and c.choices[0].delta.content:
                        seen["content"] += c.choices[0].delta.content
                        doomed.kill()  # the server dies mid-reply
            except openai.APIError as e:
                seen["error"] = e
            r = await oa(task).chat.completions.create(model="m", messages=task.messages)
            seen["after"] = r  # not reached: the trajectory has failed

        template = ChatTemplate.from_pretrained(tiny_model_path)
        async with InferenceClient([doomed.url]) as client:
            t = await collect(client, template, agent, max_new_tokens=256)
    assert seen["content"] and "after" not in seen
    assert "stream broke" in str(seen["error"])
    assert t.status is RolloutStatus.ERROR_INFERENCE and "stream broke" in (t.error or "")
    assert not t.trainable and t.turns == []
    [seg] = t.segments
    partial = int(t.metrics["gateway_stream_broken_tokens"])
    assert partial >= 1 and sum(seg.loss_mask) == 0  # recorded, never trained on
    log = t.report["gateway"]["log"]
    assert log[0]["status"] == 502
    assert log[0]["response"]["error"]["code"] == "upstream_stream_broken"
    assert log[1]["response"]["error"]["code"] == "trajectory_failed"
