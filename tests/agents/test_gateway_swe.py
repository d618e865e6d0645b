"""Black-box agents on a SWE task through the gateway: graded end to end in real sandboxes.

- a small harness written against the ``openai`` client that runs the model's bash blocks in
  the task's sandbox;
- mini-swe-agent from PyPI, unchanged: its ``DefaultAgent`` and ``LitellmModel`` with the
  gateway's base_url and key (configuration only), and an environment object that runs its
  commands in the trajectory's sandbox instead of on the host.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
from pathlib import Path
from typing import Any

import openai
import pytest

from agentrl.agent import register_agent
from agentrl.chat import ChatTemplate
from agentrl.rollout.collector import CollectorConfig, RolloutCollector
from agentrl.rollout.testing import ScriptedGenerator
from agentrl.types import RolloutStatus, Trajectory
from agents.gateway_agent import GatewayAgentLoop, GatewayTask
from tests.agents.test_swe_agent import FIX, swe_sample  # noqa: F401 (fixture)
from tests.envs.swe_repo import needs_local

pytestmark = needs_local
BASH = re.compile(r"```bash\n(.*?)\n```", re.DOTALL)


async def run(chatml: ChatTemplate, gen: Any, sample: Any, name: str, **kw: Any) -> Trajectory:
    register_agent(name, GatewayAgentLoop, grade="workspace", override=True, **kw)
    sample = dataclasses.replace(sample, agent=name)
    config = CollectorConfig(group_size=1, check_ledger=True, max_tokens=8192)
    [group] = await RolloutCollector(config, gen, chatml).collect([sample])
    return group.trajectories[0]


async def bash_harness(task: GatewayTask) -> None:
    """Ask, run the reply's bash block in the sandbox, show the output, until `submit`."""
    sandbox = task.env.sandbox  # type: ignore[union-attr]
    oa: Any = openai.AsyncOpenAI(
        base_url=task.base_url,
        api_key=task.api_key,
        max_retries=0,
        http_client=openai.DefaultAsyncHttpxClient(),
    )
    messages: list[Any] = list(task.messages)
    for _ in range(6):
        r = await oa.chat.completions.create(model=task.model, messages=messages)
        text = r.choices[0].message.content
        messages.append({"role": "assistant", "content": text})
        m = BASH.search(text)
        if m is None or m.group(1).strip() == "submit":
            return
        res = await sandbox.exec(m.group(1), timeout_s=60)
        messages.append({"role": "user", "content": f"exit {res.exit_code}\n{res.output}"})


async def test_an_openai_client_harness_fixes_a_swe_task_in_its_sandbox(
    chatml: ChatTemplate,
    swe_sample: Any,  # noqa: F811
) -> None:
    replies = ["```bash\ngit status --short\n```", f"```bash\n{FIX}\n```", "```bash\nsubmit\n```"]
    gen = ScriptedGenerator(chatml, replies)
    t = await run(chatml, gen, swe_sample(mode="bash"), "test-gw-swe-harness", agent=bash_harness)
    assert t.status is RolloutStatus.COMPLETED, t.error
    assert t.reward == 1.0 and t.report["resolved"] is True
    assert "+    return a + b" in t.report["model_patch"]
    assert len(t.turns) == 3 and len(t.segments) == 1 and t.metrics["ledger_mismatch"] == 0


class SandboxEnvironment:
    """mini-swe-agent's environment interface, running commands in an agentrl sandbox.

    mini-swe-agent calls it from its own (worker) thread; the sandbox lives on the rollout's
    event loop, so each command is handed to that loop.
    """

    def __init__(self, sandbox: Any, loop: asyncio.AbstractEventLoop) -> None:
        from minisweagent.environments.local import LocalEnvironment

        self.sandbox, self.loop = sandbox, loop
        self.local = LocalEnvironment()  # for its submit check and template variables

    def execute(self, action: dict, cwd: str = "", *, timeout: int | None = None) -> dict:
        cmd = action.get("command", "")
        fut = asyncio.run_coroutine_threadsafe(
            self.sandbox.exec(cmd, timeout_s=timeout or 60), self.loop
        )
        r = fut.result()
        out = {"output": r.output, "returncode": r.exit_code, "exception_info": ""}
        self.local._check_finished(out)  # raises Submitted on mini's submit marker
        return out

    def get_template_vars(self, **kwargs: Any) -> dict:
        return self.local.get_template_vars(**kwargs)

    def serialize(self) -> dict:
        return {}


def mini_swe_agent(task: GatewayTask, loop: asyncio.AbstractEventLoop) -> dict:
    import minisweagent
    import yaml
    from minisweagent.agents.default import DefaultAgent
    from minisweagent.models.litellm_model import LitellmModel

    cfg_path = Path(str(minisweagent.__file__)).parent / "config" / "default.yaml"
    cfg = yaml.safe_load(cfg_path.read_text())
    model = LitellmModel(
        model_name=f"openai/{task.model}",
        model_kwargs={"api_base": task.base_url, "api_key": task.api_key},
        cost_tracking="ignore_errors",
        observation_template=cfg["model"]["observation_template"],
        format_error_template=cfg["model"]["format_error_template"],
    )
    env: Any = SandboxEnvironment(task.env.sandbox, loop)  # type: ignore[union-attr]
    agent = DefaultAgent(model, env, **{**cfg["agent"], "step_limit": 6, "cost_limit": 0})
    return agent.run(task.prompt)


async def test_mini_swe_agent_from_pypi_fixes_a_swe_task_through_the_gateway(
    chatml: ChatTemplate,
    swe_sample: Any,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("minisweagent")
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network
    monkeypatch.setenv("MSWEA_CONFIGURED", "true")

    def call(cmd: str) -> str:
        body = json.dumps({"name": "bash", "arguments": {"command": cmd}})
        return f"Running it.<tool_call>{body}</tool_call>"

    gen = ScriptedGenerator(
        chatml,
        [call("cat calc/ops.py"), call(FIX), call("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT")],
    )
    loop = asyncio.get_running_loop()
    result: dict[str, Any] = {}

    def agent(task: GatewayTask) -> None:
        result.update(mini_swe_agent(task, loop))

    t = await run(chatml, gen, swe_sample(mode="bash"), "test-gw-swe-mini", agent=agent)
    assert t.status is RolloutStatus.COMPLETED, t.error
    assert result.get("exit_status") == "Submitted", result
    assert t.reward == 1.0 and t.report["resolved"] is True
    assert len(t.turns) == 3 and len(t.segments) == 1, t.report["gateway"]["log"][-1]
    assert t.metrics["ledger_mismatch"] == 0
    assert os.environ.get("OPENAI_API_KEY") != t.report["gateway"]["session"]
