"""Run directories for the viewer tests, built with the real token ledger and chat template.

    make_run(tmp_path / "runs" / "demo")   ->  demo/trajectories/step_00000{1,2}.jsonl,
                                               demo/metrics.jsonl, demo/base_model (tokenizer)

Every trajectory is a tool-calling conversation (system, user, assistant tool call, tool
output, final answer) whose ledger is built by ``TokenLedger`` exactly as a rollout builds
it, so a re-render of its messages matches. ``PAYLOAD`` (a <script> and an <img onerror>)
sits in the user message, the tool output and the final answer; ``broken`` names trajectories
whose ledger gets one prompt token changed (the viewer must mark it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agentrl.chat import ChatTemplate
from agentrl.rollout.ledger import TokenLedger
from agentrl.tiny import build_tokenizer
from agentrl.types import (
    JSON,
    Message,
    RolloutStatus,
    Sample,
    ToolCall,
    Trajectory,
    Turn,
    system,
    user,
)

PAYLOAD = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">'
PIXEL = (  # a 1x1 PNG, as an env would send a screenshot
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQ"
    "DwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)
REMOTE_IMAGE = "http://127.0.0.1:9/never-fetched.png"
ENVS = ("arith/Calculator-v0", "games/Guess-v0")

_TEMPLATE: ChatTemplate | None = None


def template() -> ChatTemplate:
    global _TEMPLATE
    if _TEMPLATE is None:
        _TEMPLATE = ChatTemplate(build_tokenizer())
    return _TEMPLATE


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: e.g. "12 * 7".
    """
    return "84"


def trajectory(
    *,
    answer: str,
    reward: float,
    env: str,
    uid: str,
    version: int,
    tools: list[JSON] | None = None,
) -> Trajectory:
    """A two-turn tool-calling rollout whose ledger is built by the real TokenLedger
    (``tools``: the schemas shown in the system prompt)."""
    tpl = template()
    call = ToolCall(name="calculator", arguments={"expression": "12 * 7"}, id="call_1")
    call_text = (
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12 * 7"}}\n</tool_call>'
    )
    msgs: list[Message] = [system("Use the calculator."), user(f"What is 12 * 7? {PAYLOAD}")]
    ledger = TokenLedger.for_template(tpl, tools)
    turns = []
    for text, reply in (
        (call_text, Message(role="assistant", content="", tool_calls=(call,))),
        (answer, Message(role="assistant", content=answer)),
    ):
        prompt = ledger.prompt(msgs)
        assert prompt is not None
        ids = [*tpl.encode(text), tpl.stop_token_ids[0]]
        lps = [-0.05 * (1 + i % 7) for i in range(len(ids))]
        msgs.append(reply)
        ledger.add_completion(ids, lps, version, messages_after=len(msgs))
        turns.append(
            Turn(
                prompt_len=len(prompt),
                completion_ids=ids,
                completion_logprobs=lps,
                finish_reason="stop",
                weight_version=version,
                llm_time_s=0.1,
                env_time_s=0.01,
            )
        )
        if reply.tool_calls:
            msgs.append(Message(role="tool", content=f"84 {PAYLOAD}", tool_call_id="call_1"))
    return Trajectory(
        sample=Sample(env_id=env, uid=uid, seed=1),
        messages=msgs,
        segments=ledger.segments,
        turns=turns,
        reward=reward,
        status=RolloutStatus.COMPLETED if reward >= 0 else RolloutStatus.ERROR_ENV,
        error=None if reward >= 0 else f"env crashed {PAYLOAD}",
        report={
            "tests": {"passed": int(reward > 0)},
            "note": PAYLOAD,
            "screenshots": [PIXEL, REMOTE_IMAGE],
            "gateway": {
                "log": [
                    {
                        "status": 200,
                        "latency_s": 0.1,
                        "segment": 0,
                        "request": {"messages": [{"role": "user", "content": PAYLOAD}]},
                        "response": {"choices": [{"message": {"content": answer}}]},
                    }
                ]
            },
        },
        wall_time_s=0.2,
        agent="tool_calling",
    )


def record(t: Trajectory, *, step: int, group: int, advantage: float) -> dict[str, Any]:
    """What training writes for one trajectory (trainers/trajectory_log.py)."""
    d = t.to_dict()
    d["step"], d["group_index"] = step, group
    d["advantages"] = [advantage for _ in t.segments]
    d["trainer_logprobs"] = [
        [lp - 0.01 * m for lp, m in zip(s.logprobs, s.loss_mask, strict=True)] for s in t.segments
    ]
    return d


def make_run(
    run_dir: Path, *, steps: int = 2, groups: int = 2, size: int = 2, broken: tuple[int, ...] = ()
) -> list[dict[str, Any]]:
    """Write a run directory; returns the records in file order. ``broken``: record indexes."""
    out: list[dict[str, Any]] = []
    (run_dir / "trajectories").mkdir(parents=True, exist_ok=True)
    template().tokenizer.save_pretrained(str(run_dir / "base_model"))
    metrics = []
    for step in range(1, steps + 1):
        lines = []
        for g in range(groups):
            rewards = [float((step + g + k) % 2) for k in range(size)]
            mean = sum(rewards) / size
            for r in rewards:
                t = trajectory(
                    answer=f"The answer is {84 if r else 48}. {PAYLOAD}",
                    reward=r,
                    env=ENVS[g % len(ENVS)],
                    uid=f"s{step}g{g}",
                    version=step - 1,
                )
                d = record(t, step=step, group=g, advantage=r - mean)
                if len(out) in broken:  # a token of the tool output, after the first reply
                    mask = d["segments"][0]["loss_mask"]
                    d["segments"][0]["token_ids"][mask.index(0, mask.index(1)) + 4] += 1
                out.append(d)
                lines.append(json.dumps(d) + "\n")
        (run_dir / "trajectories" / f"step_{step:06d}.jsonl").write_text("".join(lines))
        metrics.append(
            {
                "step": step,
                "rollout/reward_mean": 0.5 + 0.1 * step,
                "rollout/success_rate": 0.4 + 0.1 * step,
                "rollout/response_len_mean": 20.0 + step,
                "timing/step_s": 1.5,
            }
        )
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    return out
