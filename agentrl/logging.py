"""Training metrics: one logger, several backends, keys named ``area/name``.

    logger = MetricsLogger(MetricsLogger.Config(tensorboard=True), run_dir="runs/x")
    with timer.time("generate"): ...              # -> timing/generate_s
    logger.log({"rollout/reward_mean": 0.4, **timer.pop()}, step=3)

A step's metrics go to every enabled backend: a rich table on the console (rank 0 only), one
JSON object per line in ``<run_dir>/metrics.jsonl`` (the file tests and plots read back),
TensorBoard scalars in ``<run_dir>/tb``, and a Weights & Biases run (``wandb.mode`` online or
offline; files under ``<run_dir>/wandb``). ``progress()`` shows a rich progress bar for long work
on a terminal; when stderr is a file or a pipe (CI, ``nohup``, a cluster job) it logs a line
every ``every`` steps instead, with the elapsed time and an ETA.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from agentrl.errors import ConfigError

logger = logging.getLogger(__name__)

# Keys every RL step reports (tests check them; dashboards rely on them).
REQUIRED_KEYS: tuple[str, ...] = (
    "rollout/reward_mean",
    "rollout/reward_std",
    "rollout/success_rate",
    "rollout/response_len_mean",
    "rollout/turns_mean",
    "rollout/tool_error_rate",
    "train/pg_loss",
    "train/pg_clipfrac",
    "train/ppo_kl",
    "train/entropy",
    "train/grad_norm",
    "train/lr",
    "train/rollout_logprob_diff",
    "timing/generate_s",
    "timing/logprob_s",
    "timing/update_s",
    "timing/sync_s",
    "timing/step_s",
    "throughput/gen_tokens_per_s",
    "throughput/train_tokens_per_s",
    "throughput/samples_per_s",
    "driver/bytes_out",
    "driver/bytes_in",
)


def check_key(key: str) -> None:
    """Raise ConfigError unless ``key`` looks like ``area/name``."""
    area, sep, name = key.partition("/")
    if not sep or not area or not name:
        raise ConfigError(f"metric key {key!r} must look like 'area/name', e.g. 'train/pg_loss'")


def mean_metrics(items: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Average dicts of metrics key by key (keys missing from some dicts average over the rest)."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for item in items:
        for k, v in item.items():
            sums[k] = sums.get(k, 0.0) + float(v)
            counts[k] = counts.get(k, 0) + 1
    return {k: sums[k] / counts[k] for k in sums}


class Timer:
    """Wall-clock sections of a step: ``with timer.time("update"):`` -> ``timing/update_s``.

    ``agentrl.metrics_schema.step_metrics`` turns them, with the step's counts, into the
    timing and throughput keys every training loop reports."""

    def __init__(self) -> None:
        self._totals: dict[str, float] = {}

    @contextmanager
    def time(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            key = f"timing/{name}_s"
            self._totals[key] = self._totals.get(key, 0.0) + time.perf_counter() - t0

    def pop(self) -> dict[str, float]:
        """Return the sections timed since the last pop, and start over."""
        out, self._totals = self._totals, {}
        return out


class Backend(Protocol):
    def log(self, metrics: Mapping[str, float], step: int) -> None: ...

    def close(self) -> None: ...


class JsonlBackend:
    """One JSON object per step: ``{"step": k, "train/pg_loss": ..., ...}``, flushed each line."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._f = path.open("a", encoding="utf-8")

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        row = {"step": step, **{k: _jsonable(v) for k, v in metrics.items()}}
        self._f.write(json.dumps(row) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def _jsonable(v: float) -> float | None:
    v = float(v)
    return v if math.isfinite(v) else None


class TensorBoardBackend:
    """Scalars under ``<run_dir>/tb`` (``tensorboard --logdir runs/``)."""

    def __init__(self, logdir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(log_dir=str(logdir))

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        for k, v in metrics.items():
            self._writer.add_scalar(k, float(v), global_step=step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class WandbBackend:
    """A Weights & Biases run: each step's metrics at that step; its files in ``<run_dir>/wandb``.

    One W&B run per logger: an RL run's SFT warm-up is a second run (job type ``sft``) and a
    resumed run a new one, all in the group named after the run.
    """

    MODES = ("online", "offline", "disabled")

    @dataclass(kw_only=True)
    class Config:
        mode: str = "disabled"
        """online (sync while training), offline (write files; ``wandb sync`` later) or disabled."""
        project: str = ""
        """The W&B project; needed unless mode is disabled."""
        entity: str = ""
        """The W&B team or user; empty: your default entity."""
        name: str = ""
        """The W&B run's name; empty: the run's ``name`` (``<name>-sft`` for the warm-up)."""
        group: str = ""
        """The W&B group; empty: the run's ``name``."""
        tags: list[str] = field(default_factory=list)

        @property
        def enabled(self) -> bool:
            return self.mode != "disabled"

        def validate(self) -> None:
            """Raise ConfigError for an unknown mode, a missing project or a missing wandb."""
            if self.mode not in WandbBackend.MODES:
                raise ConfigError(
                    f"logging.wandb.mode must be one of {', '.join(WandbBackend.MODES)}, "
                    f"got {self.mode!r}"
                )
            if not self.enabled:
                return
            if not self.project:
                raise ConfigError(
                    f"logging.wandb.mode={self.mode} needs a project: set "
                    "logging.wandb.project=<name> (or logging.wandb.mode=disabled)"
                )
            if importlib.util.find_spec("wandb") is None:
                raise ConfigError(
                    f"logging.wandb.mode={self.mode} needs the wandb package, which is not "
                    "installed: pip install wandb (or pip install -e '.[wandb]'), or set "
                    "logging.wandb.mode=disabled"
                )

    def __init__(
        self,
        cfg: WandbBackend.Config,
        run_dir: Path,
        *,
        name: str,
        job: str,
        run_config: Mapping[str, object] | None = None,
    ) -> None:
        cfg.validate()
        import wandb

        run_dir.mkdir(parents=True, exist_ok=True)
        try:
            self._run = wandb.init(
                project=cfg.project,
                entity=cfg.entity or None,
                mode=cfg.mode,  # type: ignore[arg-type]
                dir=str(run_dir),
                name=cfg.name or (name if job == "rl" else f"{name}-{job}"),
                group=cfg.group or name,
                job_type=job,
                tags=cfg.tags or None,
                config=dict(run_config) if run_config is not None else None,
                reinit="create_new",
                settings=wandb.Settings(console="off"),  # metrics only; leave stdout alone
            )
        except wandb.errors.Error as e:
            raise ConfigError(
                f"W&B could not start a run ({type(e).__name__}: {e}); log in with `wandb login` "
                "or WANDB_API_KEY, or use logging.wandb.mode=offline and `wandb sync` later"
            ) from e

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self._run.log({k: float(v) for k, v in metrics.items()}, step=step)

    def close(self) -> None:
        self._run.finish()


class ConsoleBackend:
    """A rich table per step: one row per area, its metrics side by side."""

    def __init__(self) -> None:
        from rich.console import Console

        self._console = Console(stderr=True)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        from rich.table import Table

        table = Table(title=f"step {step}", show_header=True, header_style="bold", expand=False)
        table.add_column("area", style="cyan", no_wrap=True)
        table.add_column("metrics")
        by_area: dict[str, list[str]] = {}
        for k in sorted(metrics):
            area, _, name = k.partition("/")
            by_area.setdefault(area, []).append(f"{name}={_fmt(metrics[k])}")
        for area, items in by_area.items():
            table.add_row(area, "  ".join(items))
        self._console.print(table)

    def close(self) -> None:
        pass


def _fmt(v: float) -> str:
    v = float(v)
    if v == 0 or (1e-3 <= abs(v) < 1e5):
        return f"{v:.4g}"
    return f"{v:.3e}"


class MetricsLogger:
    """Send each step's metrics to the enabled backends. Only rank 0 writes anything.

    ``name`` (default: the run directory's name), ``job`` (``rl``, ``sft``) and ``run_config``
    label the run for backends that keep runs apart (W&B: run name, group, job type, config).
    """

    @dataclass(kw_only=True)
    class Config:
        console: bool = True
        """Print a rich table per step (stderr)."""
        jsonl: bool = True
        """Append to <run_dir>/metrics.jsonl."""
        tensorboard: bool = False
        """Write TensorBoard scalars to <run_dir>/tb."""
        wandb: WandbBackend.Config = field(default_factory=lambda: WandbBackend.Config())
        """Weights & Biases (off by default): ``logging.wandb.mode=offline`` or ``online``."""

        def validate(self) -> None:
            self.wandb.validate()

    def __init__(
        self,
        cfg: MetricsLogger.Config,
        run_dir: str | Path,
        *,
        rank: int = 0,
        name: str | None = None,
        job: str = "rl",
        run_config: Mapping[str, object] | None = None,
    ) -> None:
        cfg.validate()
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.backends: list[Backend] = []
        if rank != 0:
            return
        if cfg.jsonl:
            self.backends.append(JsonlBackend(self.run_dir / "metrics.jsonl"))
        if cfg.tensorboard:
            self.backends.append(TensorBoardBackend(self.run_dir / "tb"))
        if cfg.wandb.enabled:
            name = name or self.run_dir.name
            wandb = WandbBackend(cfg.wandb, self.run_dir, name=name, job=job, run_config=run_config)
            self.backends.append(wandb)
        if cfg.console:
            self.backends.append(ConsoleBackend())

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        for k in metrics:
            check_key(k)
        for b in self.backends:
            b.log(metrics, step)

    def close(self) -> None:
        for b in self.backends:
            b.close()
        self.backends = []

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Read a metrics.jsonl back as one dict per step, in step order.

    Rows of the same step are merged, later values winning: a step logged again by a resumed
    run replaces the old values, and extra rows (e.g. a final eval) add their keys.
    """
    rows: dict[int, dict[str, Any]] = {}
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            rows.setdefault(int(row["step"]), {}).update(row)
    return [rows[k] for k in sorted(rows)]


@contextmanager
def progress(
    description: str, total: int | None, *, enabled: bool = True, every: int | None = None
) -> Iterator[Any]:
    """A progress bar; yields a callable ``advance(n=1)``. A no-op when disabled.

    On a terminal it is a rich bar; otherwise a log line every ``every`` steps (default: a
    tenth of ``total``), e.g. ``SFT warm-up: 40/200 (20%), 1m20s elapsed, ETA 5m20s``.
    """
    if not enabled:
        yield lambda n=1: None
        return
    if not sys.stderr.isatty():
        yield LogProgress(description, total, every=every)
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        transient=True,
    ) as bar:
        task = bar.add_task(description, total=total)
        yield lambda n=1: bar.advance(task, n)


class LogProgress:
    """``progress()`` for logs: a line every ``every`` steps (and at the end) with an ETA."""

    def __init__(self, description: str, total: int | None, *, every: int | None = None) -> None:
        self.description = description
        self.total = total
        self.every = every or (max(1, math.ceil(total / 10)) if total else 10)
        self.done = 0
        self._t0 = time.monotonic()

    def __call__(self, n: int = 1) -> None:
        before, self.done = self.done, self.done + n
        if self.done // self.every > before // self.every or self.done == self.total:
            logger.info("%s", self.line())

    def line(self) -> str:
        elapsed = time.monotonic() - self._t0
        if not self.total:
            return f"{self.description}: {self.done} done, {_duration(elapsed)} elapsed"
        eta = elapsed / self.done * (self.total - self.done) if self.done else math.inf
        return (
            f"{self.description}: {self.done}/{self.total} ({100 * self.done // self.total}%), "
            f"{_duration(elapsed)} elapsed, ETA {_duration(eta)}"
        )


def _duration(s: float) -> str:
    if not math.isfinite(s):
        return "?"
    s = round(s)
    h, rest = divmod(s, 3600)
    return f"{h}h{rest // 60:02d}m" if h else f"{rest // 60}m{rest % 60:02d}s"
