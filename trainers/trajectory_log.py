"""Write a sample of each RL step's trajectories for `agentrl view`, under a disk cap.

    Trainer.step -> groups + scored TrainBatch (old_logprobs, advantages)
        -> TrajectoryLog.write(step, groups, batch) -> <run_dir>/trajectories/step_000042.jsonl

Each line is ``Trajectory.to_dict()`` (so ``load_trajectories`` reads the files back) plus
what only the trainer knows:

    step              the RL step
    group_index       the group's index in the step (its members share it)
    advantages        per segment: the mean advantage over its loss tokens (None: no loss tokens)
    trainer_logprobs  per segment, per token: the trainer's recomputed logprob of the token
                      (0.0 where there is none), beside the ledger's rollout ``logprobs``
    token_advantages  only with a token-level estimator (gae): per segment, per token (0.0
                      off the loss mask); sequence-level ones (grpo, rloo, ...) leave it out

Whole groups are kept (the first ``ceil(per_step / group_size)`` of the step), so the viewer
can show a group side by side. A step file is written to a temporary name and renamed, so a
viewer following a live run never reads half a file. Past ``max_total_mb`` the oldest step
files are deleted (like ``checkpoint.keep_last``); the newest step is always kept.

Screenshots (a GUI env's inline ``data:image/...`` URLs, in message image parts and in
``report["screenshots"]``) have a cap of their own, ``max_image_mb`` per step file, so a run
that keeps images does not push every earlier step out of ``max_total_mb``. Each trajectory's
last image (where the agent ended) is kept first, then the earlier ones in order; an image past
the cap becomes a text marker naming the setting, and the line's ``images_dropped`` counts
them.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.batch import TrainBatch
from agentrl.errors import ConfigError
from agentrl.types import TrajectoryGroup

logger = logging.getLogger(__name__)

DIR_NAME = "trajectories"
"""The folder under the run directory that holds the step files."""


class TrajectoryLog:
    """Writes ``trajectories.per_step`` trajectories of every step to ``<run_dir>/trajectories``."""

    @dataclass(kw_only=True)
    class Config:
        per_step: int = 16
        """Trajectories written per RL step (rounded up to whole groups; 0: none)."""
        max_total_mb: float = 256.0
        """Disk cap of the folder; past it the oldest step files are deleted."""
        max_image_mb: float = 16.0
        """Inline images (screenshots) kept per step file; past it they become text markers
        (0: keep none)."""

        def validate(self) -> None:
            if self.per_step < 0:
                raise ConfigError(
                    f"trajectories.per_step must be >= 0 (0 writes none), got {self.per_step}"
                )
            if not self.max_total_mb > 0:
                raise ConfigError(
                    f"trajectories.max_total_mb must be > 0, got {self.max_total_mb}; "
                    "try 256, or trajectories.per_step=0 to write none"
                )
            if not self.max_image_mb >= 0:
                raise ConfigError(
                    f"trajectories.max_image_mb must be >= 0 (0 keeps no screenshots), "
                    f"got {self.max_image_mb}; try 16"
                )

    def __init__(self, cfg: TrajectoryLog.Config, run_dir: str | Path) -> None:
        self.cfg = cfg
        self.dir = Path(run_dir) / DIR_NAME

    def write(self, step: int, groups: list[TrajectoryGroup], batch: TrainBatch) -> Path | None:
        """Write step ``step``'s sample; returns the file (None when nothing was written)."""
        if self.cfg.per_step <= 0 or not groups:
            return None
        size = max(1, len(groups[0].trajectories))
        keep = groups[: math.ceil(self.cfg.per_step / size)]
        rows = _rows_by_segment(batch)
        dicts = []
        for gi, g in enumerate(keep):
            for t in g.trajectories:
                d = t.to_dict()
                segs, row = [], 0  # batch rows count non-empty segments only
                for seg in t.segments:
                    r = rows.get((t.id, row)) if len(seg) else None
                    row += int(len(seg) > 0)
                    segs.append(r or _Row(None, [0.0] * len(seg), None))
                d |= {
                    "step": step,
                    "group_index": gi,
                    "advantages": [r.advantage for r in segs],
                    "trainer_logprobs": [r.logprobs for r in segs],
                }
                if any(r.token_advantages is not None for r in segs):
                    d["token_advantages"] = [r.token_advantages for r in segs]
                dicts.append(d)
        for d in dicts:
            _segment_image_counts(d)
        dropped = _cap_images(dicts, self.cfg.max_image_mb * 1e6)
        if dropped:
            logger.info(
                "step %d: %d screenshot(s) written as markers (trajectories.max_image_mb=%g)",
                step,
                dropped,
                self.cfg.max_image_mb,
            )
        lines = [json.dumps(d) + "\n" for d in dicts]
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / f"step_{step:06d}.jsonl"
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(lines))
        tmp.replace(path)
        self._enforce_cap(path)
        return path

    def _enforce_cap(self, newest: Path) -> None:
        cap = self.cfg.max_total_mb * 1e6
        files = sorted(self.dir.glob("step_*.jsonl"))
        total = sum(f.stat().st_size for f in files)
        for f in files:
            if total <= cap or f == newest:
                break
            total -= f.stat().st_size
            f.unlink()
            logger.debug("trajectories.max_total_mb: removed %s", f)


