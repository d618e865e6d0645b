"""Entry points of training: ``agentrl train / sft / eval`` (also ``python -m trainers.cli ...``).

    agentrl train recipes/quickstart.yaml train.steps=20 [--resume]   -> train_main -> Trainer.run
    agentrl sft   recipes/quickstart.yaml sft.steps=200               -> sft_main   -> <run_dir>/sft_model
    agentrl eval  recipes/quickstart.yaml --model runs/quickstart/hf  -> eval_main  -> eval/... metrics
    agentrl train recipes/quickstart.yaml --seeds 0,1,2   -> one run per seed + mean +/- standard error

Each ``*_main`` takes a recipe path and ``key=value`` overrides and returns a summary dict;
the ``*_cmd`` functions are their typer commands (registered on the ``agentrl`` app).
``--module NAME`` (repeatable; or the recipe key ``modules``) imports user code that registers
envs or AgentLoops before the recipe's names are resolved.
"""

from __future__ import annotations

import json
import logging
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Annotated, Any

import typer

from agentrl.cli_options import Modules
from agentrl.errors import AgentRLError
from agentrl.registry import import_modules

logger = logging.getLogger(__name__)

Recipe = Annotated[Path, typer.Argument(help="A recipe YAML, e.g. recipes/quickstart.yaml.")]
Overrides = Annotated[list[str] | None, typer.Argument(help="Dotted overrides: key=value ...")]


def train_main(
    recipe: str | Path | None,
    overrides: list[str] | None = None,
    resume: bool = False,
    *,
    command: str | None = None,
    modules: list[str] | None = None,
) -> dict[str, Any]:
    """Run RL training (SFT warm-up first when ``sft.steps`` > 0); returns the run summary."""
    from trainers.config import load_run_config
    from trainers.driver import Trainer

    import_modules(modules or [])
    cfg = load_run_config(recipe, overrides)
    if command is None:
        command = _command("train", recipe, overrides, ["--resume"] if resume else [])
    return Trainer(cfg, resume=resume, command=command).run()


def plan_main(
    recipe: str | Path | None,
    overrides: list[str],
    gpus: int | None = None,
    modules: list[str] | None = None,
) -> str:
    """The placement plan of a recipe on a host with ``gpus`` GPUs (default: this one's);
    nothing is started. A layout that cannot work is a ConfigError."""
    import torch

    from trainers.config import load_run_config
    from trainers.plan import make_plan

    import_modules(modules or [])
    cfg = load_run_config(recipe, overrides)
    n = torch.cuda.device_count() if gpus is None else gpus
    return make_plan(cfg, n).render()


def train_seeds_main(
    recipe: str | Path | None,
    seeds: list[int],
    overrides: list[str] | None = None,
    resume: bool = False,
    modules: list[str] | None = None,
    jobs: int = 1,
) -> dict[str, Any]:
    """One run per seed (``name=<name>-s<seed> seed=<seed>``), then their mean +/- standard error.

    ``jobs`` > 1 runs that many seeds at once, each in a process of its own
    (``trainers.seed_jobs``): for models small enough that one run leaves the GPU mostly idle.

    Writes ``<output_dir>/<name>-seeds/summary.json``: the per-seed summaries and, for the
    eval before and after RL, the mean and the standard error over seeds.
    """
    from agentrl.cpus import available_cpus
    from trainers.config import load_run_config
    from trainers.eval import summarize_seeds

    import_modules(modules or [])
    cfg = load_run_config(recipe, overrides)
    if jobs < 1:
        raise AgentRLError(f"--jobs must be >= 1 (runs at once), got {jobs}")
    flags = ["--seeds", ",".join(map(str, seeds)), *(["--resume"] if resume else [])]
    flags += ["--jobs", str(jobs)] if jobs > 1 else []
    command = _command("train", recipe, overrides, flags)
    out_dir = Path(cfg.output_dir) / f"{cfg.name}-seeds"
    per_seed = {s: [*(overrides or []), f"name={cfg.name}-s{s}", f"seed={s}"] for s in seeds}
    if jobs > 1:
        from trainers.seed_jobs import run_seed_jobs

        if not cfg.train.num_cpus:  # the machine's CPUs shared between the runs at once
            share = f"train.num_cpus={max(1, available_cpus() // min(jobs, len(seeds)))}"
            per_seed = {s: [*o, share] for s, o in per_seed.items()}
        argv = {
            s: [*_module_flags(modules), str(recipe), *o, *(["--resume"] if resume else [])]
            for s, o in per_seed.items()
        }
        run_dirs = {s: load_run_config(recipe, o).run_dir for s, o in per_seed.items()}
        runs = run_seed_jobs(argv, run_dirs, jobs=jobs, log_dir=out_dir)
    else:
        runs = []
        for seed, run_overrides in per_seed.items():
            logger.info("seed %d of %s: %s", seed, seeds, " ".join(run_overrides))
            runs.append(train_main(recipe, run_overrides, resume, command=command))
    return summarize_seeds(runs, out_dir, command=command)


