"""The `agentrl` command line: one typer app; every command imports its machinery lazily.

agentrl serve PATH                     serve an HF model directory over HTTP
agentrl rollout --env ID --server URL  collect trajectories to JSONL/parquet
agentrl envs list | check | serve    discover, validate and serve environments
agentrl tools list | serve | mcp       registered tools; serve a ToolSet over HTTP or MCP
agentrl train RECIPE key=value ...     RL training (GRPO/PPO); --resume continues a run
agentrl sft RECIPE ... / eval ...      supervised warm-up / evaluation
agentrl model tiny PATH                build a tiny local model + tokenizer (no hub needed)
agentrl view PATH [--port P]           browse a run's trajectories, token by token (web page)
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, NoReturn

import typer

from agentrl.cli_options import EnvKwargs, Modules, parse_env_kwargs
from agentrl.errors import AgentRLError, ConfigError
from agentrl.plugins import COMMANDS, load_plugins
from agentrl.registry import import_modules, load_entry_point

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
    arch: Annotated[
        str, typer.Option(help="qwen2, llama, or qwen2_vl (a vision-language model).")
    ] = "qwen2",
    hidden_size: int = 64,
    num_layers: int = 2,
    seed: int = 0,
    corpus: Annotated[
        Path | None,
        typer.Option(help="A text file the tokenizer also learns merges from (your task's text)."),
    ] = None,
) -> None:
    """Write a tiny randomly initialised causal LM (or VLM) and its tokenizer as an HF directory."""
    from agentrl.tiny import make_tiny_model

    if arch not in ("qwen2", "llama", "qwen2_vl"):
        raise ConfigError(f"--arch must be qwen2, llama or qwen2_vl, got {arch!r}")
    if corpus is not None and not corpus.is_file():
        raise ConfigError(f"--corpus {corpus}: no such file (expected a text file)")
    out = make_tiny_model(
        path,
        arch=arch,  # type: ignore[arg-type]  # checked above
        hidden_size=hidden_size,
        num_layers=num_layers,
        seed=seed,
        corpus=corpus.read_text().splitlines() if corpus is not None else (),
    )
    typer.echo(str(out))


def _register_commands() -> None:
    """Attach the commands that live next to their machinery (imports stay lazy inside them)."""
    from agentrl.envserver.cli import envs_serve
    from agentrl.inference.cli import serve
    from agentrl.mcp import tools_mcp
    from agentrl.rollout.cli import rollout
    from agentrl.toolserver.cli import tools_serve
    from agentrl.viewer.cli import view

    app.command("serve")(serve)
    app.command("rollout")(rollout)
    app.command("view")(view)
    tools_app.command("serve")(tools_serve)
    envs_app.command("serve")(envs_serve)
    tools_app.command("mcp")(tools_mcp)
    # Commands that plugins add (the built-ins' train, sft and eval live in trainers/, which
    # the kernel never names): lazy "module:attr" strings, like registry entries.
    load_plugins()
    for name, spec in sorted(COMMANDS.items()):
        obj = load_entry_point(spec)
        if isinstance(obj, typer.Typer):  # a command group: `agentrl <name> <sub> ...`
            app.add_typer(obj, name=name)
        else:
            app.command(name)(obj)


_register_commands()


@envs_app.command("list")
def envs_list(module: Modules = None) -> None:
    """List registered environments (built-in, registered in code, and from entry points)."""
    from agentrl.env_checker import list_envs

    import_modules(module or [])
    _print_table(("id", "entry point", "description"), list_envs())


@envs_app.command("check")
def envs_check(
    env_id: Annotated[str, typer.Argument(help="Registered env id.")],
    module: Modules = None,
    env_kwargs: EnvKwargs = "{}",
) -> None:
    """Run agentrl's env checks and gymnasium's check_env on a registered env."""
    from agentrl.env_checker import check_env_cli

    kwargs = parse_env_kwargs(env_kwargs)
    import_modules(module or [])
    report = check_env_cli(env_id, kwargs)
    typer.echo(str(report))
    if not report.passed:
        raise typer.Exit(code=1)


@tools_app.command("list")
def tools_list(module: Modules = None) -> None:
    """List registered tools (built-in, registered in code, and from entry points)."""
    from agentrl.tool import TOOLS

    import_modules(module or [])
    rows = [(s.id, s.entry_point_str, s.description.strip().split("\n")[0]) for s in TOOLS]
    _print_table(("name", "entry point", "description"), rows)


def _print_table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> None:
    """A rich table on a terminal; plain aligned columns (never cut) when piped or logged."""
    if sys.stdout.isatty():
        from rich.console import Console
        from rich.table import Table

        table = Table(*header)
        first = table.columns[0]  # ids are what users copy: never cut or wrap them
        first.no_wrap = True
        first.min_width = max((len(r[0]) for r in rows), default=0)
        for row in rows:
            table.add_row(*row)
        Console().print(table)
        return
    lines: list[tuple[str, ...]] = [header, *rows]
    widths = [max(len(r[i]) for r in lines) for i in range(len(header) - 1)]
    for row in lines:
        cells = [c.ljust(w) for c, w in zip(row, widths, strict=False)]
        typer.echo("  ".join([*cells, row[-1]]).rstrip())


def main() -> None:
    try:
        app()
    except AgentRLError as e:
        _fail(e)


if __name__ == "__main__":
    main()