def _segment_image_counts(d: dict[str, Any]) -> None:
    """A segment's images (a vision model's prompt) are the messages' images again: the line
    keeps only their count (``num_images``), so the image cap below bounds them too."""
    segs = d.get("segments")
    if isinstance(segs, list):
        d["segments"] = [
            {k: v for k, v in s.items() if k != "images"} | {"num_images": len(s["images"])}
            if isinstance(s, dict) and s.get("images")
            else s
            for s in segs
        ]


def _image_slots(d: dict[str, Any]) -> list[tuple[list[Any], int, bool]]:
    """Where a trajectory line holds inline images, in conversation order: (the list, the
    index in it, whether it is a message part) for every ``data:image/`` URL."""
    found: list[tuple[list[Any], int, bool]] = []
    # The lists are copied into the line first: they are the live trajectory's own.
    for m in d.get("messages") or []:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list):
            content = m["content"] = list(content)
            for i, part in enumerate(content):
                if isinstance(part, dict) and part.get("type") == "image_url":
                    url = (part.get("image_url") or {}).get("url")
                    if isinstance(url, str) and url.startswith("data:image/"):
                        found.append((content, i, True))
    report = d.get("report")
    shots = report.get("screenshots") if isinstance(report, dict) else None
    if isinstance(shots, list):
        shots = list(shots)
        d["report"] = {**report, "screenshots": shots}  # type: ignore[dict-item]
        found += [
            (shots, i, False)
            for i, s in enumerate(shots)
            if isinstance(s, str) and s.startswith("data:image/")
        ]
    return found


def _cap_images(dicts: list[dict[str, Any]], cap_bytes: float) -> int:
    """Replace the inline images past ``cap_bytes`` (for the whole step) with text markers:
    each trajectory's last image first, then the rest in order. Returns how many were
    replaced; each line with any gets ``images_dropped``."""
    slots = [_image_slots(d) for d in dicts]
    order = [(t, len(s) - 1) for t, s in enumerate(slots) if s]
    order += [(t, i) for t, s in enumerate(slots) for i in range(len(s) - 1)]
    used, dropped = 0.0, [0] * len(dicts)
    for t, i in order:
        holder, k, is_part = slots[t][i]
        url = holder[k]["image_url"]["url"] if is_part else holder[k]
        if used + len(url) <= cap_bytes:
            used += len(url)
            continue
        marker = (
            f"[screenshot not kept: trajectories.max_image_mb reached in this step "
            f"({len(url) * 3 // 4 // 1024} KB)]"
        )
        holder[k] = {"type": "text", "text": marker} if is_part else marker
        dropped[t] += 1
    for d, n in zip(dicts, dropped, strict=True):
        if n:
            d["images_dropped"] = n
    return sum(dropped)


@dataclass(frozen=True, slots=True)
class _Row:
    """What the trainer knows of one segment."""

    advantage: float | None  # mean over loss tokens; None: no loss tokens (masked row)
    logprobs: list[float]  # [T] trainer logprobs
    token_advantages: list[float] | None  # [T], token-level estimators only


def _rows_by_segment(batch: TrainBatch) -> dict[tuple[str, int], _Row]:
    """(trajectory id, non-empty segment index) -> the trainer's view of that batch row."""
    out: dict[tuple[str, int], _Row] = {}
    if "old_logprobs" not in batch:
        return out
    mask = batch["loss_mask"].float()  # (B, T)
    lp = batch["old_logprobs"].float()  # (B, T)
    adv = batch["advantages"].float() if "advantages" in batch else None  # (B, T) or (B, 1)
    per_token = adv is not None and adv.shape[1] > 1
    lengths = batch["seq_lens"].tolist()  # (B,)
    for b, row in enumerate(batch.rows):
        n = int(lengths[b])
        a: float | None = None
        token_adv: list[float] | None = None
        if adv is not None:
            a_b = adv[b].expand_as(mask[b]) if adv.shape[1] == 1 else adv[b]  # (T,)
            if mask[b].sum() > 0:
                a = round(float((a_b * mask[b]).sum() / mask[b].sum()), 6)
            if per_token:
                token_adv = [round(x, 5) for x in (a_b * mask[b])[:n].tolist()]
        logprobs = [round(x, 5) for x in lp[b, :n].tolist()]
        out[(row.trajectory_id, row.segment_index)] = _Row(a, logprobs, token_adv)
    return out
