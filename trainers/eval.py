"""Evaluate a policy on held-out env samples, and write a run's report (summary + reward curve).

    eval samples (DataConfig.sample(i, eval=True)) -> SeededCollector (group_size 1)
        -> rollout metrics renamed eval/... (reward_mean, success_rate, ...)
    metrics.jsonl -> reward_curve.png (matplotlib) + summary.json + a before/after table

``evaluate_model`` serves an HF directory (a checkpoint's export or any model) with the
embedded server and runs the same collector the trainer uses, so eval numbers and training
rollouts are comparable.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

from agentrl.chat import ChatTemplate
from agentrl.errors import ConfigError
from agentrl.logging import read_jsonl
from agentrl.rollout.collector import RolloutCollector
from agentrl.types import Trajectory
from trainers.config import RunConfig
from trainers.serving import Fleet

logger = logging.getLogger(__name__)

_SHOWN = ("reward_mean", "success_rate", "response_len_mean", "turns_mean", "tool_error_rate")
_STATS = ("n", "num_tasks", "success_se", "reward_se")


def eval_metrics(
    fleet: Fleet,
    cfg: RunConfig,
    template: ChatTemplate,
    *,
    k: int = 1,
    keep: list[Trajectory] | None = None,
) -> dict[str, float]:
    """``eval.num_samples`` eval-split tasks, ``k`` rollouts each -> ``eval/...`` metrics.

    Besides the rollout metrics: ``eval/n`` (trajectories), ``eval/success_se`` and
    ``eval/reward_se`` (standard errors of the means), ``eval/num_tasks`` (distinct tasks) and,
    with ``k > 1``, ``eval/pass@1`` and ``eval/pass@k`` (the unbiased estimator over each
    task's ``k`` samples). ``keep`` receives the trajectories.
    """
    if k < 1:
        raise ConfigError(f"--k must be >= 1 (samples per eval task), got {k}")
    ecfg = replace(cfg.rollout, group_size=k, temperature=cfg.eval.temperature)
    collector = fleet.collector(ecfg, template, rubric=cfg.reward.build_rubric())  # as trained
    samples = [cfg.data.sample(i, eval=True) for i in range(cfg.eval.num_samples)]
    groups = fleet.collect(collector, samples)
    trajs = [t for g in groups for t in g.trajectories]
    m = RolloutCollector.metrics(groups)
    out = {"eval/" + k.partition("/")[2]: v for k, v in m.items()}
    successes = [success(t) for t in trajs]
    out["eval/n"] = float(len(trajs))
    out["eval/success_se"] = standard_error(successes)
    out["eval/reward_se"] = standard_error([t.reward for t in trajs])
    out["eval/num_tasks"] = float(len({task_id(t) for t in trajs}))
    if k > 1:
        per_group = [[success(t) for t in g.trajectories] for g in groups]
        for kk in sorted({1, k}):
            vals = [pass_at_k(len(g), int(sum(g)), kk) for g in per_group if len(g) >= kk]
            out[f"eval/pass@{kk}"] = sum(vals) / len(vals) if vals else float("nan")
    if keep is not None:
        keep.extend(trajs)
    return out


def logged_eval(metrics_path: Path, step: int) -> dict[str, float] | None:
    """The ``eval/*`` metrics logged at ``step`` in a run's metrics.jsonl, None if none were."""
    if metrics_path.exists():
        for row in read_jsonl(metrics_path):
            if row["step"] == step and "eval/reward_mean" in row:
                return {k: v for k, v in row.items() if k.startswith("eval/")}
    return None


def success(t: Trajectory) -> float:
    return float(t.metrics.get("success", float(t.reward > 0)))


def task_id(t: Trajectory) -> str:
    """What names a trajectory's task: the grader's ``instance_id``, else its first user turn."""
    iid = t.report.get("instance_id")
    if iid:
        return str(iid)
    first = next((m for m in t.messages if m.role == "user"), t.messages[0] if t.messages else None)
    return first.text if first is not None else t.sample.uid


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples of which ``c`` passed: 1 - C(n-c, k) / C(n, k)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def per_instance(trajs: list[Trajectory], k: int) -> list[dict[str, Any]]:
    """One row per task: samples, passes, pass@1 and pass@k, mean reward, statuses."""
    by: dict[str, list[Trajectory]] = {}
    for t in trajs:
        by.setdefault(task_id(t), []).append(t)
    rows = []
    for tid, ts in by.items():
        c = int(sum(success(t) for t in ts))
        row: dict[str, Any] = {
            "task": tid if len(tid) <= 80 else tid[:77] + "...",
            "n": len(ts),
            "passed": c,
            "pass@1": c / len(ts),
            "reward_mean": sum(t.reward for t in ts) / len(ts),
            "statuses": sorted({t.status.value for t in ts}),
        }
        if k > 1 and len(ts) >= k:
            row[f"pass@{k}"] = pass_at_k(len(ts), c, k)
        rows.append(row)
    return rows


def swe_bench_predictions(trajs: list[Trajectory], model_name: str) -> list[dict[str, str]]:
    """SWE-bench's prediction rows (instance_id, model_name_or_path, model_patch): the first
    sample of each instance whose grader reported a patch."""
    seen: dict[str, dict[str, str]] = {}
    for t in trajs:
        iid, patch = t.report.get("instance_id"), t.report.get("model_patch")
        if iid and isinstance(patch, str) and iid not in seen:
            seen[iid] = {"instance_id": iid, "model_name_or_path": model_name, "model_patch": patch}
    return list(seen.values())


def standard_error(xs: list[float]) -> float:
    """Standard error of the mean of ``xs`` (sample standard deviation / sqrt(n)); 0 for n < 2."""
    n = len(xs)
    if n < 2:
        return 0.0
    mean = sum(xs) / n
    return math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1) / n)


def mean_and_se(xs: list[float]) -> tuple[float, float]:
    """Mean and standard error over independent runs (seeds)."""
    return (sum(xs) / len(xs) if xs else float("nan")), standard_error(xs)


def evaluate_model(
    cfg: RunConfig,
    model: str | Path,
    *,
    log_dir: Path,
    servers: list[str] | None = None,
    k: int = 1,
    keep: list[Trajectory] | None = None,
) -> dict[str, float]:
    """Serve ``model`` (an HF directory) on loopback, or use running ``servers`` that serve it
    (``model`` then gives the chat template), and evaluate it on ``cfg``'s eval samples."""
    fleet = Fleet.for_run(cfg, log_dir)
    try:
        if servers:
            fleet.attach(servers)
        else:
            fleet.start(model)
        return eval_metrics(fleet, cfg, ChatTemplate.from_pretrained(model), k=k, keep=keep)
    finally:
        fleet.close()


def write_report(
    run_dir: Path,
    *,
    before: dict[str, float],
    after: dict[str, float],
    wall_s: float,
    steps: int,
    hf_dir: Path | None,
    seed: int | None = None,
    command: str | None = None,
    eval_fraction: float | None = None,
) -> dict[str, Any]:
    """summary.json + reward_curve.png under ``run_dir``; prints the before/after table.

    The summary records how to reproduce it (``command``, ``seed``) and, with each eval, its
    size (``n`` trajectories over ``num_tasks`` distinct eval-split tasks) and standard errors.
    """
    rows = read_jsonl(run_dir / "metrics.jsonl") if (run_dir / "metrics.jsonl").exists() else []
    train = [r for r in rows if r.get("rollout/reward_mean") is not None]
    summary: dict[str, Any] = {
        "run_dir": str(run_dir),
        "command": command,
        "seed": seed,
        "steps": steps,
        "wall_time_s": wall_s,
        "hf_dir": str(hf_dir) if hf_dir else None,
        "eval_split": (
            {"fraction": eval_fraction, "disjoint_from_train_by": "task content"}
            if eval_fraction is not None
            else None
        ),
        "eval_before": _eval_entry(before),
        "eval_after": _eval_entry(after),
        "train_reward_first": train[0]["rollout/reward_mean"] if train else None,
        "train_reward_last": train[-1]["rollout/reward_mean"] if train else None,
    }
    if train:
        summary["reward_curve"] = str(
            plot_rewards(train, run_dir / "reward_curve.png", before, after)
        )
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    _print_summary(summary)
    return summary


def summarize_seeds(runs: list[dict[str, Any]], out_dir: Path, *, command: str) -> dict[str, Any]:
    """Mean and standard error over seeds of the runs' before/after evals -> ``summary.json``.

    Each run contributes one number per metric (its eval mean), so the standard error is over
    seeds (independent training runs), the honest spread of a learning claim.
    """
    summary: dict[str, Any] = {"command": command, "seeds": [r.get("seed") for r in runs]}
    for when in ("eval_before", "eval_after"):
        evals = [r[when] for r in runs if r.get(when)]
        if len(evals) != len(runs):
            summary[when] = None
            continue
        summary[when] = {
            k: dict(zip(("mean", "se"), mean_and_se([float(e[k]) for e in evals]), strict=True))
            for k in ("success_rate", "reward_mean")
        } | {"n_per_seed": evals[0].get("n"), "num_tasks_per_seed": evals[0].get("num_tasks")}
    summary["runs"] = [
        {
            k: r.get(k)
            for k in ("run_dir", "seed", "steps", "wall_time_s", "eval_before", "eval_after")
        }
        for r in runs
    ]
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    b, a = summary["eval_before"], summary["eval_after"]
    if b and a:
        logger.info(
            "%d seeds: eval success %.1f%% +/- %.1f -> %.1f%% +/- %.1f (mean +/- standard error)",
            len(runs),
            100 * b["success_rate"]["mean"],
            100 * b["success_rate"]["se"],
            100 * a["success_rate"]["mean"],
            100 * a["success_rate"]["se"],
        )
    return summary


def _eval_entry(m: dict[str, float]) -> dict[str, float | None] | None:
    return {k: m.get(f"eval/{k}") for k in (*_SHOWN, *_STATS)} if m else None


def plot_rewards(
    rows: list[dict[str, Any]], path: Path, before: dict[str, float], after: dict[str, float]
) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in rows]
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=120)
    ax.plot(
        steps, [r["rollout/reward_mean"] for r in rows], marker=".", alpha=0.4, label="train reward"
    )
    rewards = [float(r["rollout/reward_mean"]) for r in rows]
    window = max(1, len(rows) // 10)
    smooth = [
        sum(rewards[max(0, i - window + 1) : i + 1]) / len(rewards[max(0, i - window + 1) : i + 1])
        for i in range(len(rewards))
    ]
    ax.plot(steps, smooth, linewidth=2.5, label=f"train reward ({window}-step mean)")
    if before and after:
        ax.scatter(
            [0, steps[-1]],
            [before["eval/reward_mean"], after["eval/reward_mean"]],
            color="black",
            zorder=3,
            label="held-out eval reward",
        )
    ax.set_xlabel("RL step")
    ax.set_ylabel("reward")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _print_summary(summary: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{summary['steps']} RL steps in {summary['wall_time_s']:.0f} s")
    table.add_column("metric")
    table.add_column("before RL", justify="right")
    table.add_column("after RL", justify="right")
    b, a = summary["eval_before"] or {}, summary["eval_after"] or {}
    for k in _SHOWN:
        table.add_row(f"eval/{k}", _fmt(b.get(k)), _fmt(a.get(k)))
    table.add_row(
        "eval success standard error", _fmt(b.get("success_se")), _fmt(a.get("success_se"))
    )
    table.add_row("eval trajectories (distinct tasks)", _count(b), _count(a))
    table.add_row(
        "train reward (first/last step)",
        _fmt(summary["train_reward_first"]),
        _fmt(summary["train_reward_last"]),
    )
    Console(stderr=True).print(table)


def _count(m: dict[str, Any]) -> str:
    if m.get("n") is None:
        return "-"
    return f"{m['n']:.0f} ({m.get('num_tasks') or 0:.0f})"


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"
