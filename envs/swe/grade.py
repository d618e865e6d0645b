"""Grade a model's patch the way SWE-bench does, in a fresh sandbox, from per-test outcomes.

    report = await grade(task, model_patch, RepoEnv(repo_dir="/data/repos/pkg@9f0c", python=py))
    report.reward, report.resolved, report.fail_to_pass     # 1.0, True, {"t.py::t": "passed"}

What happens (each step in a sandbox that never saw the agent):

1. The prepared repo (a git work tree) is copied into a new sandbox and checked out at
   ``task.base_commit`` (one repo can hold every task's base commit); a base commit the repo
   does not have is a broken task (``GradingError``, masked from the loss).
2. The model's patch loses every file a test run would trust: test files (the hidden test
   patch's files, ``test_*.py``, ``*_test.py``, ``tests/`` folders), ``conftest.py``, pytest and
   tool configuration (``pytest.ini``, ``tox.ini``, ``setup.cfg``, ``pyproject.toml``) and
   interpreter start-up hooks (``sitecustomize.py``, ``usercustomize.py``, ``*.pth``). What
   was dropped is listed in the report. A patch that then does not apply scores 0.
3. The hidden test patch is applied (failing to apply is a broken task: ``GradingError``).
4. ``FAIL_TO_PASS`` and ``PASS_TO_PASS`` run under pytest with
   ``PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 -p no:cacheprovider``, with a JUnit XML report written
   to a fresh directory under ``/tmp``, outside the workspace. Outcomes come from that report,
   never from the exit code: a test missing from it (the module called ``sys.exit`` on import,
   collection failed) counts as failed.
5. A canary test that must fail (a random name, in a file outside the repo) runs beside them. A
   report where it passed was forged in-process (e.g. the repo monkeypatched pytest's
   reporting); the attempt scores 0 and the report says so.

Reward: 1.0 when every FAIL_TO_PASS and PASS_TO_PASS test passed, else 0.0; with
``partial_credit`` the share of FAIL_TO_PASS tests that passed, and 0.0 if any PASS_TO_PASS
test broke. A run that exceeds ``timeout_s`` scores 0, unless the gold patch times out under
the same conditions too: then the task is too slow for the limit and it is a ``GradingError``.

Limits: the code under test runs in the same process as pytest, so a forgery that knows about
the canary could still pass. The canary, the dropped files and the fresh sandbox make the
forgeries a policy stumbles into fail; they are not a proof against a determined adversary.
"""

from __future__ import annotations

import re
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import PurePosixPath
from typing import Any, Literal

from agentrl.errors import ConfigError, RewardError
from agentrl.sandbox import Sandbox, make_sandbox, new_name
from envs.swe.task import SWETask, patch_files

Outcome = Literal["passed", "failed", "error", "skipped", "missing"]

TEST_DIRS = frozenset({"test", "tests", "testing"})
PROTECTED_NAMES = frozenset(
    {
        "conftest.py",
        "pytest.ini",
        "tox.ini",
        "setup.cfg",
        "pyproject.toml",
        "sitecustomize.py",
        "usercustomize.py",
    }
)
MAX_REPORT_BYTES = 16 << 20
_GRADE_DIR = "/tmp/agentrl-grade"
_EXIT_NOT_BASE, _EXIT_MODEL_PATCH, _EXIT_TEST_PATCH, _EXIT_NO_PYTEST = 90, 91, 92, 93


class GradingError(RewardError):
    """Grading could not judge the patch (broken task, gold patch too slow): masked, not 0."""


@dataclass(frozen=True, slots=True)
class RepoEnv:
    """A prepared repository: a git work tree at the task's base commit, and its Python.

    ``python`` is the interpreter path *inside the sandbox* that has pytest and the repo's
    dependencies; ``ro_paths`` are host paths (e.g. that environment's prefix) the local
    sandbox shows read-only beside its defaults.
    """

    repo_dir: str
    python: str = "python3"
    ro_paths: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for path in self.ro_paths:
            if PurePosixPath(path).is_relative_to("/tmp"):
                raise ConfigError(
                    f"RepoEnv.ro_paths: {path!r} is under /tmp, which a sandbox replaces with "
                    "its own; keep the environment elsewhere (e.g. /var/tmp or a data dir)"
                )

    def sandbox_options(self, kind: str = "local") -> dict[str, Any]:
        """``make_sandbox`` options showing the repo; ``ro_paths`` is a local-backend option."""
        if kind != "local":
            return {"template_dir": self.repo_dir}
        from sandboxes.local import DEFAULT_RO_PATHS

        return {"template_dir": self.repo_dir, "ro_paths": [*DEFAULT_RO_PATHS, *self.ro_paths]}


@dataclass(frozen=True, slots=True)
class GradeReport:
    """What grading found; ``to_dict`` is what a trajectory's grader report holds."""

    instance_id: str
    reward: float
    resolved: bool
    fail_to_pass: Mapping[str, Outcome]
    pass_to_pass: Mapping[str, Outcome]
    applied: bool = True
    dropped_files: tuple[str, ...] = ()
    timed_out: bool = False
    tampered: str = ""
    log_tail: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "instance_id": self.instance_id,
            "reward": self.reward,
            "resolved": self.resolved,
            "FAIL_TO_PASS": dict(self.fail_to_pass),
            "PASS_TO_PASS": dict(self.pass_to_pass),
            "applied": self.applied,
            "dropped_files": list(self.dropped_files),
            "timed_out": self.timed_out,
            "tampered": self.tampered,
            "log_tail": self.log_tail,
        }


