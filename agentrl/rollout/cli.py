"""``agentrl rollout``: collect trajectories for an env and save them to JSONL or parquet.

    agentrl rollout --env ID --server URL [--server URL ...] --tokenizer PATH --n 16 --out t.jsonl
    agentrl rollout --env ID --model PATH --n 16 --out t.parquet   # starts an embedded server

Samples are ``Sample(env_id, env_kwargs, seed=seed0 + i)``; each is rolled out
``rollout.group_size`` times. Any ``CollectorConfig`` field can be overridden as
``rollout.<field>=value`` (e.g. ``rollout.max_turns=4``). Groups stream to the file as they
finish and are written when collection ends; the file loads back with ``agentrl.rollout.io.load_groups``.
``--module my_loops`` imports user code first (an AgentLoop or env registered there).

The command prints the rollout metrics and a count per status. It exits 1 when no
trajectory got past the machinery (every one is an infrastructure failure such as
error_inference: a server down), so scripts and CI notice.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Annotated, Any

import typer

from agentrl.cli_options import EnvKwargs, Modules, parse_env_kwargs
from agentrl.errors import ConfigError
from agentrl.types import RolloutStatus

logger = logging.getLogger(__name__)


def rollout(
    env: Annotated[str, typer.Option(help="Registered env id (see `agentrl envs list`).")],
    out: Annotated[Path, typer.Option(help="Output file: .jsonl or .parquet.")],
    server: Annotated[
        list[str] | None, typer.Option(help="Server URL; repeat for several.")
    ] = None,
    model: Annotated[
        Path | None, typer.Option(help="HF model dir: start an embedded server.")
    ] = None,
    tokenizer: Annotated[
        Path | None, typer.Option(help="Tokenizer dir (default: --model).")
    ] = None,
    n: Annotated[int, typer.Option(help="Number of samples (prompts).")] = 8,
    seed: Annotated[int, typer.Option(help="Seed of the first sample.")] = 0,
    env_kwargs: EnvKwargs = "{}",
    module: Modules = None,
    overrides: Annotated[list[str] | None, typer.Argument(help="rollout.<field>=value")] = None,
) -> None:
    """Collect trajectories for an env against one or several inference servers."""
    from agentrl.config import load_config
    from agentrl.registry import import_modules
    from agentrl.rollout.collector import CollectorConfig

    if not server and model is None:
        raise ConfigError("give --server URL (repeatable) or --model PATH to start a local server")
    if out.suffix not in (".jsonl", ".parquet"):
        raise ConfigError(f"--out must end in .jsonl or .parquet, got {str(out)!r}")
    kwargs = parse_env_kwargs(env_kwargs)
    import_modules(module or [])
    stripped = []
    for o in overrides or []:
        if not o.startswith("rollout."):
            raise ConfigError(
                f"override {o!r} must start with 'rollout.' (a CollectorConfig field)"
            )
        stripped.append(o.removeprefix("rollout."))
    cfg = load_config(CollectorConfig, overrides=stripped)
    tok_dir = tokenizer or model
    if tok_dir is None:
        raise ConfigError("give --tokenizer PATH (the served model's directory) with --server")
    from agentrl.agent import AGENTS
    from agentrl.env import ENVS

    ENVS.spec(env)  # unknown ids fail here, with a suggestion
    AGENTS.get(cfg.agent)  # and unknown (or doubly registered) AgentLoops
    summary = asyncio.run(_collect(env, kwargs, n, seed, cfg, server or [], model, tok_dir, out))
    typer.echo(json.dumps(summary, indent=2))
    statuses = {
        k.removeprefix("rollout/status/"): round(v * summary["rollout/num_trajectories"])
        for k, v in summary.items()
        if k.startswith("rollout/status/") and v
    }
    counts = ", ".join(f"{k}={v}" for k, v in sorted(statuses.items())) or "none"
    typer.echo(f"statuses: {counts}", err=True)
    if not any(not RolloutStatus(k).is_infra_failure for k in statuses):
        typer.secho(
            "error: no trajectory got past the machinery (every one is an infrastructure "
            f"failure: {counts}); check the servers (--server/--model) and the first errors in "
            f"{out}",
            fg=typer.colors.RED,
            err=True,
        )
        raise typer.Exit(code=1)


async def _collect(
    env: str,
    kwargs: dict[str, Any],
    n: int,
    seed: int,
    cfg: Any,
    servers: list[str],
    model: Path | None,
    tok_dir: Path,
    out: Path,
) -> dict[str, float]:
    from contextlib import ExitStack

    from rich.progress import Progress

    from agentrl.chat import ChatTemplate
    from agentrl.inference.client import InferenceClient
    from agentrl.inference.launch import ServerProcess
    from agentrl.rollout.collector import RolloutCollector
    from agentrl.rollout.io import save_groups
    from agentrl.types import Sample, TrajectoryGroup

    with ExitStack() as stack:
        urls = list(servers)
        if model is not None and not urls:
            srv = stack.enter_context(ServerProcess(ServerProcess.Config(model=str(model))))
            urls = [srv.url]
        template = ChatTemplate.from_pretrained(tok_dir)
        samples = [Sample(env_id=env, env_kwargs=kwargs, seed=seed + i) for i in range(n)]
        groups: list[TrajectoryGroup] = []
        async with InferenceClient(urls) as client:
            collector = RolloutCollector(cfg, client, template)
            with Progress() as progress:
                task = progress.add_task(f"rollouts of {env}", total=n)
                async for g in collector.stream(samples):
                    groups.append(g)
                    progress.advance(task)
        save_groups(out, groups)
        metrics = RolloutCollector.metrics(groups)
    logger.info("wrote %d groups to %s", len(groups), out)
    return metrics
