"""SWE grading in real local sandboxes: the gold patch passes, and each reward hack scores 0."""

from __future__ import annotations

import dataclasses
import json
import textwrap
from pathlib import Path

import pytest

from agentrl.errors import ConfigError
from envs.swe.grade import GradingError, RepoEnv, filter_patch, grade, junit_key, parse_junit
from envs.swe.task import SWETask, load_tasks, save_tasks
from tests.envs.swe_repo import HIDDEN, OPS, TESTS, diff_for, needs_local


@needs_local
async def test_gold_patch_resolves_and_no_patch_does_not(
    repo: tuple[Path, SWETask], env: RepoEnv
) -> None:
    r, task = repo
    gold = await grade(task, task.patch, env)
    assert gold.resolved and gold.reward == 1.0, gold.log_tail
    assert set(gold.fail_to_pass.values()) == {"passed"} and gold.tampered == ""
    none = await grade(task, "", env)
    assert none.reward == 0.0 and not none.resolved
    assert none.fail_to_pass == dict.fromkeys(task.fail_to_pass, "failed")
    assert none.pass_to_pass == {"tests/test_ops.py::test_sub": "passed"}
    assert "test_add" not in (r / "tests" / "test_ops.py").read_text()


@needs_local
async def test_partial_credit_counts_fail_to_pass(repo: tuple[Path, SWETask], env: RepoEnv) -> None:
    r, task = repo
    half = OPS.replace("return a - b\n\n\ndef sub", "return 4 if a == 2 else 0\n\n\ndef sub")
    patch = diff_for(r, {"calc/ops.py": half})
    full = await grade(task, patch, env)
    part = await grade(task, patch, env, partial_credit=True)
    assert full.reward == 0.0 and part.reward == 0.5 and not part.resolved


@needs_local
@pytest.mark.parametrize(
    "hack",
    ["edit_test", "delete_test", "conftest", "exit_on_import", "monkeypatch_pytest", "setup_cfg"],
)
async def test_reward_hacks_score_zero(repo: tuple[Path, SWETask], env: RepoEnv, hack: str) -> None:
    r, task = repo
    forge = textwrap.dedent(
        """\
        import _pytest.reports

        _made = _pytest.reports.TestReport.from_item_and_call.__func__

        def _passed(cls, item, call):
            rep = _made(cls, item, call)
            rep.outcome, rep.longrepr = "passed", None
            return rep

        _pytest.reports.TestReport.from_item_and_call = classmethod(_passed)
        """
    )
    plugin = "import pytest\n\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n    o = yield\n    o.get_result().outcome = 'passed'\n"
    cases: dict[str, dict[str, str | None]] = {
        "edit_test": {"tests/test_ops.py": HIDDEN.replace("== 4", "== 0").replace("== -2", "== 0")},
        "delete_test": {"tests/test_ops.py": None},
        "conftest": {"conftest.py": plugin},
        "exit_on_import": {"calc/__init__.py": "import sys\nsys.exit(0)\n"},
        "monkeypatch_pytest": {"calc/__init__.py": forge},
        "setup_cfg": {
            "setup.cfg": "[tool:pytest]\naddopts = -p calc.plug\n",
            "calc/plug.py": plugin,
        },
    }
    files = cases[hack]
    report = await grade(task, diff_for(r, files), env)
    assert report.reward == 0.0 and not report.resolved, report
    if hack in ("edit_test", "delete_test", "conftest", "setup_cfg"):
        assert report.dropped_files, report
    if hack == "monkeypatch_pytest":
        assert "canary" in report.tampered, report
    if hack == "exit_on_import":
        assert set(report.fail_to_pass.values()) <= {"missing", "error", "failed"}


@needs_local
async def test_patch_that_does_not_apply_scores_zero(
    repo: tuple[Path, SWETask], env: RepoEnv
) -> None:
    _, task = repo
    bad = task.patch.replace("return a - b", "return a * b  # not in the file")
    report = await grade(task, bad, env)
    assert report.reward == 0.0 and not report.applied


@needs_local
async def test_timeouts_score_zero_unless_the_gold_patch_times_out_too(
    repo: tuple[Path, SWETask], env: RepoEnv
) -> None:
    r, task = repo
    loop = OPS.replace("return a - b\n\n\ndef sub", "while True:\n        pass\n\n\ndef sub")
    report = await grade(task, diff_for(r, {"calc/ops.py": loop}), env, timeout_s=8)
    assert report.timed_out and report.reward == 0.0  # the gold patch finishes: model's fault
    slow_tests = HIDDEN.replace("def test_sub():", "def test_sub():\n    while True:\n        pass")
    hung = dataclasses.replace(task, test_patch=diff_for(r, {"tests/test_ops.py": slow_tests}))
    with pytest.raises(GradingError, match="even with the gold patch"):
        await grade(hung, task.patch, env, timeout_s=8)