def _module_flags(modules: list[str] | None) -> list[str]:
    return [flag for m in modules or [] for flag in ("--module", m)]


def _command(
    verb: str, recipe: str | Path | None, overrides: list[str] | None, flags: list[str]
) -> str:
    """The ``agentrl`` command line that reproduces a run (kept in summary.json)."""
    return shlex.join(
        ["agentrl", verb, *([str(recipe)] if recipe else []), *(overrides or []), *flags]
    )


def _parse_seeds(text: str | None) -> list[int] | None:
    if not text:
        return None
    try:
        seeds = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise AgentRLError(
            f"--seeds takes integers separated by commas, e.g. --seeds 0,1,2; got {text!r}"
        ) from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise AgentRLError(f"--seeds needs distinct integers, e.g. --seeds 0,1,2; got {text!r}")
    return seeds


def sft_main(
    recipe: str | Path | None,
    overrides: list[str] | None = None,
    modules: list[str] | None = None,
) -> dict[str, Any]:
    """SFT only (env demonstrations or ``sft.dataset``); the model goes to <run_dir>/sft_model."""
    from trainers.config import load_run_config
    from trainers.runtime import start_ray, threads_per_rank
    from trainers.sft import warm_up

    import_modules(modules or [])
    cfg = load_run_config(recipe, overrides)
    if not cfg.sft.steps:
        raise AgentRLError("sft.steps is 0; set it, e.g. sft.steps=200")
    owns_ray = start_ray(cfg.train.num_cpus)
    try:
        out = warm_up(cfg, num_threads=threads_per_rank(cfg))
    finally:
        if owns_ray:
            import ray

            ray.shutdown()
    return {"model": str(out), **json.loads((out / "agentrl_sft.json").read_text())}


def eval_main(
    recipe: str | Path | None,
    model: str | Path,
    overrides: list[str] | None = None,
    seeds: list[int] | None = None,
    modules: list[str] | None = None,
    *,
    servers: list[str] | None = None,
    k: int = 1,
    tasks: str | Path | None = None,
    out: str | Path | None = None,
) -> dict[str, Any]:
    """Evaluate an HF directory on the recipe's eval split (``eval.num_samples`` per seed).

    With ``seeds``, the eval runs once per seed (``seed=<seed>``: the sampling seed of the
    servers) and the result holds each seed's metrics plus the mean and standard error over
    seeds of every ``eval/...`` metric. ``servers``: use running inference servers instead of
    serving ``model`` (which then only gives the tokenizer and chat template). ``k``: samples
    per task, for pass@1 and pass@k. ``tasks``: a task file given to every env of the recipe
    as ``tasks=`` (SWE and GUI envs). ``out``: a folder for ``per_instance.jsonl``,
    ``trajectories.jsonl`` and, where the env's grader reports patches, ``predictions.jsonl``
    in SWE-bench's format.
    """
    from agentrl.rollout.io import save_trajectories
    from agentrl.types import Trajectory
    from trainers.config import load_run_config
    from trainers.eval import evaluate_model, mean_and_se, per_instance, swe_bench_predictions

    import_modules(modules or [])
    if tasks is not None and not Path(tasks).is_file():
        raise AgentRLError(f"--tasks {str(tasks)!r} is not a file")
    kept: list[Trajectory] = []

    def one(extra: list[str]) -> dict[str, float]:
        cfg = load_run_config(recipe, [*(overrides or []), *extra])
        if tasks is not None:
            for e in cfg.data.envs:
                e.kwargs["tasks"] = str(Path(tasks).resolve())
        with tempfile.TemporaryDirectory(prefix="agentrl-eval-") as logs:
            return evaluate_model(cfg, model, log_dir=Path(logs), servers=servers, k=k, keep=kept)

    if not seeds:
        result: dict[str, Any] = one([])
    else:
        per_seed = {str(seed): one([f"seed={seed}"]) for seed in seeds}
        keys = sorted(next(iter(per_seed.values())))
        stats = {key: mean_and_se([m[key] for m in per_seed.values()]) for key in keys}
        flags = ["--model", str(model), "--seeds", ",".join(map(str, seeds))]
        result = {
            "command": _command("eval", recipe, overrides, flags),
            "seeds": seeds,
            "mean": {key: v[0] for key, v in stats.items()},
            "se_over_seeds": {key: v[1] for key, v in stats.items()},
            "per_seed": per_seed,
        }
    if out is not None:
        d = Path(out)
        d.mkdir(parents=True, exist_ok=True)
        rows = per_instance(kept, k)
        (d / "per_instance.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        save_trajectories(d / "trajectories.jsonl", kept)
        preds = swe_bench_predictions(kept, Path(model).name)
        if preds:
            (d / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in preds))
        _print_instances(rows, k)
    return result


