"""SWE task synthesis: mutations, the coverage map, tasks from a tiny repo graded in sandboxes,
issue texts that do not leak the fix, repo-disjoint splits, and pinned, hash-checked prepares."""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import re
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentrl.errors import ConfigError
from agentrl.splits import split_of
from envs.swe.coverage import coverage_map
from envs.swe.grade import grade
from envs.swe.mutate import mutants
from envs.swe.pyenv import build_test_env
from envs.swe.repos import Prepared, RepoSpec, prepare_one
from envs.swe.synth import SynthConfig, materialize, synthesize_repo
from envs.swe.task import SWETask, load_tasks
from envs.swe.validate import repo_env
from tests.envs.swe_repo import needs_local

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "data" / "swe" / "tasks.jsonl"
NEGATE = (
    ROOT / "data" / "swe" / "negate.jsonl"
)  # the negated-condition curriculum (recipes/swe.yaml)

SNIPPET = '''\
def f(a, b, xs):
    """Doc."""
    total = a + b
    if a < b and b is not None:
        return xs[1:b]
    g(a, b)
    return total
'''


@pytest.mark.parametrize(
    ("family", "old", "new"),
    [
        ("op_swap", "total = a + b", "total = a - b"),
        ("compare_swap", "if a < b and", "if a <= b and"),
        ("compare_swap", "b is not None", "b is None"),
        ("bool_swap", "a < b and b", "a < b or b"),
        ("off_by_one", "xs[1:b]", "xs[2:b]"),
        ("off_by_one", "xs[1:b]", "xs[1:b + 1]"),
        ("negate_condition", "if a < b and b is not None:", "if not (a < b and b is not None):"),
        ("drop_statement", "    g(a, b)\n", ""),
        ("drop_return", "        return xs[1:b]\n", "        pass\n"),
        ("swap_args", "g(a, b)", "g(b, a)"),
    ],
)
def test_each_mutation_family_makes_its_edit(family: str, old: str, new: str) -> None:
    expected = SNIPPET.replace(old, new, 1)
    found = [m for m in mutants(SNIPPET, "m.py") if m.family == family]
    assert expected in [m.source for m in found], [m.source for m in found]
    m = next(m for m in found if m.source == expected)
    assert m.function == "f" and m.function_line == 1
    assert (
        SNIPPET.splitlines()[m.line - 1].strip() in old.strip()
        or old.strip() in SNIPPET.splitlines()[m.line - 1]
    )


def test_mutants_are_deduplicated_and_skip_docstrings_and_module_code() -> None:
    src = "X = 1 + 2\n\n\nclass C:\n    @dec\n    def m(self, y):\n        '''doc'''\n        y.append(1)\n        y.append(1)\n"
    ms = list(mutants(src, "m.py"))
    drops = [m for m in ms if m.family == "drop_statement"]
    assert len(drops) == 1  # dropping either identical line gives the same file
    assert len({m.source for m in ms}) == len(ms)
    assert all(m.function == "C.m" and m.function_line == 5 for m in ms)  # first decorator line
    assert all(m.line >= 6 for m in ms)  # nothing at module level (line 1) or in the docstring


def test_multibyte_text_keeps_offsets_right() -> None:
    src = 'def f(s):\n    return "é" + s[0:1]\n'
    ms = {m.source for m in mutants(src, "m.py")}
    assert 'def f(s):\n    return "é" - s[0:1]\n' in ms
    assert 'def f(s):\n    return "é" + s[0:2]\n' in ms


# --- a tiny repo ----------------------------------------------------------------------------

OPS = """\
def add(a, b):
    return a + b


def clamp(x, lo, hi):
    if x < lo:
        return lo
    if x > hi:
        return hi
    return x
"""
TESTS = """\
from calc.ops import add, clamp


def test_add():
    assert add(2, 3) == 5, "add(2, 3) should be 5"


def test_add_zero():
    assert add(0, 0) == 0


class TestClamp:
    def test_low(self):
        assert clamp(-5, 0, 10) == 0

    def test_high(self):
        assert clamp(50, 0, 10) == 10

    def test_mid(self):
        assert clamp(5, 0, 10) == 5
"""