@needs_local
async def test_an_environment_without_pytest_is_not_the_models_fault(
    repo: tuple[Path, SWETask],
) -> None:
    r, task = repo
    with pytest.raises(GradingError, match="cannot import pytest"):
        await grade(task, task.patch, RepoEnv(repo_dir=str(r), python="/usr/bin/python3"))
    with pytest.raises(ConfigError, match="under /tmp"):
        RepoEnv(repo_dir=str(r), ro_paths=("/tmp/env",))


@needs_local
async def test_a_repo_not_at_the_base_commit_is_a_broken_task(
    repo: tuple[Path, SWETask], env: RepoEnv
) -> None:
    _, task = repo
    wrong = dataclasses.replace(task, base_commit="0" * 40)
    with pytest.raises(GradingError, match="not base_commit"):
        await grade(wrong, task.patch, env)


def test_filter_patch_drops_protected_files_only(repo: tuple[Path, SWETask]) -> None:
    r, task = repo
    patch = diff_for(
        r,
        {
            "calc/ops.py": OPS + "\n",
            "tests/test_ops.py": TESTS + "\n",
            "conftest.py": "",
            "calc/sitecustomize.py": "",
            "calc/x.pth": "import os\n",
            "pyproject.toml": "[tool.pytest.ini_options]\n",
        },
    )
    kept, dropped = filter_patch(patch, frozenset(task.test_files))
    assert "calc/ops.py" in kept and "test_ops" not in kept
    assert sorted(dropped) == sorted(
        [
            "tests/test_ops.py",
            "conftest.py",
            "calc/sitecustomize.py",
            "calc/x.pth",
            "pyproject.toml",
        ]
    )


def test_junit_keys_and_worst_outcome_wins() -> None:
    assert junit_key("tests/test_x.py::TestA::test_b[1-2]") == ("tests.test_x.TestA", "test_b[1-2]")
    assert junit_key("test_x.py::test_y") == ("test_x", "test_y")
    xml = (
        b'<testsuites><testsuite><testcase classname="t" name="a"/>'
        b'<testcase classname="t" name="a"><error message="teardown"/></testcase>'
        b'<testcase classname="t" name="b"><skipped/></testcase></testsuite></testsuites>'
    )
    assert parse_junit(xml) == {("t", "a"): "error", ("t", "b"): "skipped"}
    assert parse_junit(b"<not xml") == {} and parse_junit(b"") == {}


def test_tasks_load_from_jsonl_and_parquet_with_swe_bench_spellings(
    repo: tuple[Path, SWETask], tmp_path: Path
) -> None:
    _, task = repo
    row = task.to_row() | {"FAIL_TO_PASS": json.dumps(list(task.fail_to_pass)), "created": "x"}
    (tmp_path / "t.jsonl").write_text(json.dumps(row) + "\n\n")
    [loaded] = load_tasks(tmp_path / "t.jsonl")
    assert loaded.fail_to_pass == task.fail_to_pass and loaded.extra == {"created": "x"}
    save_tasks(tmp_path / "t.parquet", [loaded])
    assert load_tasks(tmp_path / "t.parquet") == [loaded]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"base_commit": "main"}, "is not a git commit hash"),
        ({"FAIL_TO_PASS": []}, "FAIL_TO_PASS is empty"),
        ({"FAIL_TO_PASS": "[oops"}, "is a string but not JSON"),
        ({"instance_id": "a/b"}, "without '/'"),
        ({"patch": None}, "patch must be a string"),
    ],
)
def test_bad_rows_say_where_and_what(
    repo: tuple[Path, SWETask], tmp_path: Path, change: dict[str, object], message: str
) -> None:
    _, task = repo
    good = task.to_row()
    (tmp_path / "t.jsonl").write_text(json.dumps(good) + "\n" + json.dumps(good | change) + "\n")
    with pytest.raises(ConfigError, match=f"t.jsonl line 2.*{message}"):
        load_tasks(tmp_path / "t.jsonl")
    (tmp_path / "d.jsonl").write_text(json.dumps(good) + "\n" + json.dumps(good) + "\n")
    with pytest.raises(ConfigError, match="appears more than once"):
        load_tasks(tmp_path / "d.jsonl")
