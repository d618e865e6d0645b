"""Index trajectory JSONL files by byte offset, filter and page them, follow them as they grow.

    run dir / .jsonl -> Source (files) -> TrajectoryIndex.refresh() -> Entry per line
        -> query(filters, offset, limit) -> summaries      get(id) -> seek + one json.loads

A file is read once, line by line, keeping only a small ``Entry`` (id, step, group, env,
status, reward, lengths, file and byte offset) per trajectory; the full record is read back
from its offset when it is asked for, so a file of any size is never held in memory.
``refresh`` reads only the bytes appended since the last look (complete lines only), picks up
new step files of a running run, and forgets files that were deleted (the training disk cap)
or replaced (a resumed run rewrites a step's file under the same name).

A run directory holds ``trajectories/step_*.jsonl`` (written by training, see
``trainers/trajectory_log.py``) and ``metrics.jsonl``; a JSONL path is read as one file of
``Trajectory.to_dict()`` lines (``agentrl rollout`` and ``agentrl eval --out`` write those).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agentrl.errors import ConfigError

TRAJECTORY_DIR = "trajectories"
"""Where a run directory keeps its step files (the name trainers/trajectory_log.py writes)."""


@dataclass(frozen=True, slots=True)
class Entry:
    """What the list view shows of one trajectory, and where its full record lives."""

    id: str
    run: str
    step: int | None
    group: str  # "<run>:<step>:<group_index>" for a run's files, else the sample uid
    env: str
    status: str
    reward: float
    length: int  # generated tokens (loss mask 1)
    tokens: int  # all ledger tokens
    turns: int
    advantage: float | None
    agent: str | None
    file: int  # index into TrajectoryIndex.files
    offset: int
    nbytes: int
    member: int = -1  # a group line's member index (-1: the line is one trajectory)

    def summary(self) -> dict[str, Any]:
        d = asdict(self)
        del d["file"], d["offset"], d["nbytes"], d["member"]
        return d


@dataclass(slots=True)
class _File:
    path: Path
    run: str
    inode: int = -1
    indexed: int = 0  # bytes indexed so far (always at a line boundary)
    entries: list[Entry] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Filters:
    """List filters; None means no filter. ``step`` is ``"3"`` or a range ``"2-5"``."""

    run: str | None = None
    step: str | None = None
    env: str | None = None
    status: str | None = None  # one status, or several separated by commas
    group: str | None = None
    reward_min: float | None = None
    reward_max: float | None = None
    length_min: int | None = None
    length_max: int | None = None

    def steps(self) -> tuple[int, int] | None:
        if not self.step:
            return None
        lo, _, hi = self.step.partition("-")
        try:
            return int(lo), int(hi or lo)
        except ValueError:
            raise ConfigError(f"step filter must be N or A-B, got {self.step!r}") from None

    def match(self, e: Entry) -> bool:
        rng = self.steps()
        return not (
            (self.run is not None and e.run != self.run)
            or (rng is not None and (e.step is None or not rng[0] <= e.step <= rng[1]))
            or (self.env and self.env not in e.env)
            or (self.status and e.status not in self.status.split(","))
            or (self.group and e.group != self.group)
            or (self.reward_min is not None and e.reward < self.reward_min)
            or (self.reward_max is not None and e.reward > self.reward_max)
            or (self.length_min is not None and e.length < self.length_min)
            or (self.length_max is not None and e.length > self.length_max)
        )


class Source:
    """One thing given on the command line: a run directory or a trajectories JSONL file."""

    def __init__(self, path: str | Path, label: str | None = None) -> None:
        self.path = Path(path)
        if not self.path.exists():
            raise ConfigError(
                f"{str(self.path)!r} does not exist; pass a run directory or a .jsonl"
            )
        if self.path.is_file() and self.path.suffix != ".jsonl":
            raise ConfigError(f"{str(self.path)!r} is not a .jsonl file or a run directory")
        self.label = label or (self.path.name if self.path.is_dir() else self.path.stem)

    @property
    def is_run(self) -> bool:
        return self.path.is_dir()

    def files(self) -> list[Path]:
        if not self.is_run:
            return [self.path]
        return sorted((self.path / TRAJECTORY_DIR).glob("step_*.jsonl"))

    @property
    def metrics_path(self) -> Path | None:
        p = self.path / "metrics.jsonl"
        return p if self.is_run and p.is_file() else None


class TrajectoryIndex:
    """Entries of every trajectory in the sources, kept up to date by ``refresh``."""

    def __init__(self, sources: Iterable[Source], min_refresh_s: float = 1.0) -> None:
        self.sources = list(sources)
        labels = [s.label for s in self.sources]
        if len(set(labels)) != len(labels):  # two runs named alike: tell them apart
            for i, s in enumerate(self.sources):
                s.label = f"{s.label}#{i + 1}"
        self.files: list[_File] = []
        self._by_path: dict[Path, int] = {}
        self._lock = threading.Lock()
        self._min_refresh_s = min_refresh_s
        self._last = 0.0
        self.refresh(force=True)

    # --- indexing ---------------------------------------------------------------------------
    def refresh(self, *, force: bool = False) -> None:
        """Index appended bytes and new files; drop deleted or replaced ones."""
        now = time.monotonic()
        if not force and now - self._last < self._min_refresh_s:
            return
        with self._lock:
            self._last = now
            for src in self.sources:
                for p in src.files():
                    if p not in self._by_path:
                        self._by_path[p] = len(self.files)
                        self.files.append(_File(path=p, run=src.label))
            for i, f in enumerate(self.files):
                self._scan(i, f)

    def _scan(self, i: int, f: _File) -> None:
        try:
            st = f.path.stat()
        except FileNotFoundError:
            f.entries, f.indexed, f.inode = [], 0, -1
            return
        if st.st_ino != f.inode or st.st_size < f.indexed:  # replaced or truncated: start over
            f.entries, f.indexed, f.inode = [], 0, st.st_ino
        if st.st_size == f.indexed:
            return
        with f.path.open("rb") as fh:
            fh.seek(f.indexed)
            pos = f.indexed
            for raw in fh:
                if not raw.endswith(b"\n"):  # a line still being written
                    break
                if raw.strip():
                    f.entries.extend(_entries(raw, f.run, i, pos))
                pos += len(raw)
            f.indexed = pos

    # --- reading ----------------------------------------------------------------------------
    def entries(self) -> list[Entry]:
        self.refresh()
        return [e for f in self.files for e in f.entries]

    def query(self, filters: Filters, offset: int = 0, limit: int = 50) -> tuple[int, list[Entry]]:
        """(number of matches, the page ``offset:offset+limit`` of them) in file order."""
        hits = [e for e in self.entries() if filters.match(e)]
        return len(hits), hits[offset : offset + limit]

    def find(self, traj_id: str) -> Entry | None:
        return next((e for e in self.entries() if e.id == traj_id), None)

    def record(self, e: Entry) -> dict[str, Any]:
        """The full JSON record of an entry, read from its file offset."""
        with self.files[e.file].path.open("rb") as fh:
            fh.seek(e.offset)
            d: dict[str, Any] = json.loads(fh.read(e.nbytes))
        return d if e.member < 0 else dict(d["trajectories"][e.member])

    def group(self, key: str) -> list[Entry]:
        return [e for e in self.entries() if e.group == key]

    def facets(self) -> dict[str, Any]:
        """Values the filters can take: runs, steps, envs, statuses."""
        es = self.entries()
        return {
            "runs": [s.label for s in self.sources],
            "steps": sorted({e.step for e in es if e.step is not None}),
            "envs": sorted({e.env for e in es}),
            "statuses": sorted({e.status for e in es}),
            "count": len(es),
        }

    def step_stats(self, run: str | None, step: int | None) -> dict[str, Any]:
        """Count, mean reward, success rate, mean length and status counts of one step."""
        es = [e for e in self.entries() if (run is None or e.run == run) and e.step == step]
        n = len(es)
        statuses: dict[str, int] = {}
        for e in es:
            statuses[e.status] = statuses.get(e.status, 0) + 1
        return {
            "run": run,
            "step": step,
            "count": n,
            "reward_mean": sum(e.reward for e in es) / n if n else None,
            "success_rate": sum(e.reward > 0 for e in es) / n if n else None,
            "length_mean": sum(e.length for e in es) / n if n else None,
            "statuses": statuses,
        }

    def metrics(self) -> dict[str, list[dict[str, Any]]]:
        """Each run's metrics.jsonl rows (a run directory's only), by run label."""
        out: dict[str, list[dict[str, Any]]] = {}
        for s in self.sources:
            p = s.metrics_path
            if p is None:
                continue
            rows = []
            with p.open() as fh:
                for line in fh:
                    if line.strip() and line.endswith("\n"):
                        try:
                            rows.append(json.loads(line))
                        except json.JSONDecodeError:
                            continue
            out[s.label] = rows
        return out


def _entries(raw: bytes, run: str, file: int, offset: int) -> list[Entry]:
    """The entries of one line: a trajectory, or a group (``agentrl rollout --out``)."""
    try:
        d = json.loads(raw)
    except ValueError:
        return []  # a torn line: skipped
    if not isinstance(d, dict):
        return []
    if isinstance(d.get("trajectories"), list):  # a TrajectoryGroup line
        es = (_entry(t, run, file, offset, len(raw), k) for k, t in enumerate(d["trajectories"]))
        return [e for e in es if e is not None]
    e = _entry(d, run, file, offset, len(raw), -1)
    return [e] if e is not None else []


def _entry(
    d: dict[str, Any], run: str, file: int, offset: int, nbytes: int, member: int
) -> Entry | None:
    try:
        sample = d.get("sample") or {}
        segs = d.get("segments") or []
        step = d.get("step")
        gi = d.get("group_index")
        group = f"{run}:{step}:{gi}" if step is not None and gi is not None else sample.get("uid")
        advs = [a for a in d.get("advantages") or [] if a is not None]
        return Entry(
            id=str(d["id"]),
            run=run,
            step=int(step) if step is not None else None,
            group=str(group or d["id"]),
            env=str(sample.get("env_id", "")),
            status=str(d.get("status", "")),
            reward=float(d.get("reward", 0.0)),
            length=sum(sum(s.get("loss_mask") or []) for s in segs),
            tokens=sum(len(s.get("token_ids") or []) for s in segs),
            turns=len(d.get("turns") or []),
            advantage=float(advs[0]) if advs else None,
            agent=d.get("agent"),
            file=file,
            offset=offset,
            nbytes=nbytes,
            member=member,
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        return None  # not a trajectory: skipped
