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

from agentrl.errors import AgentRLError, ConfigError
from agentrl.registry import load_entry_point

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
    if not verbose:  # one line per HTTP request would bury the metrics tables
        logging.getLogger("httpx2").setLevel(logging.WARNING)


def _fail(err: Exception) -> NoReturn:
    typer.secho(f"error: {err}", fg=typer.colors.RED, err=True)
    sys.exit(2)


@model_app.command("tiny")
def model_tiny(
    path: Path,
    arch: Annotated[str, typer.Option(help="qwen2 or llama.")] = "qwen2",
    hidden_size: int = 64,
    num_layers: int = 2,
    seed: int = 0,
) -> None:
    """Write a tiny randomly initialised causal LM and its tokenizer as an HF directory."""
    from agentrl.tiny import make_tiny_model

    if arch not in ("qwen2", "llama"):
        raise ConfigError(f"--arch must be qwen2 or llama, got {arch!r}")
    out = make_tiny_model(
        path,
        arch="llama" if arch == "llama" else "qwen2",
        hidden_size=hidden_size,
        num_layers=num_layers,
        seed=seed,
    )
    typer.echo(str(out))


def _register_commands() -> None:
    """Attach the commands that live next to their machinery (imports stay lazy inside them)."""
    from agentrl.inference.cli import serve
    from agentrl.mcp import tools_mcp
    from agentrl.rollout.cli import rollout
    from agentrl.toolserver.cli import tools_serve

    app.command("serve")(serve)
    app.command("rollout")(rollout)
    tools_app.command("serve")(tools_serve)
    tools_app.command("mcp")(tools_mcp)
    # Training lives in trainers/ (an implementation package the kernel never imports by
    # statement); its commands are named by lazy "module:attr" strings, like registry entries.
    for name, spec in TRAINING_COMMANDS:
        app.command(name)(load_entry_point(spec))


TRAINING_COMMANDS = (
    ("train", "trainers.cli:train_cmd"),
    ("sft", "trainers.cli:sft_cmd"),
    ("eval", "trainers.cli:eval_cmd"),
)


_register_commands()


@envs_app.command("list")
def envs_list() -> None:
    """List registered environments (built-in, registered in code, and from entry points)."""
    from rich.console import Console
    from rich.table import Table

    from agentrl.env_checker import list_envs

    table = Table("id", "entry point", "description")
    for env_id, entry_point, description in list_envs():
        table.add_row(env_id, entry_point, description)
    Console().print(table)


@envs_app.command("check")
def envs_check(
    env_id: Annotated[str, typer.Argument(help="Registered env id.")],
    module: Annotated[
        list[str] | None, typer.Option(help="Import this module first (it registers the env).")
    ] = None,
) -> None:
    """Run agentrl's env checks and gymnasium's check_env on a registered env."""
    import importlib

    from agentrl.env_checker import check_env_cli

    for m in module or []:
        importlib.import_module(m)
    report = check_env_cli(env_id)
    typer.echo(str(report))
    if not report.passed:
        raise typer.Exit(code=1)


def main() -> None:
    try:
        app()
    except AgentRLError as e:
        _fail(e)


if __name__ == "__main__":
    main()
