"""Moved names keep resolving for one release, each with a DeprecationWarning naming the new home."""

from __future__ import annotations

import importlib
import sys

import pytest


@pytest.mark.parametrize(
    ("old", "name", "new"),
    [
        ("agentrl.http_guard", "HttpGuard", "agentrl.http"),
        ("agentrl.toolserver.http", "ServerThread", "agentrl.http"),
        ("agentrl.toolserver.http", "ApiClient", "agentrl.http"),
        ("agentrl.inference.engine", "RequestParams", "agentrl.inference.runner"),
    ],
)
def test_moved_http_modules_warn_and_resolve(old: str, name: str, new: str) -> None:
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=new.replace(".", r"\.")):
        module = importlib.import_module(old)
    assert getattr(module, name) is getattr(importlib.import_module(new), name)


@pytest.mark.parametrize("name", ["SandboxPool", "PoolStats"])
def test_pool_from_the_sandbox_module_warns_and_resolves(name: str) -> None:
    import agentrl.sandbox as sandbox
    import agentrl.sandbox_pool as pool

    with pytest.warns(DeprecationWarning, match=r"agentrl\.sandbox_pool"):
        got = getattr(sandbox, name)
    assert got is getattr(pool, name)
    with pytest.raises(AttributeError):
        _ = sandbox.NoSuchThing  # type: ignore[attr-defined]


def test_gym_text_env_from_the_env_module_warns_and_resolves() -> None:
    import agentrl.env as env
    import agentrl.gym_text as gym_text

    with pytest.warns(DeprecationWarning, match=r"agentrl\.gym_text"):
        got = env.GymTextEnv  # type: ignore[attr-defined]
    assert got is gym_text.GymTextEnv
    with pytest.raises(AttributeError):
        _ = env.NoSuchThing  # type: ignore[attr-defined]


def test_the_inference_engine_is_the_model_runner() -> None:
    sys.modules.pop("agentrl.inference.engine", None)
    with pytest.warns(DeprecationWarning, match="ModelRunner"):
        old = importlib.import_module("agentrl.inference.engine")
    from agentrl.inference import runner

    assert old.Engine is runner.ModelRunner
    assert (old.EngineRequest, old.EngineResult) == (runner.RunnerRequest, runner.RunnerResult)
