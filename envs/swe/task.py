"""SWE task rows: the SWE-bench columns, loaded from JSONL or parquet and checked on load.

    tasks = load_tasks("tasks.jsonl")            # or .parquet; a bad row names its line and field
    task = tasks[0]
    task.instance_id, task.base_commit, task.fail_to_pass   # ("pkg__mod-12", "9f0c...", ["t.py::t"])

A row has SWE-bench's columns: ``instance_id``, ``repo``, ``base_commit``,
``problem_statement``, ``patch`` (the gold fix), ``test_patch`` (the hidden tests),
``FAIL_TO_PASS`` and ``PASS_TO_PASS`` (pytest node ids; SWE-bench stores them as JSON-encoded
strings, and both spellings load), plus optional ``setup_commands`` (run once when the repo's
environment is built), ``version``, ``environment_setup_commit`` and ``metadata`` (e.g. the
mutation family of a synthesized task). Unknown columns are kept in ``extra``, so rows of other
datasets load without losing anything.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agentrl.errors import ConfigError

_COMMIT = re.compile(r"^[0-9a-f]{7,40}$")
_REQUIRED = ("instance_id", "repo", "base_commit", "problem_statement", "patch", "test_patch")
_KNOWN = {
    *_REQUIRED,
    "FAIL_TO_PASS",
    "PASS_TO_PASS",
    "setup_commands",
    "version",
    "environment_setup_commit",
    "metadata",
}


@dataclass(frozen=True, slots=True)
class SWETask:
    """One repository task: fix ``problem_statement`` in ``repo`` at ``base_commit``."""

    instance_id: str
    repo: str
    base_commit: str
    problem_statement: str
    patch: str
    test_patch: str
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...] = ()
    setup_commands: tuple[str, ...] = ()
    version: str = ""
    environment_setup_commit: str = ""
    metadata: Mapping[str, Any] = field(default_factory=dict)
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_row(cls, row: Mapping[str, Any], *, where: str = "row") -> SWETask:
        """Check and convert one row; errors say ``where`` (e.g. ``tasks.jsonl line 3``)."""
        if not isinstance(row, Mapping):
            raise ConfigError(f"{where}: expected a JSON object (a SWE-bench row), got {row!r:.80}")
        missing = [k for k in _REQUIRED if k not in row]
        if missing:
            raise ConfigError(
                f"{where}: missing {', '.join(missing)}; a SWE task row needs "
                f"{', '.join(_REQUIRED)}, FAIL_TO_PASS and optionally PASS_TO_PASS"
            )
        for k in _REQUIRED:
            if not isinstance(row[k], str):
                raise ConfigError(f"{where}: {k} must be a string, got {type(row[k]).__name__}")
        iid = row["instance_id"]
        if not iid.strip() or "/" in iid or iid.startswith("."):
            raise ConfigError(
                f"{where}: instance_id {iid!r} must be a non-empty name without '/' "
                "(it names files and sandboxes)"
            )
        if not _COMMIT.match(row["base_commit"]):
            raise ConfigError(
                f"{where} ({iid}): base_commit {row['base_commit']!r} is not a git commit "
                "hash (7-40 lowercase hex digits)"
            )
        f2p = _test_ids(row.get("FAIL_TO_PASS"), "FAIL_TO_PASS", where, iid)
        if not f2p:
            raise ConfigError(
                f"{where} ({iid}): FAIL_TO_PASS is empty; a task needs at least one test that "
                "fails before the fix and passes after it"
            )
        p2p = _test_ids(row.get("PASS_TO_PASS"), "PASS_TO_PASS", where, iid)
        setup = row.get("setup_commands") or ()
        if isinstance(setup, str):
            setup = (setup,)
        metadata = row.get("metadata") or {}
        if isinstance(metadata, str):
            metadata = json.loads(metadata) if metadata.strip() else {}
        return cls(
            instance_id=iid,
            repo=row["repo"],
            base_commit=row["base_commit"],
            problem_statement=row["problem_statement"],
            patch=row["patch"],
            test_patch=row["test_patch"],
            fail_to_pass=f2p,
            pass_to_pass=p2p,
            setup_commands=tuple(str(c) for c in setup),
            version=str(row.get("version") or ""),
            environment_setup_commit=str(row.get("environment_setup_commit") or ""),
            metadata=dict(metadata),
            extra={k: v for k, v in row.items() if k not in _KNOWN},
        )

    def to_row(self) -> dict[str, Any]:
        """The SWE-bench row again (test lists as lists; ``extra`` columns merged back)."""
        d = asdict(self)
        d["FAIL_TO_PASS"] = list(d.pop("fail_to_pass"))
        d["PASS_TO_PASS"] = list(d.pop("pass_to_pass"))
        d["setup_commands"] = list(d["setup_commands"])
        return {**d.pop("extra"), **d}

    @property
    def test_files(self) -> list[str]:
        """Files the hidden test patch touches (restored from the base before grading)."""
        return patch_files(self.test_patch)


def _test_ids(value: Any, key: str, where: str, iid: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else []
        except json.JSONDecodeError as e:
            raise ConfigError(
                f"{where} ({iid}): {key} is a string but not JSON ({e}); give a list of pytest "
                'node ids, e.g. ["tests/test_x.py::test_y"]'
            ) from None
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where} ({iid}): {key} must be a list of pytest node ids (strings)")
    return tuple(value)


_DIFF_FILE = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.MULTILINE)


def patch_files(patch: str) -> list[str]:
    """The paths a unified git diff touches (both sides of a rename), in order, unique."""
    seen: dict[str, None] = {}
    for a, b in _DIFF_FILE.findall(patch):
        seen.setdefault(a)
        seen.setdefault(b)
    return list(seen)


def load_tasks(path: str | Path) -> list[SWETask]:
    """Rows of ``path`` (.jsonl or .parquet) as tasks; duplicate instance ids are refused."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"task file {str(p)!r} does not exist")
    if p.suffix == ".jsonl":
        tasks = []
        for i, line in enumerate(p.read_text().splitlines(), 1):
            if not line.strip():
                continue
            where = f"{p.name} line {i}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ConfigError(f"{where}: not JSON ({e})") from None
            tasks.append(SWETask.from_row(row, where=where))
    elif p.suffix == ".parquet":
        import pyarrow.parquet as pq

        rows = pq.read_table(p).to_pylist()
        tasks = [SWETask.from_row(r, where=f"{p.name} row {i}") for i, r in enumerate(rows)]
    else:
        raise ConfigError(f"cannot read tasks from {str(p)!r}: use a .jsonl or .parquet file")
    _check_unique(tasks, p.name)
    return tasks


def save_tasks(path: str | Path, tasks: Iterable[SWETask]) -> Path:
    """Write tasks as SWE-bench rows (.jsonl or .parquet)."""
    p = Path(path)
    rows = [t.to_row() for t in tasks]
    p.parent.mkdir(parents=True, exist_ok=True)
    if p.suffix == ".jsonl":
        p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif p.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        for r in rows:  # a nested mapping column needs one schema; JSON keeps rows free-form
            r["metadata"] = json.dumps(r["metadata"])
        pq.write_table(pa.Table.from_pylist(rows), p)
    else:
        raise ConfigError(f"cannot write tasks to {str(p)!r}: use a .jsonl or .parquet file")
    return p


def _check_unique(tasks: list[SWETask], name: str) -> None:
    seen: set[str] = set()
    for t in tasks:
        if t.instance_id in seen:
            raise ConfigError(f"{name}: instance_id {t.instance_id!r} appears more than once")
        seen.add(t.instance_id)