def is_protected(path: str, test_files: frozenset[str] = frozenset()) -> bool:
    """Whether a model may not change ``path`` (a repo-relative path) for grading."""
    p = PurePosixPath(path)
    name = p.name
    return (
        path in test_files
        or name in PROTECTED_NAMES
        or name.endswith(".pth")
        or (name.startswith("test_") and name.endswith(".py"))
        or name.endswith("_test.py")
        or any(part in TEST_DIRS for part in p.parts[:-1])
        or ".git" in p.parts
    )


def split_patch(patch: str) -> list[tuple[list[str], str]]:
    """A diff as (paths, section) per file; text before the first file header is dropped.

    Sections start at ``diff --git`` headers, or, in a plain unified diff without them, at
    each ``--- `` line followed by ``+++ ``.
    """
    starts = [m.start() for m in re.finditer(r"^diff --git ", patch, re.MULTILINE)]
    if not starts:
        starts = [m.start() for m in re.finditer(r"^--- .*\n\+\+\+ ", patch, re.MULTILINE)]
    ends = [*starts[1:], len(patch)] if starts else []
    out = []
    for a, b in zip(starts, ends, strict=True):
        section = patch[a:b]
        paths = patch_files(section) or [
            _strip_prefix(m) for m in re.findall(r"^(?:---|\+\+\+) (\S+)", section, re.MULTILINE)
        ]
        out.append(([p for p in paths if p != "/dev/null"], section))
    return out


def _strip_prefix(path: str) -> str:
    return path[2:] if path.startswith(("a/", "b/")) else path


def filter_patch(patch: str, test_files: frozenset[str] = frozenset()) -> tuple[str, list[str]]:
    """``patch`` without the sections that touch protected files, and the paths dropped."""
    kept: list[str] = []
    dropped: list[str] = []
    for paths, section in split_patch(patch):
        if any(is_protected(p, test_files) for p in paths):
            dropped.extend(p for p in paths if p not in dropped)
        else:
            kept.append(section if section.endswith("\n") else section + "\n")
    return "".join(kept), dropped


async def grade(
    task: SWETask,
    model_patch: str,
    repo: RepoEnv,
    *,
    sandbox_kind: str = "local",
    sandbox_options: Mapping[str, Any] | None = None,
    timeout_s: float = 300.0,
    partial_credit: bool = False,
    check_gold_on_timeout: bool = True,
    name_prefix: str = "agentrl-grade-",
) -> GradeReport:
    """Grade ``model_patch`` (a git diff against ``task.base_commit``); see the module doc."""
    test_files = frozenset(task.test_files)
    kept, dropped = filter_patch(model_patch, test_files)
    options = {**repo.sandbox_options(sandbox_kind), **(sandbox_options or {})}
    async with await make_sandbox(sandbox_kind, name=new_name(name_prefix), **options) as sb:
        report = await _grade_in(sb, task, kept, repo.python, timeout_s, partial_credit)
    report = replace(report, dropped_files=tuple(dropped))
    if report.timed_out and check_gold_on_timeout:
        gold = await grade(
            task,
            task.patch,
            repo,
            sandbox_kind=sandbox_kind,
            sandbox_options=sandbox_options,
            timeout_s=timeout_s,
            check_gold_on_timeout=False,
            name_prefix=name_prefix,
        )
        if gold.timed_out:
            raise GradingError(
                f"{task.instance_id}: the tests did not finish in {timeout_s:g} s even with "
                "the gold patch; raise timeout_s or fix the task (not the model's fault)"
            )
    return report


