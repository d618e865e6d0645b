"""The recording gateway with real clients: the ``openai`` package against GatewayAgentLoop.

A scripted model (``ScriptedGenerator``) answers; each test checks what the trajectory holds:
segments, loss masks, the prompt ids against the template's render, statuses and the log.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
from typing import Any

import httpx
import openai
import pytest

from agentrl.agent import register_agent
from agentrl.chat import ChatTemplate
from agentrl.rollout.collector import CollectorConfig, RolloutCollector
from agentrl.rollout.testing import ScriptedGenerator
from agentrl.types import Message, RolloutStatus, Sample, Trajectory
from agents.gateway_agent import GatewayAgentLoop, GatewayTask

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate arithmetic.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    }
]
_ids = itertools.count()


def call(expr: str) -> str:
    return (
        f'<tool_call>{{"name": "calculator", "arguments": {{"expression": "{expr}"}}}}</tool_call>'
    )


async def collect(
    chatml: ChatTemplate,
    gen: Any,
    loop_kwargs: dict[str, Any] | list[dict[str, Any]],
    *,
    env_id: str = "test-agents/Calc-v0",
    **cfg: Any,
) -> list[Trajectory]:
    """Rollouts of GatewayAgentLoops (one per kwargs) through the real collector."""
    samples = []
    for kw in loop_kwargs if isinstance(loop_kwargs, list) else [loop_kwargs]:
        name = f"test-gateway-{next(_ids)}"
        register_agent(name, GatewayAgentLoop, **kw)
        samples.append(Sample(env_id=env_id, agent=name, seed=0))
    config = CollectorConfig(group_size=1, check_ledger=True, **cfg)
    groups = await RolloutCollector(config, gen, chatml).collect(samples)
    by_uid = {t.sample.uid: t for g in groups for t in g.trajectories}
    return [by_uid[s.uid] for s in samples]


def client(task: GatewayTask) -> Any:  # Any: the tests send plain dicts
    return openai.AsyncOpenAI(
        base_url=task.base_url,
        api_key=task.api_key,
        max_retries=0,
        http_client=openai.DefaultAsyncHttpxClient(),  # closed with the test's event loop
    )


async def calc_agent(task: GatewayTask) -> None:
    """A tool-calling agent: run the calls it gets (two in parallel), then answer."""
    oa = client(task)
    messages: list[Any] = list(task.messages)
    for _ in range(4):
        r = await oa.chat.completions.create(model=task.model, messages=messages, tools=TOOLS)
        msg = r.choices[0].message
        messages.append(msg.model_dump(exclude_none=True))
        if not msg.tool_calls:
            return
        for tc in msg.tool_calls:
            expr = json.loads(tc.function.arguments)["expression"]
            messages.append({"role": "tool", "tool_call_id": tc.id, "content": str(eval(expr))})


async def test_a_tool_calling_agent_records_one_token_exact_segment(chatml: ChatTemplate) -> None:
    replies = [call("12 * 7") + call("1 + 1"), "The answer is 84."]
    gen = ScriptedGenerator(chatml, replies)
    [t] = await collect(chatml, gen, {"agent": calc_agent})
    assert t.status is RolloutStatus.COMPLETED and t.reward == 1.0, t.error
    assert len(t.segments) == 1 and len(t.turns) == 2
    assert t.metrics["ledger_mismatch"] == 0
    seg = t.segments[0]
    # turn 1's prompt is the template's render of the messages the agent sent first
    first = [Message.coerce(m) for m in t.report["gateway"]["log"][0]["request"]["messages"]]
    rendered = chatml.render(first, TOOLS, add_generation_prompt=True)
    assert seg.token_ids[: len(rendered)] == rendered
    # completions are exactly the sampled ids, with mask 1; everything else mask 0
    c1, c2 = (turn.completion_ids for turn in t.turns)
    p2 = t.turns[1].prompt_len
    assert seg.token_ids[len(rendered) : len(rendered) + len(c1)] == c1
    assert seg.token_ids[p2:] == c2 and seg.loss_mask[p2:] == [1] * len(c2)
    assert sum(seg.loss_mask) == len(c1) + len(c2)
    # both tool results are one delta: no assistant turn between them
    between = chatml.decode(seg.token_ids[len(rendered) + len(c1) : p2])
    assert between.count("<|im_start|>assistant") == 1 and between.count("<tool_response>") == 2
    log = t.report["gateway"]["log"]
    assert [e["status"] for e in log] == [200, 200] and log[1]["rewrite"] is None
    assert len(log[0]["response"]["choices"][0]["message"]["tool_calls"]) == 2


async def test_streaming_sends_chunks_before_the_completion_is_done(chatml: ChatTemplate) -> None:
    words = " ".join(f"w{i}" for i in range(300))
    gen = ScriptedGenerator(chatml, [words], token_delay_s=0.002)
    n_tokens = len(chatml.encode(words))
    assert n_tokens >= 256
    seen: dict[str, Any] = {}

    async def streamer(task: GatewayTask) -> None:
        oa = client(task)
        stream = await oa.chat.completions.create(
            model=task.model,
            messages=task.messages,
            stream=True,
            max_tokens=256,
            stream_options={"include_usage": True},
        )
        parts: list[str] = []
        usage, finish = None, None
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                if "calls_at_first" not in seen:
                    seen["calls_at_first"] = gen.calls
                    seen["tokens_at_first"] = len(parts)
                parts.append(chunk.choices[0].delta.content)
            if chunk.choices and chunk.choices[0].finish_reason:
                finish = chunk.choices[0].finish_reason
            usage = chunk.usage or usage
        seen.update(text="".join(parts), usage=usage, finish=finish, chunks=len(parts))

    [t] = await collect(chatml, gen, {"agent": streamer, "grade": "none"}, max_new_tokens=512)
    assert t.status is RolloutStatus.TRUNCATED_LENGTH, t.error
    assert seen["finish"] == "length" and seen["usage"].completion_tokens == 256
    assert seen["chunks"] > 100  # token by token, not one block at the end
    assert seen["text"] == chatml.decode(t.turns[0].completion_ids)
    assert t.turns[0].completion_ids == chatml.encode(words)[:256]


async def test_stream_first_chunk_arrives_while_the_server_is_still_sampling(
    chatml: ChatTemplate,
) -> None:
    done = asyncio.Event()
    words = " ".join(f"w{i}" for i in range(300))

    class Slow(ScriptedGenerator):
        async def generate_stream(self, *a: Any, **k: Any) -> Any:
            async for item in super().generate_stream(*a, **k):
                yield item
            done.set()

    gen = Slow(chatml, [words], token_delay_s=0.002)
    first: list[bool] = []

    async def streamer(task: GatewayTask) -> None:
        stream = await client(task).chat.completions.create(
            model=task.model, messages=task.messages, stream=True, max_tokens=256
        )
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content and not first:
                first.append(done.is_set())

    await collect(chatml, gen, {"agent": streamer, "grade": "none"}, max_new_tokens=512)
    assert first == [False]  # the first content chunk came before the last token was sampled


async def test_bad_requests_get_openai_errors_and_keys_are_per_trajectory(
    chatml: ChatTemplate,
) -> None:
    gen = ScriptedGenerator(chatml, ["The answer is 84."])
    urls: list[tuple[str, str]] = []
    checks: dict[str, Any] = {}
    both = asyncio.Barrier(2)

    async def prober(task: GatewayTask) -> None:
        urls.append((task.base_url, task.api_key))
        await both.wait()  # both trajectories are open
        other_url, _ = next(u for u in urls if u[1] != task.api_key)
        oa = client(task)
        with pytest.raises(openai.BadRequestError) as e:
            await oa.chat.completions.create(model="m", messages=task.messages, n=2)
        checks["n"] = e.value.body
        with pytest.raises(openai.BadRequestError) as e:
            await oa.chat.completions.create(model="m", messages=[{"role": "wizard"}])
        checks["role"] = e.value.body
        wrong: Any = openai.AsyncOpenAI(base_url=other_url, api_key=task.api_key, max_retries=0)
        with pytest.raises(openai.PermissionDeniedError):
            await wrong.chat.completions.create(model="m", messages=task.messages)
        bad = openai.AsyncOpenAI(base_url=task.base_url, api_key="sk-nope", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            await bad.models.list()
        with pytest.raises(openai.NotFoundError) as nf:
            await oa.responses.create(model="m", input="hi")
        checks["responses"] = nf.value.body
        async with httpx.AsyncClient() as h:
            r = await h.post(
                task.base_url + "/chat/completions",
                content=b"{not json",
                headers={"Authorization": f"Bearer {task.api_key}"},
            )
            checks["json"] = (r.status_code, r.json())
        checks["models"] = [m.id async for m in oa.models.list()]
        await oa.chat.completions.create(model="m", messages=task.messages, max_tokens=32)

    trajs = await collect(chatml, gen, [{"agent": prober}, {"agent": prober}])
    assert all(t.status is RolloutStatus.COMPLETED for t in trajs), [t.error for t in trajs]
    assert checks["n"]["param"] == "n" and "n=2" in checks["n"]["message"]
    assert set(checks["role"]) == {"message", "type", "param", "code"}
    assert "Responses API" in checks["responses"]["message"]
    assert checks["json"][0] == 400 and "JSON" in checks["json"][1]["error"]["message"]
    assert checks["models"] == ["agentrl"]
    for t in trajs:  # the other trajectory's requests never reached this one
        assert t.report["gateway"]["requests"] == 1 and len(t.turns) == 1


async def test_many_concurrent_agents_each_get_their_own_trajectory(chatml: ChatTemplate) -> None:
    gen = ScriptedGenerator(
        chatml, lambda prompt, turn: call("12 * 7") if turn == 0 else "It is 84."
    )
    trajs = await collect(chatml, gen, [{"agent": calc_agent}] * 24)
    assert len(trajs) == 24
    assert all(t.status is RolloutStatus.COMPLETED and t.reward == 1.0 for t in trajs)
    assert all(len(t.segments) == 1 and len(t.turns) == 2 for t in trajs)
    assert len({t.report["gateway"]["session"] for t in trajs}) == 24


async def test_a_harness_that_rewrites_history_starts_a_new_segment(chatml: ChatTemplate) -> None:
    """Turn 2 extends; turn 3 edits the first reply (masked); turn 4 drops old turns."""
    gen = ScriptedGenerator(chatml, lambda _p, turn: f"reply {turn}")

    async def rewriter(task: GatewayTask) -> None:
        oa = client(task)
        msgs: list[Any] = [{"role": "user", "content": "start"}]

        async def ask() -> None:
            r = await oa.chat.completions.create(model="m", messages=msgs)
            msgs.append({"role": "assistant", "content": r.choices[0].message.content})
            msgs.append({"role": "user", "content": f"go on {len(msgs)}"})

        await ask()
        await ask()  # extends
        msgs[1] = {"role": "assistant", "content": "an edited reply"}
        await ask()  # assistant_edited -> new segment
        del msgs[1:5]  # summarised away
        await ask()  # truncated/history_edited -> new segment

    [t] = await collect(chatml, gen, {"agent": rewriter, "grade": "none"})
    assert t.status is RolloutStatus.COMPLETED, t.error
    assert len(t.turns) == 4 and len(t.segments) == 3
    assert t.metrics["gateway_rewrite_assistant_edited"] == 1
    assert t.metrics["gateway_rewrite_truncated"] == 1
    assert t.metrics["ledger_mismatch"] == 0
    s0, s1, s2 = t.segments
    assert s0.num_generated == len(t.turns[0].completion_ids) + len(t.turns[1].completion_ids)
    # the edited reply is in segment 1's prompt (mask 0); only turn 3's tokens are trained
    assert s1.num_generated == len(t.turns[2].completion_ids)
    text1 = chatml.decode([i for i, m in zip(s1.token_ids, s1.loss_mask, strict=True) if not m])
    assert "an edited reply" in text1 and "reply 0" not in text1
    assert s2.num_generated == len(t.turns[3].completion_ids)
    assert [e["rewrite"] for e in t.report["gateway"]["log"]] == [
        None,
        None,
        "assistant_edited",
        "truncated",
    ]


async def test_crash_hang_and_silence_end_only_their_own_trajectory(chatml: ChatTemplate) -> None:
    gen = ScriptedGenerator(chatml, ["The answer is 84."])

    async def crasher(task: GatewayTask) -> None:
        await client(task).chat.completions.create(model="m", messages=task.messages)
        raise RuntimeError("harness bug")

    async def hanger(task: GatewayTask) -> None:
        await client(task).chat.completions.create(model="m", messages=task.messages)
        await asyncio.sleep(3600)

    async def silent(task: GatewayTask) -> None:
        return None

    async def good(task: GatewayTask) -> None:
        await client(task).chat.completions.create(model="m", messages=task.messages)

    trajs = await collect(
        chatml,
        gen,
        [
            {"agent": crasher},
            {"agent": hanger, "timeout_s": 1.0},
            {"agent": silent},
            {"agent": good},
        ],
    )
    crash, hang, quiet, ok = trajs
    assert crash.status is RolloutStatus.ERROR_ENV and "harness bug" in (crash.error or "")
    assert hang.status is RolloutStatus.TRUNCATED_TIME and hang.reward == 1.0  # still graded
    assert quiet.status is RolloutStatus.ERROR_ENV and "never called" in (quiet.error or "")
    assert ok.status is RolloutStatus.COMPLETED and ok.reward == 1.0


AGENT_SCRIPT = """
import os, openai
oa = openai.OpenAI(max_retries=0)  # OPENAI_BASE_URL and OPENAI_API_KEY from the environment
r = oa.chat.completions.create(model=os.environ["AGENTRL_MODEL"],
    messages=[{"role": "user", "content": os.environ["AGENTRL_TASK"]}])
