"""The `agentrl` command line: one typer app; every command imports its machinery lazily.

agentrl serve PATH                     serve an HF model directory over HTTP
agentrl rollout --env ID --server URL  collect trajectories to JSONL/parquet
agentrl envs list | check ID           discover and validate environments
agentrl train RECIPE key=value ...     RL training (GRPO/PPO); --resume continues a run
agentrl sft RECIPE ... / eval ...      supervised warm-up / evaluation
agentrl model tiny PATH                build a tiny local model + tokenizer (no hub needed)
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Annotated, NoReturn

import typer

from agentrl.errors import AgentRLError

app = typer.Typer(
    name="agentrl",
    help="Environment-centric reinforcement learning for LLM agents.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
envs_app = typer.Typer(help="Discover and validate environments.", no_args_is_help=True)
model_app = typer.Typer(help="Model utilities.", no_args_is_help=True)
tools_app = typer.Typer(help="Serve and inspect tools.", no_args_is_help=True)
app.add_typer(envs_app, name="envs")
app.add_typer(model_app, name="model")
app.add_typer(tools_app, name="tools")


@app.callback()
def _main(verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def _fail(err: Exception) -> NoReturn:
    typer.secho(f"error: {err}", fg=typer.colors.RED, err=True)
    sys.exit(2)


@model_app.command("tiny")
def model_tiny(
    path: Path,
    arch: str = "qwen2",
    hidden_size: int = 64,
    num_layers: int = 2,
    seed: int = 0,
) -> None:
    """Write a tiny randomly initialised causal LM and its tokenizer as an HF directory."""
    from agentrl.tiny import make_tiny_model

    out = make_tiny_model(
        path, arch=arch, hidden_size=hidden_size, num_layers=num_layers, seed=seed
    )  # type: ignore[arg-type]
    typer.echo(str(out))


def _register_commands() -> None:
    """Attach the commands that live next to their machinery (imports stay lazy inside them)."""
    from agentrl.inference.cli import serve
    from agentrl.rollout.cli import rollout

    app.command("serve")(serve)
    app.command("rollout")(rollout)


_register_commands()


def main() -> None:
    try:
        app()
    except AgentRLError as e:
        _fail(e)


if __name__ == "__main__":
    main()
