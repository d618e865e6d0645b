"""The built-in ``gateway`` agent loop, named and configured from a recipe (no Python code)."""

from __future__ import annotations

import sys
from pathlib import Path

import openai
import pytest
import yaml

from agentrl.chat import ChatTemplate
from agentrl.errors import ConfigError
from agentrl.rollout.collector import RolloutCollector
from agentrl.rollout.testing import ScriptedGenerator
from agentrl.types import RolloutStatus, Sample
from agents.gateway_agent import GatewayAgentLoop, GatewayTask
from trainers.config import load_run_config

AGENT_SCRIPT = """
import os, openai
oa = openai.OpenAI(max_retries=0)  # OPENAI_BASE_URL and OPENAI_API_KEY from the environment
r = oa.chat.completions.create(model=os.environ["AGENTRL_MODEL"],
    messages=[{"role": "user", "content": os.environ["AGENTRL_TASK"]}])
print("got:", r.choices[0].message.content)
"""


async def answer_agent(task: GatewayTask) -> None:
    """Named in a recipe as ``tests.agents.test_gateway_config:answer_agent``."""
    async with openai.AsyncOpenAI(base_url=task.base_url, api_key=task.api_key) as oa:
        await oa.chat.completions.create(model=task.model, messages=task.messages)


def recipe(tmp_path: Path, options: dict[str, object]) -> Path:
    path = tmp_path / "gateway.yaml"
    rollout = {"agent": "gateway", "group_size": 2, "agent_options": options}
    data = {"envs": [{"id": "test-agents/Calc-v0"}]}
    path.write_text(yaml.safe_dump({"rollout": rollout, "data": data}))
    return path


@pytest.mark.parametrize(
    "options",
    [
        {"command": [sys.executable, "-c", AGENT_SCRIPT], "timeout_s": 60},
        {"agent": "tests.agents.test_gateway_config:answer_agent"},
    ],
    ids=["subprocess", "callable"],
)
async def test_a_recipe_names_the_gateway_agent_and_its_options(
    chatml: ChatTemplate, tmp_path: Path, options: dict[str, object]
) -> None:
    cfg = load_run_config(recipe(tmp_path, options), ["rollout.agent_options.model=my-model"])
    assert cfg.rollout.agent == "gateway" and cfg.rollout.agent_options["model"] == "my-model"
    gen = ScriptedGenerator(chatml, ["The answer is 84."])
    collector = RolloutCollector(cfg.rollout, gen, chatml)
    [group] = await collector.collect([Sample(env_id="test-agents/Calc-v0", seed=0)])
    assert len(group.trajectories) == 2
    for t in group.trajectories:
        assert t.agent == "gateway"
        assert t.status is RolloutStatus.COMPLETED and t.reward == 1.0, t.error
        [entry] = t.report["gateway"]["log"]
        assert entry["request"]["model"] == entry["response"]["model"] == "my-model"
        if "command" in options:
            assert "got: The answer is 84." in t.report["agent_output"]


def test_bad_gateway_options_fail_when_the_collector_is_built(
    chatml: ChatTemplate, tmp_path: Path
) -> None:
    gen = ScriptedGenerator(chatml, ["unused"])
    cfg = load_run_config(recipe(tmp_path, {"comand": "python agent.py"}))
    with pytest.raises(ConfigError, match=r"agent_options \['comand'\].*'gateway'"):
        RolloutCollector(cfg.rollout, gen, chatml)
    cfg = load_run_config(recipe(tmp_path, {"timeout_s": 5}))
    with pytest.raises(ConfigError, match=r"rollout\.agent_options\.command"):
        RolloutCollector(cfg.rollout, gen, chatml)


def test_the_gateway_loop_is_registered() -> None:
    from agentrl.agent import AGENTS

    loop = AGENTS.make("gateway", command="python agent.py", timeout_s=5)
    assert isinstance(loop, GatewayAgentLoop) and loop.command == ["python", "agent.py"]
