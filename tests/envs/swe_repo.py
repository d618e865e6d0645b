"""A tiny git repository with one SWE task, and its test environment (shared SWE fixtures).

``calc/ops.py`` has ``add`` returning ``a - b``; the hidden tests add ``test_add`` and
``test_add_negative`` (FAIL_TO_PASS) beside the repo's ``test_sub`` (PASS_TO_PASS).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from envs.swe.grade import RepoEnv
from envs.swe.pyenv import TestEnv, build_test_env
from envs.swe.task import SWETask
from tests.sandboxes.conftest import local_ready

needs_local = pytest.mark.skipif(local_ready() is not None, reason=str(local_ready()))

GIT_ENV = {
    "GIT_AUTHOR_NAME": "agentrl",
    "GIT_AUTHOR_EMAIL": "swe@agentrl.invalid",
    "GIT_COMMITTER_NAME": "agentrl",
    "GIT_COMMITTER_EMAIL": "swe@agentrl.invalid",
    "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z",
}
OPS = "def add(a, b):\n    return a - b\n\n\ndef sub(a, b):\n    return a - b\n"
TESTS = "from calc.ops import sub\n\n\ndef test_sub():\n    assert sub(3, 1) == 2\n"
HIDDEN = TESTS + (
    "\n\ndef test_add():\n    from calc.ops import add\n\n    assert add(2, 2) == 4\n"
    "\n\ndef test_add_negative():\n    from calc.ops import add\n\n    assert add(-1, -1) == -2\n"
)


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, **GIT_ENV}
    return subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True, env=env
    ).stdout


def diff_for(repo: Path, files: dict[str, str | None]) -> str:
    """The git diff that writes (or, for None, deletes) ``files`` in ``repo``; repo unchanged."""
    for name, text in files.items():
        p = repo / name
        if text is None:
            p.unlink()
        else:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)
    git(repo, "add", "-A")
    out = git(repo, "diff", "--cached")
    git(repo, "reset", "-q", "--hard")
    git(repo, "clean", "-qfdx")
    return out


def make_calc_repo(root: Path) -> tuple[Path, SWETask]:
    """The repository under ``root/calc-repo`` (made unless it is there) and its one task."""
    r = root / "calc-repo"
    if not (r / ".git").exists():
        shutil.rmtree(r, ignore_errors=True)
        (r / "calc").mkdir(parents=True)
        (r / "tests").mkdir()
        (r / "calc" / "__init__.py").write_text("")
        (r / "calc" / "ops.py").write_text(OPS)
        (r / "tests" / "test_ops.py").write_text(TESTS)
        git(r, "init", "-q", "-b", "main")
        git(r, "add", "-A")
        git(r, "commit", "-q", "-m", "base")
    base = git(r, "rev-parse", "HEAD").strip()
    fixed = OPS.replace("return a - b\n\n\ndef sub", "return a + b\n\n\ndef sub")
    task = SWETask(
        instance_id="calc__ops-1",
        repo="calc",
        base_commit=base,
        problem_statement="add(2, 2) returns 0",
        patch=diff_for(r, {"calc/ops.py": fixed}),
        test_patch=diff_for(r, {"tests/test_ops.py": HIDDEN}),
        fail_to_pass=("tests/test_ops.py::test_add", "tests/test_ops.py::test_add_negative"),
        pass_to_pass=("tests/test_ops.py::test_sub",),
    )
    os.chmod(root, 0o755)
    subprocess.run(["chmod", "-R", "a+rX", str(root)], check=True)
    return r, task


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, SWETask]:
    return make_calc_repo(tmp_path_factory.mktemp("swe"))


@pytest.fixture(scope="module")
def repo_test_env() -> Iterator[TestEnv]:
    if not Path("/usr/bin/python3").exists():
        pytest.skip("no system Python under /usr to build the repo's test env from")
    # not under /tmp: a sandbox has its own /tmp, which hides host paths shown there
    root = Path(tempfile.mkdtemp(prefix="agentrl-swe-env-", dir="/var/tmp"))
    os.chmod(root, 0o755)
    yield build_test_env(root / "env")
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def env(repo: tuple[Path, SWETask], repo_test_env: TestEnv) -> RepoEnv:
    t = repo_test_env
    return RepoEnv(repo_dir=str(repo[0]), python=t.python, ro_paths=(t.prefix,))
