"""Entry points of training: ``agentrl train / sft / eval`` (also ``python -m trainers.cli ...``).

    agentrl train recipes/quickstart.yaml train.steps=20 [--resume]   -> train_main -> Trainer.run
    agentrl sft   recipes/quickstart.yaml sft.steps=200               -> sft_main   -> <run_dir>/sft_model
    agentrl eval  recipes/quickstart.yaml --model runs/quickstart/hf  -> eval_main  -> eval/... metrics

Each ``*_main`` takes a recipe path and ``key=value`` overrides and returns a summary dict;
the ``*_cmd`` functions are their typer commands (registered on the ``agentrl`` app).
``--module NAME`` (repeatable; or the recipe key ``modules``) imports user code that registers
envs or AgentLoops before the recipe's names are resolved.
"""

from __future__ import annotations

import json
import logging
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
    modules: list[str] | None = None,
) -> dict[str, Any]:
    """Run RL training (SFT warm-up first when ``sft.steps`` > 0); returns the run summary."""
    from trainers.config import load_run_config
    from trainers.driver import Trainer

    import_modules(modules or [])
    cfg = load_run_config(recipe, overrides)
    return Trainer(cfg, resume=resume).run()


def sft_main(
    recipe: str | Path | None,
    overrides: list[str] | None = None,
    modules: list[str] | None = None,
) -> dict[str, Any]:
    """SFT only (env demonstrations or ``sft.dataset``); the model goes to <run_dir>/sft_model."""
    from trainers.config import load_run_config
    from trainers.driver import _start_ray, _threads
    from trainers.sft import warm_up

    import_modules(modules or [])
    cfg = load_run_config(recipe, overrides)
    if not cfg.sft.steps:
        raise AgentRLError("sft.steps is 0; set it, e.g. sft.steps=200")
    owns_ray = _start_ray(cfg.train.num_cpus)
    try:
        out = warm_up(cfg, num_threads=_threads(cfg))
    finally:
        if owns_ray:
            import ray

            ray.shutdown()
    return {"model": str(out), **json.loads((out / "agentrl_sft.json").read_text())}


def eval_main(
    recipe: str | Path | None,
    model: str | Path,
    overrides: list[str] | None = None,
    modules: list[str] | None = None,
) -> dict[str, float]:
    """Evaluate an HF directory on the recipe's held-out eval samples (``eval.num_samples``)."""
    from trainers.config import load_run_config
    from trainers.eval import evaluate_model

    import_modules(modules or [])
    cfg = load_run_config(recipe, overrides)
    with tempfile.TemporaryDirectory(prefix="agentrl-eval-") as logs:
        return evaluate_model(cfg, model, log_dir=Path(logs))


def train_cmd(
    recipe: Recipe,
    overrides: Overrides = None,
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue from the latest checkpoint.")
    ] = False,
    modules: Modules = None,
) -> None:
    """RL training (GRPO/PPO) from a recipe; key=value overrides; --resume continues a run."""
    summary = train_main(recipe, overrides or [], resume, modules=modules)
    typer.echo(json.dumps(summary, indent=2))


def sft_cmd(recipe: Recipe, overrides: Overrides = None, modules: Modules = None) -> None:
    """Supervised warm-up on env demonstrations (or sft.dataset=FILE.jsonl/.parquet)."""
    typer.echo(json.dumps(sft_main(recipe, overrides or [], modules), indent=2))


def eval_cmd(
    recipe: Recipe,
    model: Annotated[Path, typer.Option("--model", help="HF model directory to evaluate.")],
    overrides: Overrides = None,
    modules: Modules = None,
) -> None:
    """Evaluate a model directory on the recipe's envs (held-out seeds)."""
    typer.echo(json.dumps(eval_main(recipe, model, overrides or [], modules), indent=2))


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
        raise typer.Exit(code=2) from None


if __name__ == "__main__":
    main()