async def _grade_in(
    sb: Sandbox, task: SWETask, patch: str, python: str, timeout_s: float, partial: bool
) -> GradeReport:
    iid = task.instance_id
    nonce = uuid.uuid4().hex[:16]
    work = f"{_GRADE_DIR}/{nonce}"
    await sb.write_file(f"{work}/model.diff", patch)
    await sb.write_file(f"{work}/test.diff", task.test_patch)
    canary = f"test_{nonce}"
    await sb.write_file(
        f"{work}/canary/test_canary_{nonce}.py", f"def {canary}():\n    assert False\n"
    )
    git = "git -c safe.directory='*' -c core.hooksPath=/dev/null"
    apply = f"{git} apply --whitespace=nowarn"
    prep = await sb.exec(
        f"{python} -c 'import pytest' || exit {_EXIT_NO_PYTEST}; "
        f'[ "$({git} rev-parse HEAD)" = {task.base_commit} ] || '
        f"{{ {git} checkout -q --force {task.base_commit} && {git} clean -qfdx; }} 2>/dev/null || "
        f"{{ {git} rev-parse HEAD; exit {_EXIT_NOT_BASE}; }}; "
        f"if [ -s {work}/model.diff ]; then {apply} {work}/model.diff || exit {_EXIT_MODEL_PATCH}; fi; "
        f"if [ -s {work}/test.diff ]; then {apply} {work}/test.diff || exit {_EXIT_TEST_PATCH}; fi",
        timeout_s=120,
    )
    if prep.exit_code == _EXIT_NO_PYTEST:
        raise GradingError(
            f"{iid}: {python} cannot import pytest inside the sandbox: {prep.output[-1000:]}"
            " (build the repo's environment with envs.swe.pyenv.build_test_env)"
        )
    if prep.exit_code == _EXIT_NOT_BASE:
        raise GradingError(
            f"{iid}: the prepared repo is at {prep.stdout.strip()!r}, not base_commit "
            f"{task.base_commit}; prepare it again"
        )
    if prep.exit_code == _EXIT_TEST_PATCH or (prep.exit_code != _EXIT_MODEL_PATCH and not prep.ok):
        raise GradingError(f"{iid}: the hidden test patch does not apply: {prep.output[-2000:]}")
    if prep.exit_code == _EXIT_MODEL_PATCH:
        return _report(task, {}, partial, applied=False, log_tail=prep.output[-2000:])

    tests = [*task.fail_to_pass, *task.pass_to_pass]
    argv = " ".join(_quote(t) for t in tests)
    run = await sb.exec(
        f"{python} -m pytest -p no:cacheprovider --rootdir=. -o junit_family=xunit1 "
        f"--junitxml={work}/report/junit.xml -q {argv} {work}/canary/test_canary_{nonce}.py",
        env={"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONDONTWRITEBYTECODE": "1"},
        timeout_s=timeout_s,
    )
    log_tail = run.output[-4000:]
    if run.timed_out:
        return _report(task, {}, partial, timed_out=True, log_tail=log_tail)
    try:
        xml = await sb.read_file(f"{work}/report/junit.xml")
    except Exception:  # no report: pytest died before writing one (sys.exit, segfault, kill)
        xml = b""
    outcomes = parse_junit(xml[:MAX_REPORT_BYTES])
    forged = next((o for (_, name), o in outcomes.items() if name == canary), None)
    outcomes = {k: o for k, o in outcomes.items() if k[1] != canary}
    tampered = ""
    if xml and forged not in ("failed", "error"):
        tampered = f"the canary test that must fail was reported {forged or 'missing'}"
    return _report(task, outcomes, partial, tampered=tampered, log_tail=log_tail)


def _report(
    task: SWETask,
    outcomes: Mapping[tuple[str, str], Outcome],
    partial: bool,
    **kw: Any,
) -> GradeReport:
    f2p = {t: outcomes.get(junit_key(t), "missing") for t in task.fail_to_pass}
    p2p = {t: outcomes.get(junit_key(t), "missing") for t in task.pass_to_pass}
    resolved = (
        bool(outcomes)
        and not kw.get("tampered")
        and all(o == "passed" for o in (*f2p.values(), *p2p.values()))
    )
    reward = 1.0 if resolved else 0.0
    p2p_ok = all(o == "passed" for o in p2p.values())
    if partial and not resolved and not kw.get("tampered") and p2p_ok:
        reward = sum(o == "passed" for o in f2p.values()) / len(f2p)
    return GradeReport(
        instance_id=task.instance_id,
        reward=reward,
        resolved=resolved,
        fail_to_pass=f2p,
        pass_to_pass=p2p,
        **kw,
    )


def junit_key(node_id: str) -> tuple[str, str]:
    """The (classname, name) JUnit XML gives the pytest node ``path/to/test_x.py::Cls::test[p]``."""
    path, _, rest = node_id.partition("::")
    parts = rest.split("::") if rest else [""]
    module = path[:-3] if path.endswith(".py") else path
    classname = ".".join([module.replace("/", "."), *parts[:-1]])
    return classname, parts[-1]


def parse_junit(xml: bytes) -> dict[tuple[str, str], Outcome]:
    """Outcomes by (classname, name) from a pytest JUnit XML report; {} if unreadable.

    The report is hostile input (the tested code can write files): it is size-capped by the
    caller, parsed by expat (which refuses entity expansion bombs) and read for outcomes only.
    A test that appears twice keeps its worst outcome (pytest reports a test that failed in
    teardown twice).
    """
    if not xml.strip():
        return {}
    try:
        root = ET.fromstring(xml)
    except ET.ParseError:
        return {}
    rank = {"passed": 0, "skipped": 1, "failed": 2, "error": 3}
    out: dict[tuple[str, str], Outcome] = {}
    for case in root.iter("testcase"):
        key = (case.get("classname", ""), case.get("name", ""))
        if case.find("error") is not None:
            outcome: Outcome = "error"
        elif case.find("failure") is not None:
            outcome = "failed"
        elif case.find("skipped") is not None:
            outcome = "skipped"
        else:
            outcome = "passed"
        old = out.get(key)
        if old is None or rank[outcome] > rank[old]:
            out[key] = outcome
    return out


def _quote(s: str) -> str:
    return "'" + s.replace("'", "'\\''") + "'"