print("got:", r.choices[0].message.content)
"""


async def test_a_subprocess_agent_reads_the_openai_environment(chatml: ChatTemplate) -> None:
    gen = ScriptedGenerator(chatml, ["The answer is 84."])
    [t] = await collect(chatml, gen, {"command": [sys.executable, "-c", AGENT_SCRIPT]})
    assert t.status is RolloutStatus.COMPLETED and t.reward == 1.0, t.error
    assert "got: The answer is 84." in t.report["agent_output"]
    [fail] = await collect(chatml, gen, {"command": [sys.executable, "-c", "raise SystemExit(3)"]})
    assert fail.status is RolloutStatus.ERROR_ENV and "exit status 3" in (fail.error or "")


async def test_streamed_tool_calls_assemble_and_the_next_turn_extends(chatml: ChatTemplate) -> None:
    replies = ["Let me add. " + call("12 * 7") + call("1 + 1"), "It is 84."]
    gen = ScriptedGenerator(chatml, replies, token_delay_s=0.0)
    seen: dict[str, Any] = {}

    async def streaming_tools(task: GatewayTask) -> None:
        oa = client(task)
        messages: list[Any] = list(task.messages)
        for _ in range(2):
            stream = await oa.chat.completions.create(
                model=task.model, messages=messages, tools=TOOLS, stream=True
            )
            content, calls, finish = "", {}, None
            async for chunk in stream:
                d = chunk.choices[0].delta
                content += d.content or ""
                for tc in d.tool_calls or []:
                    calls[tc.index] = tc
                finish = chunk.choices[0].finish_reason or finish
            seen.setdefault("finish", []).append(finish)
            msg: dict[str, Any] = {"role": "assistant", "content": content or None}
            if calls:
                msg["tool_calls"] = [
                    {
                        "id": tc.id,
                        "type": "function",
                        "function": {"name": tc.function.name, "arguments": tc.function.arguments},
                    }
                    for _, tc in sorted(calls.items())
                ]
            messages.append(msg)
            for tc in msg.get("tool_calls", []):
                expr = json.loads(tc["function"]["arguments"])["expression"]
                messages.append(
                    {"role": "tool", "tool_call_id": tc["id"], "content": str(eval(expr))}
                )
            seen.setdefault("content", []).append(content)
            seen.setdefault("calls", []).append(len(calls))

    [t] = await collect(chatml, gen, {"agent": streaming_tools})
    assert t.status is RolloutStatus.COMPLETED and t.reward == 1.0, t.error
    assert seen["finish"] == ["tool_calls", "stop"] and seen["calls"] == [2, 0]
    assert seen["content"] == ["Let me add.", "It is 84."]  # no tool-call markup leaked
    assert len(t.segments) == 1 and t.metrics["ledger_mismatch"] == 0
    assert [e["rewrite"] for e in t.report["gateway"]["log"]] == [None, None]