@pytest.fixture(scope="module")
def tiny() -> Iterator[Prepared]:
    if not Path("/usr/bin/python3").exists():
        pytest.skip("no system Python under /usr to build the repo's test env from")
    root = Path(tempfile.mkdtemp(prefix="agentrl-swe-synth-", dir="/var/tmp"))
    os.chmod(root, 0o755)
    repo = root / "calc" / "repo"
    (repo / "calc").mkdir(parents=True)
    (repo / "tests").mkdir()
    (repo / "calc" / "__init__.py").write_text("")
    (repo / "calc" / "ops.py").write_text(OPS)
    (repo / "tests" / "test_ops.py").write_text(TESTS)
    from envs.swe.repos import commit_tree

    commit = commit_tree(repo, "calc")
    build_test_env(root / "calc" / "env")
    subprocess.run(["chmod", "-R", "a+rX", str(root)], check=True)
    yield Prepared(RepoSpec("calc", "0", "", "", "MIT", ("tests",)), root / "calc", commit)
    subprocess.run(["rm", "-rf", str(root)], check=True)


def test_coverage_map_finds_the_tests_that_call_a_function(tiny: Prepared) -> None:
    cmap = coverage_map(tiny.repo_dir, tiny.python, ("tests",))
    assert cmap.covering("calc/ops.py", 1) == [
        "tests/test_ops.py::test_add",
        "tests/test_ops.py::test_add_zero",
    ]
    assert cmap.covering("calc/ops.py", 5) == [
        "tests/test_ops.py::TestClamp::test_high",
        "tests/test_ops.py::TestClamp::test_low",
        "tests/test_ops.py::TestClamp::test_mid",
    ]
    assert not any(k.startswith("tests/") for k in cmap.by_function)


@pytest.fixture(scope="module")
def tiny_tasks(tiny: Prepared) -> list[SWETask]:
    return synthesize_repo(tiny, SynthConfig(per_repo=50, workers=2), log=lambda _: None)


