"""Envs and fixtures for collector tests."""

from __future__ import annotations

from typing import Any

import pytest

from agentrl.chat import ChatTemplate
from agentrl.env import Env, register_env
from agentrl.errors import SandboxError
from agentrl.tiny import build_tokenizer
from agentrl.tool import ToolSet
from agentrl.types import Message, user


class EchoEnv(Env):
    """Shows ``prompt``; reward 1 if the reply contains ``answer``. ``turns`` replies per episode."""

    def __init__(self, prompt: str = "Say yes.", answer: str = "yes", turns: int = 1) -> None:
        self.prompt, self.answer, self.turns = prompt, answer, turns

    async def areset(self, *, seed: int | None = None, options: Any = None) -> Any:
        self.left = self.turns
        return [user(self.prompt)], {}

    async def astep(self, action: Message) -> Any:
        self.left -= 1
        done = self.left <= 0
        reward = float(self.answer in action.text) if done else 0.0
        return ([] if done else [user("Again.")]), reward, done, False, {}


class BrokenEnv(EchoEnv):
    def __init__(self, where: str = "reset", **kw: Any) -> None:
        super().__init__(**kw)
        self.where = where

    async def areset(self, *, seed: int | None = None, options: Any = None) -> Any:
        if self.where == "reset":
            raise RuntimeError("reset exploded")
        return await super().areset(seed=seed, options=options)

    async def astep(self, action: Message) -> Any:
        if self.where == "step":
            raise KeyError("step exploded")
        return await super().astep(action)


def flaky_sandbox(command: str) -> str:
    """Run a command in a sandbox that is down.

    Args:
        command: shell command.
    """
    raise SandboxError("sandbox container died")


class SandboxEnv(EchoEnv):
    tools = ToolSet([flaky_sandbox])


register_env("test-rollout/Echo-v0", EchoEnv)
register_env("test-rollout/Broken-v0", BrokenEnv)
register_env("test-rollout/Sandbox-v0", SandboxEnv)


@pytest.fixture(scope="session")
def chatml() -> ChatTemplate:
    return ChatTemplate(build_tokenizer())
