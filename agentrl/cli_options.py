"""Options that several ``agentrl`` commands share: user modules to import, env kwargs.

    agentrl envs check mine/Reverse-v0 --module my_envs --env-kwargs '{"words": ["a"]}'
    agentrl rollout ... --module my_loops rollout.agent=self_check
    agentrl train recipe.yaml --module my_loops          # or `modules: [my_loops]` in the recipe

``--module`` imports a module (a name found in the current directory or on sys.path, or a
``.py`` path) before the command resolves any registered name; see
``agentrl.registry.import_modules``.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from agentrl.errors import ConfigError

Modules = Annotated[
    list[str] | None,
    typer.Option(
        "--module",
        help="Import this module first, for the envs/AgentLoops/tools it registers "
        "(a name in the current directory or on sys.path, or a .py file); repeatable.",
    ),
]

EnvKwargs = Annotated[
    str,
    typer.Option("--env-kwargs", help='JSON object of env constructor kwargs, e.g. {"high": 32}.'),
]


def parse_env_kwargs(text: str) -> dict[str, Any]:
    """``--env-kwargs`` as a dict; a ConfigError that shows the expected form otherwise."""
    try:
        kwargs = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(
            f"--env-kwargs must be a JSON object, e.g. '{{\"high\": 32}}': {e}"
        ) from None
    if not isinstance(kwargs, dict):
        raise ConfigError(f"--env-kwargs must be a JSON object, got {text!r}")
    return kwargs
