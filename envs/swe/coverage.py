"""Which tests run which functions: a coverage map, made by one traced pytest run per repo.

    cmap = coverage_map(repo_dir, python, tests=("tests",), out=cache / "coverage.json")
    cmap.covering("pkg/mod.py", 12)      # node ids of the passing tests that call the function
                                         # whose first line (co_firstlineno) is 12

How: pytest runs the repo's tests once with a small plugin (written to a scratch folder and
loaded with ``-p``, plugin autoload off) that installs a ``sys.settrace`` hook around each
test's setup, call and teardown. The hook sees only *call* events (it returns ``None``, so no
per-line tracing) and adds the frame's code object to the test's set; at the end each code
object under the repo becomes ``path:first_line``. Outcomes and durations per test come from
the same run, so the map only lists tests that passed on the clean repo.

Why a call tracer and not ``coverage`` with dynamic contexts: the unit of a mutation is a
function, so line data is more than needed; ``coverage`` records every line per context (and
is not installed in a repo's offline test env), while a call hook costs one set insertion per
Python call. ``sys.monitoring`` (3.12) would be cheaper still, but the test envs are built on
the system Python, which may be 3.11.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from agentrl.errors import ConfigError

PLUGIN = """
import json, os, sys, time
import pytest

_ROOT = os.path.realpath(os.environ["AGENTRL_TRACE_ROOT"]) + os.sep
_OUT = os.environ["AGENTRL_TRACE_OUT"]
_cur = set()
_tests = {}


def _trace(frame, event, arg):
    _cur.add(frame.f_code)
    return None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    global _cur
    _cur = set()
    sys.settrace(_trace)
    try:
        yield
    finally:
        sys.settrace(None)
    keys = set()
    for code in _cur:
        f = code.co_filename
        if f.startswith(_ROOT):
            keys.add(f[len(_ROOT):] + ":" + str(code.co_firstlineno))
        elif not f.startswith("<") and os.path.realpath(f).startswith(_ROOT):
            keys.add(os.path.realpath(f)[len(_ROOT):] + ":" + str(code.co_firstlineno))
    _tests.setdefault(item.nodeid, {"outcome": "passed", "duration": 0.0})["functions"] = sorted(keys)


def pytest_runtest_logreport(report):
    t = _tests.setdefault(report.nodeid, {"outcome": "passed", "duration": 0.0})
    t["duration"] += report.duration
    if report.outcome != "passed" and t["outcome"] == "passed":
        t["outcome"] = report.outcome


def pytest_sessionfinish(session, exitstatus):
    with open(_OUT, "w") as f:
        json.dump(_tests, f)
"""


@dataclass(frozen=True, slots=True)
class CoverageMap:
    """Tests by function (``path:first_line``), and each test's duration on the clean repo."""

    by_function: dict[str, list[str]] = field(default_factory=dict)
    durations: dict[str, float] = field(default_factory=dict)
    failing: list[str] = field(default_factory=list)
    """Tests that did not pass on the clean repo (never used as covering tests)."""

    def covering(self, path: str, first_line: int) -> list[str]:
        return self.by_function.get(f"{path}:{first_line}", [])

    def to_json(self) -> dict[str, object]:
        return {
            "by_function": self.by_function,
            "durations": self.durations,
            "failing": self.failing,
        }

    @classmethod
    def from_json(cls, d: dict[str, object]) -> CoverageMap:
        return cls(
            by_function=dict(d["by_function"]),  # type: ignore[call-overload]
            durations=dict(d["durations"]),  # type: ignore[call-overload]
            failing=list(d["failing"]),  # type: ignore[call-overload]
        )


def is_test_path(path: str) -> bool:
    """Whether a repo-relative path is a test file (the grader protects the same files)."""
    from envs.swe.grade import is_protected

    return is_protected(path)


def coverage_map(
    repo_dir: str | Path,
    python: str,
    tests: tuple[str, ...],
    *,
    out: str | Path | None = None,
    max_test_s: float = 5.0,
    timeout_s: float = 1800.0,
) -> CoverageMap:
    """Run ``tests`` once under the tracer in ``repo_dir``; see the module docstring.

    Tests slower than ``max_test_s`` are left out of the map (a task's tests must grade fast);
    ``out`` caches the result as JSON (reused when present).
    """
    if out is not None and Path(out).exists():
        return CoverageMap.from_json(json.loads(Path(out).read_text()))
    repo = Path(repo_dir)
    with tempfile.TemporaryDirectory(prefix="agentrl-swe-trace-") as tmp:
        (Path(tmp) / "agentrl_swe_trace.py").write_text(PLUGIN)
        raw = Path(tmp) / "raw.json"
        env = {
            **os.environ,
            "PYTHONPATH": tmp,
            "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
            "AGENTRL_TRACE_ROOT": str(repo),
            "AGENTRL_TRACE_OUT": str(raw),
        }
        env.pop("PYTEST_ADDOPTS", None)
        r = subprocess.run(
            [
                python,
                "-m",
                "pytest",
                "-p",
                "no:cacheprovider",
                "-p",
                "agentrl_swe_trace",
                "--rootdir=.",
                "-q",
                "-o",
                "addopts=",
                *tests,
            ],
            cwd=repo,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        if not raw.exists():
            raise ConfigError(
                f"the traced test run in {repo} wrote no coverage (exit {r.returncode}): "
                f"{(r.stdout + r.stderr)[-2000:]}"
            )
        data = json.loads(raw.read_text())
    by_function: dict[str, list[str]] = defaultdict(list)
    durations: dict[str, float] = {}
    failing: list[str] = []
    for nodeid, t in sorted(data.items()):
        path = nodeid.split("::", 1)[0]
        if "::" not in nodeid or not is_test_path(path):
            continue  # doctests and other items outside test files
        durations[nodeid] = round(float(t["duration"]), 4)
        if t["outcome"] != "passed":
            failing.append(nodeid)
            continue
        if t["duration"] > max_test_s:
            continue
        for key in t.get("functions", ()):
            if not is_test_path(key.rsplit(":", 1)[0]):
                by_function[key].append(nodeid)
    cmap = CoverageMap(by_function=dict(by_function), durations=durations, failing=failing)
    if out is not None:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(cmap.to_json()))
    return cmap
