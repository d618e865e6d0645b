"""``agentrl swe prepare | synth | validate``: repositories, synthesized tasks, and their check.

    agentrl swe prepare --out /var/tmp/swe                       # every repo in envs.swe.repos
    agentrl swe synth toolz six --repos-dir /var/tmp/swe --out tasks.jsonl
    agentrl swe validate tasks.jsonl --repos-dir /var/tmp/swe --sample 10

Registered by ``agentrl_builtins`` as a command group; the heavy modules load inside each
command, so ``agentrl --help`` stays fast.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path
from typing import Annotated

import typer

swe_app = typer.Typer(
    help="SWE tasks: prepare repositories, synthesize tasks, validate them.", no_args_is_help=True
)

ReposDir = Annotated[
    Path, typer.Option("--repos-dir", help="Where `agentrl swe prepare` put the repos.")
]


@swe_app.command("prepare")
def prepare_cmd(
    names: Annotated[
        list[str] | None, typer.Argument(help="Repos to prepare (default: all pinned ones).")
    ] = None,
    out: Annotated[
        Path, typer.Option("--out", help="Folder for repos, envs and downloads (not under /tmp).")
    ] = Path("/var/tmp/agentrl-swe"),
    tasks: Annotated[
        list[Path] | None,
        typer.Option("--tasks", help="Also make the base commits of these tasks (repeatable)."),
    ] = None,
) -> None:
    """Download the pinned sdists, check their sha256, commit them, build their test envs."""
    from envs.swe.repos import prepare
    from envs.swe.synth import materialize
    from envs.swe.task import load_tasks

    t0 = time.perf_counter()
    prepared = prepare(names or [], out)
    if tasks:
        rows = [row for path in tasks for row in load_tasks(path)]
        missing = sorted({t.repo for t in rows} - set(prepared))
        if missing:
            prepared.update(prepare(missing, out))
        materialize(rows, out)
    for name, p in prepared.items():
        typer.echo(f"{name:16} {p.commit}  {p.repo_dir}")
    typer.echo(f"prepared {len(prepared)} repo(s) in {time.perf_counter() - t0:.1f} s")


@swe_app.command("synth")
def synth_cmd(
    repos: Annotated[list[str], typer.Argument(help="Prepared repos to make tasks from.")],
    out: Annotated[Path, typer.Option("--out", help="Task file to write (.jsonl or .parquet).")],
    repos_dir: ReposDir = Path("/var/tmp/agentrl-swe"),
    per_repo: Annotated[int, typer.Option(help="Kept tasks per repo, at most.")] = 100,
    max_candidates: Annotated[
        int, typer.Option(help="Candidates validated per repo, at most.")
    ] = 600,
    seed: Annotated[int, typer.Option(help="Seed of the candidate order.")] = 0,
    workers: Annotated[int, typer.Option(help="Parallel test runs.")] = 2,
    families: Annotated[
        list[str] | None,
        typer.Option(
            "--family",
            help="Only this mutation family (repeatable; default: all of envs.swe.mutate.FAMILIES).",
        ),
    ] = None,
) -> None:
    """Inject bugs by syntax-tree mutation and keep those the repo's own tests catch."""
    from agentrl.errors import ConfigError
    from envs.swe.mutate import FAMILIES
    from envs.swe.repos import load_prepared
    from envs.swe.synth import SynthConfig, synthesize
    from envs.swe.task import save_tasks

    t0 = time.perf_counter()
    try:
        cfg = SynthConfig(
            per_repo=per_repo,
            max_candidates=max_candidates,
            seed=seed,
            workers=workers,
            families=tuple(families) if families else FAMILIES,
        )
    except ConfigError as e:
        raise typer.BadParameter(str(e), param_hint="--family") from None
    tasks = synthesize([load_prepared(repos_dir, r) for r in repos], cfg, log=typer.echo)
    save_tasks(out, tasks)
    by_repo = Counter(t.repo for t in tasks)
    by_family = Counter(str(t.metadata["family"]) for t in tasks)
    typer.echo(f"wrote {len(tasks)} tasks to {out} in {time.perf_counter() - t0:.0f} s")
    typer.echo("  by repo:   " + ", ".join(f"{k} {v}" for k, v in sorted(by_repo.items())))
    typer.echo("  by family: " + ", ".join(f"{k} {v}" for k, v in sorted(by_family.items())))


@swe_app.command("validate")
def validate_cmd(
    tasks: Annotated[Path, typer.Argument(help="Task file (.jsonl or .parquet).")],
    repos_dir: ReposDir = Path("/var/tmp/agentrl-swe"),
    sample_n: Annotated[
        int | None, typer.Option("--sample", help="Check this many tasks, drawn with --seed.")
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the sample.")] = 0,
    workers: Annotated[int, typer.Option(help="Tasks graded at once.")] = 2,
) -> None:
    """Grade each task in sandboxes: the base must fail, the gold patch must pass."""
    from envs.swe.task import load_tasks
    from envs.swe.validate import Check, sample, validate_tasks

    rows = sample(load_tasks(tasks), sample_n, seed)
    typer.echo(f"{'task':72} {'base':>6} {'gold':>6} {'s':>6}  result")

    def show(c: Check) -> None:
        base = "pass" if c.base_resolved else "fail"
        gold = "pass" if c.gold_resolved else "fail"
        verdict = "ok" if c.ok else f"BAD {c.error[:120]}"
        typer.echo(f"{c.instance_id[:72]:72} {base:>6} {gold:>6} {c.seconds:6.1f}  {verdict}")

    t0 = time.perf_counter()
    checks = asyncio.run(validate_tasks(rows, repos_dir, workers=workers, log=show))
    bad = [c for c in checks if not c.ok]
    typer.echo(
        f"{len(checks) - len(bad)}/{len(checks)} tasks valid in {time.perf_counter() - t0:.0f} s"
    )
    if bad:
        raise typer.Exit(1)
