"""The gateway in front of a real embedded server (tiny model) through ``InferenceClient``.

The agent uses the ``openai`` client; the trajectory must hold the server's sampled ids and
logprobs, the first prompt must be the template's render, and stop strings must stop the
server (greedy, so the run without ``stop`` shows where the string is).
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
from agentrl.inference.launch import ServerProcess
from agentrl.rollout.collector import CollectorConfig, RolloutCollector
from agentrl.types import Message, Sample, Trajectory
from agents.gateway_agent import GatewayAgentLoop, GatewayTask

_names = itertools.count()


async def collect(
    server: ServerProcess, model_path: Path, agent: Any, max_new_tokens: int = 24
) -> Trajectory:
    name = f"test-gw-server-{next(_names)}"
    register_agent(name, GatewayAgentLoop, agent=agent, grade="none", honor_sampling=True)
    template = ChatTemplate.from_pretrained(model_path)
    config = CollectorConfig(
        group_size=1, agent=name, max_new_tokens=max_new_tokens, check_ledger=True
    )
    async with InferenceClient([server.url]) as client:
        [group] = await RolloutCollector(config, client, template).collect(
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


async def test_turns_through_a_real_server_record_its_ids_and_logprobs(
    server: ServerProcess, tiny_model_path: Path
) -> None:
    got: list[Any] = []

    async def agent(task: GatewayTask) -> None:
        client = oa(task)
        messages: list[Any] = list(task.messages)
        for k in range(2):
            r = await client.chat.completions.create(
                model=task.model,
                messages=messages,
                temperature=0.0,
                max_tokens=12,
                logprobs=True,
                extra_body={"return_token_ids": True},
            )
            got.append(r)
            messages.append({"role": "assistant", "content": r.choices[0].message.content})
            messages.append({"role": "user", "content": f"and then {k}?"})
        stream = await client.chat.completions.create(
            model=task.model, messages=messages, stream=True, max_tokens=8
        )
        got.append("".join([c.choices[0].delta.content or "" async for c in stream if c.choices]))

    t = await collect(server, tiny_model_path, agent)
    assert t.status.value in ("completed", "truncated_length"), t.error
    assert len(t.turns) == 3 and len(t.segments) == 1 and t.metrics["ledger_mismatch"] == 0
    template = ChatTemplate.from_pretrained(tiny_model_path)
    first = [Message.coerce(m) for m in t.report["gateway"]["log"][0]["request"]["messages"]]
    seg = t.segments[0]
    rendered = template.render(first, add_generation_prompt=True)
    assert seg.token_ids[: len(rendered)] == rendered
    for r, turn in zip(got[:2], t.turns, strict=False):
        choice = r.choices[0]
        assert choice.model_extra["token_ids"] == turn.completion_ids
        lps = [c.logprob for c in choice.logprobs.content]
        assert lps == pytest.approx(turn.completion_logprobs)
        assert r.usage.completion_tokens == len(turn.completion_ids)
    assert sum(seg.loss_mask) == sum(len(turn.completion_ids) for turn in t.turns)
    assert got[2] == t.messages[-1].text  # streamed text == recorded reply


async def test_stop_strings_stop_the_server(server: ServerProcess, tiny_model_path: Path) -> None:
    replies: list[Any] = []
    stop: list[str] = []

    async def agent(task: GatewayTask) -> None:
        client = oa(task)
        msgs = task.messages
        r = await client.chat.completions.create(
            model="m", messages=msgs, temperature=0.0, max_tokens=24
        )
        text = r.choices[0].message.content
        stop.append(text[len(text) // 2 : len(text) // 2 + 2])
        replies.append(r)
        replies.append(
            await client.chat.completions.create(
                model="m", messages=msgs, temperature=0.0, max_tokens=24, stop=stop
            )
        )

    t = await collect(server, tiny_model_path, agent)
    full, cut = replies
    assert stop[0] and full.choices[0].message.content.startswith(cut.choices[0].message.content)
    assert stop[0] not in cut.choices[0].message.content
    assert cut.choices[0].finish_reason == "stop"
    assert len(t.turns[1].completion_ids) < len(t.turns[0].completion_ids)
    assert t.metrics["gateway_rewrite_truncated"] == 1  # the same request again: a new segment


async def test_streaming_through_the_gateway_is_real_with_a_real_server(
    server: ServerProcess, tiny_model_path: Path
) -> None:
    """The first chunk of a 256-token completion reaches the agent while the server samples."""
    seen: dict[str, Any] = {}

    async def finished() -> int:
        async with httpx2.AsyncClient(trust_env=False) as http:
            info = (await http.get(server.url + "/get_server_info")).json()
        return int(info["engine"]["requests_finished"])

    async def agent(task: GatewayTask) -> None:
        before = await finished()
        stream = await oa(task).chat.completions.create(
            model="m", messages=task.messages, stream=True, max_tokens=256, temperature=0.0
        )
        parts: list[str] = []
        async for c in stream:
            if c.choices and c.choices[0].delta.content:
                if not parts:
                    seen["finished_at_first"] = await finished() - before
                parts.append(c.choices[0].delta.content)
        seen["text"], seen["chunks"] = "".join(parts), len(parts)

    t = await collect(server, tiny_model_path, agent, max_new_tokens=256)
    assert len(t.turns) == 1 and len(t.turns[0].completion_ids) == 256, t.error
    assert seen["finished_at_first"] == 0, seen  # the request was still running
    assert seen["chunks"] > 10 and seen["text"] == t.messages[-1].text
