"""Save and load trajectories and groups as JSONL or parquet; both load back into the same types.

    save_trajectories(path, trajs)  /  load_trajectories(path)     (.jsonl or .parquet)
    save_groups(path, groups)       /  load_groups(path)

JSONL: one ``Trajectory.to_dict()`` (or ``TrajectoryGroup.to_dict()``) per line.
Parquet (pyarrow): one row per trajectory. Scalars are columns (``id``, ``uid``, ``env_id``,
``status``, ``reward``, timings, ``agent``, ``num_turns``) and the token ledger is proper nested columns
(``segments_token_ids: list<list<int64>>``, likewise ``loss_mask``, ``logprobs``,
``versions``) so analytics read it without JSON; messages, turns, the sample, metrics and
reward components are JSON strings. Groups add a ``group_index`` column.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from agentrl.errors import ConfigError
from agentrl.types import Trajectory, TrajectoryGroup

_LEDGER = ("token_ids", "loss_mask", "logprobs", "versions")
_JSON_COLS = ("sample", "messages", "turns", "reward_components", "metrics", "report")
_SCALARS = ("id", "status", "error", "reward", "llm_time_s", "env_time_s", "wall_time_s", "agent")


def _fmt(path: Path) -> str:
    if path.suffix == ".jsonl":
        return "jsonl"
    if path.suffix == ".parquet":
        return "parquet"
    raise ConfigError(
        f"cannot tell the format of {str(path)!r}: use a .jsonl or .parquet file name"
    )


# --- trajectories -----------------------------------------------------------------------------
def save_trajectories(path: str | Path, trajectories: Iterable[Trajectory]) -> Path:
    """Write trajectories to ``path`` (.jsonl or .parquet); returns the path."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    ts = list(trajectories)
    if _fmt(p) == "jsonl":
        with p.open("w") as f:
            for t in ts:
                f.write(json.dumps(t.to_dict()) + "\n")
    else:
        _write_parquet(p, [_row(t) for t in ts])
    return p


def load_trajectories(path: str | Path) -> list[Trajectory]:
    p = Path(path)
    if _fmt(p) == "jsonl":
        with p.open() as f:
            return [Trajectory.from_dict(json.loads(line)) for line in f if line.strip()]
    return [_from_row(r) for r in _read_parquet(p)]


# --- groups -----------------------------------------------------------------------------------
def save_groups(path: str | Path, groups: Iterable[TrajectoryGroup]) -> Path:
    """Write groups to ``path`` (.jsonl: one group per line; .parquet: one trajectory per row)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    gs = list(groups)
    if _fmt(p) == "jsonl":
        with p.open("w") as f:
            for g in gs:
                f.write(json.dumps(g.to_dict()) + "\n")
    else:
        rows = [{**_row(t), "group_index": gi} for gi, g in enumerate(gs) for t in g.trajectories]
        _write_parquet(p, rows, group_uids=[g.uid for g in gs])
    return p


def load_groups(path: str | Path) -> list[TrajectoryGroup]:
    p = Path(path)
    if _fmt(p) == "jsonl":
        with p.open() as f:
            return [TrajectoryGroup.from_dict(json.loads(line)) for line in f if line.strip()]
    table = _read_table(p)
    meta = table.schema.metadata or {}
    uids = json.loads(meta.get(b"agentrl.group_uids", b"[]"))
    members: dict[int, list[Trajectory]] = {}
    for r in table.to_pylist():
        members.setdefault(int(r["group_index"]), []).append(_from_row(r))
    return [
        TrajectoryGroup(uid=uids[gi] if gi < len(uids) else ts[0].sample.uid, trajectories=ts)
        for gi, ts in sorted(members.items())
    ]


# --- parquet rows -----------------------------------------------------------------------------
def _row(t: Trajectory) -> dict[str, Any]:
    d = t.to_dict()
    row: dict[str, Any] = {k: d[k] for k in _SCALARS}
    row["uid"] = t.sample.uid
    row["env_id"] = t.sample.env_id
    row["num_turns"] = t.num_turns
    for k in _JSON_COLS:
        row[k] = json.dumps(d[k])
    for k in _LEDGER:
        row[f"segments_{k}"] = [getattr(s, k) for s in t.segments]
    return row


def _from_row(r: dict[str, Any]) -> Trajectory:
    d: dict[str, Any] = {k: r.get(k) for k in _SCALARS}  # files from before a column have none
    for k in _JSON_COLS:
        d[k] = json.loads(r[k]) if r.get(k) is not None else None
    cols = [r[f"segments_{k}"] or [] for k in _LEDGER]
    d["segments"] = [dict(zip(_LEDGER, vals, strict=True)) for vals in zip(*cols, strict=True)]
    return Trajectory.from_dict(d)


def _schema(with_group: bool) -> Any:
    import pyarrow as pa

    fields = [
        ("id", pa.string()),
        ("uid", pa.string()),
        ("env_id", pa.string()),
        ("status", pa.string()),
        ("error", pa.string()),
        ("reward", pa.float64()),
        ("llm_time_s", pa.float64()),
        ("env_time_s", pa.float64()),
        ("wall_time_s", pa.float64()),
        ("agent", pa.string()),
        ("num_turns", pa.int64()),
        *((k, pa.string()) for k in _JSON_COLS),
        ("segments_token_ids", pa.list_(pa.list_(pa.int64()))),
        ("segments_loss_mask", pa.list_(pa.list_(pa.int8()))),
        ("segments_logprobs", pa.list_(pa.list_(pa.float64()))),
        ("segments_versions", pa.list_(pa.list_(pa.int64()))),
    ]
    if with_group:
        fields.append(("group_index", pa.int64()))
    return pa.schema(fields)


def _write_parquet(
    p: Path, rows: list[dict[str, Any]], group_uids: list[str] | None = None
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = _schema(with_group=group_uids is not None)
    if group_uids is not None:
        schema = schema.with_metadata({"agentrl.group_uids": json.dumps(group_uids)})
    table = pa.Table.from_pylist(rows, schema=schema)
    pq.write_table(table, p)


def _read_table(p: Path) -> Any:
    import pyarrow.parquet as pq

    if not p.is_file():
        raise ConfigError(f"no parquet file at {str(p)!r}")
    return pq.read_table(p)


def _read_parquet(p: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = _read_table(p).to_pylist()
    return rows