def test_synth_tasks_hide_their_failing_tests_and_name_no_fix(
    tiny: Prepared, tiny_tasks: list[SWETask]
) -> None:
    assert len(tiny_tasks) >= 4
    assert len({t.instance_id for t in tiny_tasks}) == len(tiny_tasks)
    assert len({t.patch for t in tiny_tasks}) == len(tiny_tasks)  # one task per distinct bug
    assert {str(t.metadata["family"]) for t in tiny_tasks} >= {"op_swap", "drop_return"}
    for t in tiny_tasks:
        assert t.fail_to_pass and t.pass_to_pass
        assert not set(t.fail_to_pass) & set(t.pass_to_pass)
        assert t.metadata["file"] == "calc/ops.py" and t.metadata["repo"] == "calc"
        assert t.metadata["prepared_commit"] == tiny.commit
        base_tests = subprocess.run(
            ["git", "-C", str(tiny.repo_dir), "show", f"{t.base_commit}:tests/test_ops.py"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for test in t.fail_to_pass:  # hidden: not in the workspace, only in test_patch
            name = test.rsplit("::", 1)[1]
            assert f"def {name}(" not in base_tests and f"def {name}(" in t.test_patch
        changed_line = _first_changed_line(t.patch)
        fixed = [
            line[1:]
            for line in t.patch.splitlines()
            if line.startswith("+") and not line.startswith("+++")
        ]
        s = t.problem_statement
        assert t.fail_to_pass[0] in s
        assert f":{changed_line}" not in s and f"line {changed_line}" not in s, s
        for line in fixed:
            assert not line.strip() or line.strip() not in s, (line, s)


def _first_changed_line(patch: str) -> int:
    """The base file's line number where the gold patch's first change is."""
    lines = patch.splitlines()
    i = next(i for i, line in enumerate(lines) if line.startswith("@@"))
    n = int(re.match(r"@@ -(\d+)", lines[i]).group(1))  # type: ignore[union-attr]
    for line in lines[i + 1 :]:
        if line.startswith(("-", "+")):
            return n
        n += 1
    raise AssertionError(patch)


@needs_local
def test_synth_tasks_fail_at_base_and_pass_with_gold_under_grade(
    tiny: Prepared, tiny_tasks: list[SWETask]
) -> None:
    env = repo_env(tiny.root.parent, "calc")

    async def both(t: SWETask) -> tuple[bool, bool]:
        base = await grade(t, "", env, timeout_s=60)
        gold = await grade(t, t.patch, env, timeout_s=60)
        return base.resolved, gold.resolved

    for t in tiny_tasks[:3]:
        assert asyncio.run(both(t)) == (False, True), t.instance_id


def test_materialize_rebuilds_the_same_base_commit(
    tiny: Prepared, tiny_tasks: list[SWETask]
) -> None:
    t = tiny_tasks[0]
    ref = f"refs/swe/{t.instance_id}"
    subprocess.run(["git", "-C", str(tiny.repo_dir), "update-ref", "-d", ref], check=True)
    subprocess.run(
        ["git", "-C", str(tiny.repo_dir), "reflog", "expire", "--expire=now", "--all"], check=True
    )
    subprocess.run(["git", "-C", str(tiny.repo_dir), "gc", "-q", "--prune=now"], check=True)
    missing = subprocess.run(["git", "-C", str(tiny.repo_dir), "cat-file", "-e", t.base_commit])
    assert missing.returncode != 0
    assert materialize([t], tiny.root.parent, log=lambda _: None) == 1  # same hash, or it raises
    assert materialize([t], tiny.root.parent, log=lambda _: None) == 0


# --- prepare ------------------------------------------------------------------------------


def _sdist(path: Path) -> str:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, text in {
            "pkg-1.0/pkg/__init__.py": "X = 1\n",
            "pkg-1.0/tests/test_x.py": "def test_x():\n    pass\n",
        }.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 1_700_000_000, 0o644
            tar.addfile(info, io.BytesIO(data))
    path.write_bytes(buf.getvalue())
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_prepare_is_reproducible_idempotent_and_checks_the_hash(tmp_path: Path) -> None:
    archive = tmp_path / "pkg-1.0.tar.gz"
    sha = _sdist(archive)
    spec = RepoSpec("pkg", "1.0", archive.as_uri(), sha, "MIT", ("tests",))
    logs: list[str] = []
    a = prepare_one(spec, tmp_path / "a", logs.append)
    b = prepare_one(spec, tmp_path / "b", logs.append)
    assert a.commit == b.commit  # fixed identity and date: the same hash on every machine
    again = prepare_one(spec, tmp_path / "a", logs.append)
    assert again.commit == a.commit and "reused" in logs[-2]
    pinned = RepoSpec("pkg", "1.0", archive.as_uri(), sha, "MIT", ("tests",), commit="0" * 40)
    with pytest.raises(ConfigError, match="not the pinned commit"):
        prepare_one(pinned, tmp_path / "a", logs.append)
    bad = RepoSpec("pkg", "1.0", archive.as_uri(), "f" * 64, "MIT", ("tests",))
    with pytest.raises(ConfigError, match=f"expected {'f' * 64}, got {sha}") as e:
        prepare_one(bad, tmp_path / "c", logs.append)
    assert archive.as_uri() in str(e.value)


# --- the shipped task set -----------------------------------------------------------------


@pytest.mark.parametrize("shipped", [SHIPPED, NEGATE], ids=["tasks", "negate"])
def test_shipped_tasks_split_by_repository(shipped: Path) -> None:
    tasks = load_tasks(shipped)
    assert len(tasks) >= (500 if shipped == SHIPPED else 300) and len({t.repo for t in tasks}) >= 5
    train = [t for t in tasks if split_of(t.repo) == "train"]
    held = [t for t in tasks if split_of(t.repo) == "eval"]
    assert not {t.repo for t in train} & {t.repo for t in held}
    assert len({t.repo for t in held}) >= 2 and len(held) >= 100
    assert all(t.metadata["split"] == split_of(t.repo) for t in tasks)
    assert all(t.test_patch and t.fail_to_pass and t.pass_to_pass for t in tasks)


@pytest.mark.slow
def test_prepare_and_validate_a_sample_of_the_shipped_tasks(tmp_path: Path) -> None:
    """Network to PyPI: prepare every pinned repo and both task files' base commits, then grade
    10 tasks of tasks.jsonl and 5 of the curriculum's negate.jsonl in sandboxes."""
    if not Path("/usr/bin/python3").exists():
        pytest.skip("no system Python under /usr")
    out = Path(tempfile.mkdtemp(prefix="agentrl-swe-ci-", dir="/var/tmp"))
    try:
        run = ["agentrl", "swe"]
        tasks = ["--tasks", str(SHIPPED), "--tasks", str(NEGATE)]
        subprocess.run([*run, "prepare", "--out", str(out), *tasks], check=True)
        for shipped, n in [(SHIPPED, 10), (NEGATE, 5)]:
            sample = ["--repos-dir", str(out), "--sample", str(n), "--seed", "0"]
            r = subprocess.run(
                [*run, "validate", str(shipped), *sample], capture_output=True, text=True
            )
            assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
            assert f"{n}/{n} tasks valid" in r.stdout
    finally:
        subprocess.run(["rm", "-rf", str(out)], check=True)


@needs_local
def test_swe_cli_synth_then_validate_exits_non_zero_on_a_bad_task(
    tiny: Prepared, tmp_path: Path
) -> None:
    import dataclasses

    from typer.testing import CliRunner

    from envs.swe.cli import swe_app
    from envs.swe.task import save_tasks

    runner = CliRunner()
    out = tmp_path / "tasks.jsonl"
    repos = str(tiny.root.parent)
    r = runner.invoke(
        swe_app, ["synth", "calc", "--repos-dir", repos, "--out", str(out), "--per-repo", "2"]
    )
    assert r.exit_code == 0, r.output
    assert "wrote 2 tasks" in r.output and "by family:" in r.output
    r = runner.invoke(swe_app, ["validate", str(out), "--repos-dir", repos])
    assert r.exit_code == 0 and "2/2 tasks valid" in r.output, r.output
    good = load_tasks(out)[0]
    save_tasks(out, [dataclasses.replace(good, patch="")])  # the "gold" patch fixes nothing
    r = runner.invoke(swe_app, ["validate", str(out), "--repos-dir", repos])
    assert r.exit_code == 1 and "0/1 tasks valid" in r.output and "BAD" in r.output, r.output


@pytest.mark.parametrize("shipped", [SHIPPED, NEGATE], ids=["tasks", "negate"])
def test_shipped_problem_statements_leak_no_fix_and_no_line_number(shipped: Path) -> None:
    for t in load_tasks(shipped):
        n = _first_changed_line(t.patch)
        s = t.problem_statement
        assert f".py:{n}" not in s and f"line {n}" not in s, t.instance_id
        text = s
        for test in t.fail_to_pass:  # a test's name may hold a word of the fix ("raise")
            text = text.replace(test, "")
        for line in t.patch.splitlines():
            if line.startswith("+") and not line.startswith("+++") and len(line[1:].strip()) > 3:
                assert line[1:].strip() not in text, (t.instance_id, line)
        assert not t.metadata["file"].startswith("tests/") and "test_" not in str(
            t.metadata["file"]
        )


@needs_local
def test_swe_cli_synth_keeps_only_the_named_family(tiny: Prepared, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from envs.swe.cli import swe_app

    runner = CliRunner()
    out = tmp_path / "tasks.jsonl"
    repos = str(tiny.root.parent)
    base = ["synth", "calc", "--repos-dir", repos, "--out", str(out), "--per-repo", "3"]
    r = runner.invoke(swe_app, [*base, "--family", "negate_condition"])
    assert r.exit_code == 0, r.output
    tasks = load_tasks(out)
    assert tasks and {t.metadata["family"] for t in tasks} == {"negate_condition"}, r.output
    r = runner.invoke(swe_app, [*base, "--family", "negate"])
    assert r.exit_code != 0 and "unknown mutation family negate" in r.output, r.output
    assert "negate_condition" in r.output  # the error lists the families there are


def test_synth_config_refuses_unknown_or_no_families() -> None:
    from agentrl.errors import ConfigError
    from envs.swe.synth import SynthConfig

    assert SynthConfig(families=("negate_condition",)).families == ("negate_condition",)
    with pytest.raises(ConfigError, match=r"unknown mutation family negate;.*negate_condition"):
        SynthConfig(families=("negate",))
    with pytest.raises(ConfigError, match="no family; the families are"):
        SynthConfig(families=())
