"""Checkpoints that resume a run exactly: engine state, step, data cursor, RNG, weight version.

    ckpt = CheckpointManager(cfg.checkpoint, run_dir)
    tmp = ckpt.begin(step)                      # workers save their engines under tmp/<role>/
    actor.save(str(tmp / "actor"))
    ckpt.commit(tmp, TrainerState(step=step, weight_version=v, data_cursor=c, rng=capture_rng()))
    path = ckpt.latest()                        # --resume: the newest complete checkpoint
    state = start_or_resume(ckpt, run_dir, config_yaml, resume=True)   # the driver's setup

Layout of one checkpoint::

    <dir>/step_000004/
        trainer_state.json   step, weight version, data cursor, extras (human-readable)
        rng.pt               python / numpy / torch RNG states of the driver
        actor/ critic/ ...   each role's engine state (model, optimizer, LR scheduler, its RNG)

A checkpoint is written to ``step_000004.tmp`` and renamed when complete, so a run killed
mid-save never leaves a half checkpoint that ``latest()`` would pick. Only the last
``keep_last`` checkpoints are kept.
"""

from __future__ import annotations

import json
import logging
import random
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agentrl.errors import ConfigError

logger = logging.getLogger(__name__)

_PREFIX = "step_"
_STATE = "trainer_state.json"
_RNG = "rng.pt"


@dataclass(kw_only=True)
class TrainerState:
    """What the driver needs, besides the engines, to continue a run where it stopped."""

    step: int
    """Number of completed RL steps."""
    weight_version: int
    """Version of the weights the inference servers hold after this step."""
    data_cursor: int
    """Index of the next dataset sample to draw."""
    rng: dict[str, Any] = field(default_factory=dict)
    """Driver RNG states (see capture_rng); stored in rng.pt, not in the JSON."""
    extra: dict[str, Any] = field(default_factory=dict)
    """JSON-able extras (e.g. whether SFT warm-up ran, the best reward so far)."""


def capture_rng() -> dict[str, Any]:
    """The current python, numpy and torch RNG states of this process."""
    import numpy as np
    import torch

    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Restore states returned by capture_rng (keys that are missing are left alone)."""
    import numpy as np
    import torch

    if "python" in state:
        random.setstate(state["python"])
    if "numpy" in state:
        np.random.set_state(state["numpy"])
    if "torch" in state:
        torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class CheckpointManager:
    """Create, find, load and prune the checkpoints of one run."""

    @dataclass(kw_only=True)
    class Config:
        dir: str = "checkpoints"
        """Where checkpoints go; relative paths are under the run directory."""
        every: int = 0
        """Save after every N RL steps (0: only at the end)."""
        keep_last: int = 2
        """Keep the newest K checkpoints; older ones are deleted."""
        save_final: bool = True
        """Save a checkpoint after the last step."""
        export_hf: bool = True
        """Export the final policy as a Hugging Face directory (<run_dir>/hf)."""

    def __init__(self, cfg: CheckpointManager.Config, run_dir: str | Path) -> None:
        if cfg.keep_last < 1:
            raise ConfigError(f"checkpoint.keep_last must be >= 1, got {cfg.keep_last}")
        if cfg.every < 0:
            raise ConfigError(
                f"checkpoint.every must be >= 0 (0 = only at the end), got {cfg.every}"
            )
        self.cfg = cfg
        root = Path(cfg.dir)
        self.root = root if root.is_absolute() else Path(run_dir) / root

    def should_save(self, step: int, last_step: int) -> bool:
        """Whether to checkpoint after completing ``step`` (1-based) of ``last_step``."""
        if step == last_step and self.cfg.save_final:
            return True
        return self.cfg.every > 0 and step % self.cfg.every == 0

    def path_for(self, step: int) -> Path:
        return self.root / f"{_PREFIX}{step:06d}"

    def begin(self, step: int) -> Path:
        """A fresh temporary directory for checkpoint ``step``; engines save into it."""
        tmp = self.path_for(step).with_suffix(".tmp")
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        return tmp

    def commit(self, tmp: Path, state: TrainerState) -> Path:
        """Write the trainer state into ``tmp``, make it the checkpoint, prune old ones."""
        import torch

        torch.save(state.rng, tmp / _RNG)
        meta = asdict(state)
        meta.pop("rng")
        (tmp / _STATE).write_text(json.dumps(meta, indent=2, sort_keys=True))
        final = self.path_for(state.step)
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
        logger.info("saved checkpoint %s", final)
        self.prune()
        return final

    def list(self) -> list[Path]:
        """Complete checkpoints, oldest first."""
        if not self.root.is_dir():
            return []
        done = [
            p for p in self.root.iterdir() if _step_of(p) is not None and (p / _STATE).is_file()
        ]
        return sorted(done, key=lambda p: _step_of(p) or 0)

    def latest(self) -> Path | None:
        ckpts = self.list()
        return ckpts[-1] if ckpts else None

    def prune(self) -> None:
        for old in self.list()[: -self.cfg.keep_last]:
            shutil.rmtree(old, ignore_errors=True)
        if self.root.is_dir():  # leftovers of a save that was interrupted
            for tmp in self.root.glob(f"{_PREFIX}*.tmp"):
                shutil.rmtree(tmp, ignore_errors=True)


def load_state(path: str | Path) -> TrainerState:
    """Read the trainer state of a checkpoint directory."""
    import torch

    path = Path(path)
    if not (path / _STATE).is_file():
        raise ConfigError(f"{str(path)!r} is not a checkpoint: {_STATE} is missing")
    meta = json.loads((path / _STATE).read_text())
    rng = torch.load(path / _RNG, weights_only=False) if (path / _RNG).is_file() else {}
    return TrainerState(rng=rng, **meta)


def _step_of(p: Path) -> int | None:
    name = p.name
    if not p.is_dir() or not name.startswith(_PREFIX) or not name[len(_PREFIX) :].isdigit():
        return None
    return int(name[len(_PREFIX) :])


def start_or_resume(
    ckpt: CheckpointManager, run_dir: Path, config_yaml: str, *, resume: bool
) -> TrainerState | None:
    """The state a run starts from: the latest checkpoint with ``resume`` (None when there is
    none: a fresh run), else None after creating ``run_dir`` with its ``config.yaml``. A fresh
    run refuses a directory that already holds a run rather than overwrite it."""
    latest = ckpt.latest()
    if resume:
        if latest is None:
            logger.warning("--resume: no checkpoint under %s; starting a fresh run", ckpt.root)
            return None
        logger.info("resuming from %s", latest)
        return load_state(latest)
    if latest is not None or (run_dir / "metrics.jsonl").exists():
        raise ConfigError(
            f"run directory {str(run_dir)!r} already holds a run; pass --resume to continue it, "
            f"or choose another name (name=...) or output_dir"
        )
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(config_yaml)
    return None