def _print_instances(rows: list[dict[str, Any]], k: int) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{len(rows)} eval tasks")
    for col in ("task", "n", "passed", "pass@1", *([f"pass@{k}"] if k > 1 else []), "statuses"):
        table.add_column(col)
    for r in rows:
        table.add_row(
            r["task"],
            str(r["n"]),
            str(r["passed"]),
            f"{r['pass@1']:.2f}",
            *([f"{r.get(f'pass@{k}', float('nan')):.2f}"] if k > 1 else []),
            ",".join(r["statuses"]),
        )
    Console(stderr=True).print(table)


Seeds = Annotated[
    str | None,
    typer.Option(
        "--seeds",
        help="Comma-separated seeds, e.g. 0,1,2: one run each, then mean +/- standard error.",
    ),
]


def train_cmd(
    recipe: Recipe,
    overrides: Overrides = None,
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue from the latest checkpoint.")
    ] = False,
    seeds: Seeds = None,
    modules: Modules = None,
    plan: Annotated[
        bool,
        typer.Option(
            "--plan",
            help="Print where each process would run (GPUs, layout, weight sync) and exit.",
        ),
    ] = False,
    gpus: Annotated[
        int | None,
        typer.Option("--gpus", help="With --plan: the host's GPU count (default: this machine's)."),
    ] = None,
    jobs: Annotated[
        int,
        typer.Option(
            "--jobs",
            help="With --seeds: how many seeds train at once, each in its own process "
            "(they share the machine's GPUs and CPUs).",
        ),
    ] = 1,
) -> None:
    """RL training (GRPO/PPO) from a recipe; key=value overrides; --resume continues a run."""
    if plan:
        typer.echo(plan_main(recipe, overrides or [], gpus, modules))
        return
    seed_list = _parse_seeds(seeds)
    if jobs != 1 and not seed_list:
        raise AgentRLError(f"--jobs {jobs} needs --seeds (several runs to train at once)")
    if seed_list:
        summary = train_seeds_main(recipe, seed_list, overrides or [], resume, modules, jobs)
    else:
        summary = train_main(recipe, overrides or [], resume, modules=modules)
    typer.echo(json.dumps(summary, indent=2))


def sft_cmd(recipe: Recipe, overrides: Overrides = None, modules: Modules = None) -> None:
    """Supervised warm-up on env demonstrations (or sft.dataset=FILE.jsonl/.parquet)."""
    typer.echo(json.dumps(sft_main(recipe, overrides or [], modules), indent=2))


def eval_cmd(
    recipe: Recipe,
    model: Annotated[
        Path,
        typer.Option(
            "--model", help="HF model directory to evaluate (with --server: its tokenizer)."
        ),
    ],
    overrides: Overrides = None,
    seeds: Seeds = None,
    modules: Modules = None,
    server: Annotated[
        list[str] | None,
        typer.Option(
            "--server",
            help="A running inference server to use instead of serving --model (repeatable); "
            "vllm+URL or sglang+URL for those backends.",
        ),
    ] = None,
    k: Annotated[
        int, typer.Option("--k", help="Samples per eval task; reports pass@1 and pass@k.")
    ] = 1,
    tasks: Annotated[
        Path | None,
        typer.Option("--tasks", help="A task file (.jsonl/.parquet) given to the envs as tasks=."),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help="Write per_instance.jsonl, trajectories.jsonl and (SWE) predictions.jsonl here.",
        ),
    ] = None,
) -> None:
    """Evaluate a model directory on the recipe's eval split (tasks disjoint from training)."""
    result = eval_main(
        recipe,
        model,
        overrides or [],
        _parse_seeds(seeds),
        modules,
        servers=server,
        k=k,
        tasks=tasks,
        out=out,
    )
    typer.echo(json.dumps(result, indent=2))


app = typer.Typer(name="trainers", no_args_is_help=True, pretty_exceptions_enable=False)
app.command("train")(train_cmd)
app.command("sft")(sft_cmd)
app.command("eval")(eval_cmd)


def main() -> None:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("httpx2").setLevel(logging.WARNING)  # one line per request otherwise
    try:
        app()
    except AgentRLError as e:
        typer.secho(f"error: {e}", fg=typer.colors.RED, err=True)
        sys.exit(2)  # outside app() a typer.Exit is a traceback, not an exit code


if __name__ == "__main__":
    main()
