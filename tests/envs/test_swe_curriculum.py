"""swe/Repo-v0's curriculum options: task filters, a short prompt, short demonstrations.

The filters and prompt options need no sandbox; the line-edit demonstration is checked on a
stand-in sandbox that only reads files (the replay through real sandboxes is in
tests/agents/test_swe_agent.py).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import pytest

from agentrl.errors import ConfigError
from agentrl.splits import split_of
from envs.swe.demo import editor_edits, sed_fixes
from envs.swe.env import SWEEnv, _removed_lines, select
from envs.swe.task import SWETask, load_tasks

TASKS = Path(__file__).parents[2] / "data" / "swe" / "tasks.jsonl"
FAMILY, PATTERN = ["negate_condition"], r"not \("


def test_the_negated_condition_curriculum_keeps_whole_repositories_apart() -> None:
    kept = select(load_tasks(TASKS), families=FAMILY, bug_pattern=PATTERN)
    assert {t.metadata["family"] for t in kept} == {"negate_condition"}
    assert all(any("not (" in ln for ln in _removed_lines(t.patch)) for t in kept)
    by_split = Counter(split_of(t.repo) for t in kept)
    assert by_split == {"train": 44, "eval": 18}
    train = {t.repo for t in kept if split_of(t.repo) == "train"}
    assert train.isdisjoint({t.repo for t in kept if split_of(t.repo) == "eval"})


def test_filters_compose_and_an_empty_curriculum_says_what_each_kept() -> None:
    tasks = load_tasks(TASKS)
    six = select(tasks, repos=["six"], families=["negate_condition"])
    assert six and {t.repo for t in six} == {"six"}
    with pytest.raises(ConfigError, match=r"530 tasks -> \d+ of families .* -> 0 of repos"):
        select(tasks, families=["negate_condition"], repos=["no-such-repo"])
    with pytest.raises(ConfigError, match=r"unknown mutation families.*negate"):
        select(tasks, families=["negate"])
    with pytest.raises(ConfigError, match="bug_pattern 'not \\(' is not a regex"):
        select(tasks, bug_pattern="not (")


def _env(**kw: object) -> SWEEnv:
    return SWEEnv(str(TASKS), repos_dir="/nonexistent", **kw)  # type: ignore[arg-type]


def test_prompt_options_shorten_what_the_model_reads() -> None:
    env = _env(system_prompt="Fix it.", tool_names=["bash", "submit"], max_issue_chars=50)
    assert env.system_prompt == "Fix it." and env.tools is not None
    assert env.tools.names == ["bash", "submit"]
    task = max(env.tasks, key=lambda t: len(t.problem_statement))
    text = env.issue_text(task)
    assert text.endswith("[... issue cut ...]") and len(text) < 50 + 25
    assert _env().issue_text(task) == task.problem_statement.strip()


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"tool_names": ["bash"]}, "submit included"),
        ({"tool_names": ["bash", "submit", "grep"]}, "unknown: \\['grep'\\]"),
        ({"demo_edit": "lines"}, "demo_edit must be 'hunk', 'line', 'sed' or 'sed_listed'"),
        ({"demo_edit": "sed"}, "demo_edit='sed' \\(or 'sed_listed'\\) needs demo_sed="),
        ({"demo_edit": "sed_listed"}, "needs demo_sed="),
        ({"demo_sed": "s/a/b/"}, "demo_sed is only for"),
        ({"demo_edit": "sed", "demo_sed": "s/'/b/"}, "without single"),
        ({"max_issue_chars": -1}, "max_issue_chars must be >= 0"),
    ],
)
def test_bad_curriculum_options_are_config_errors(kw: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        _env(**kw)


class _Files:
    """Only what ``editor_edits`` uses of a sandbox: reading a file."""

    def __init__(self, files: dict[str, str]) -> None:
        self.files = files

    async def read_file(self, path: str) -> bytes:
        return self.files[path].encode()


PATCH = """diff --git a/pkg/mod.py b/pkg/mod.py
--- a/pkg/mod.py
+++ b/pkg/mod.py
@@ -1,4 +1,4 @@
 def f(x):
-    if not (x):
+    if x:
         return 1
     return 2
"""


def test_a_line_demonstration_replaces_only_the_changed_line_where_it_is_unique() -> None:
    src = "def f(x):\n    if not (x):\n        return 1\n    return 2\n"
    sb = _Files({"pkg/mod.py": src})
    [line] = asyncio.run(editor_edits(sb, PATCH, lines=True))  # type: ignore[arg-type]
    assert line == ("pkg/mod.py", "if not (x):", "if x:", True)
    [hunk] = asyncio.run(editor_edits(sb, PATCH))  # type: ignore[arg-type]
    assert hunk[1] is not None and hunk[1].startswith("def f(x):\n") and hunk[3] is False
    twice = {"pkg/mod.py": src + "\n\ndef g(x):\n    if not (x):\n        return 0\n"}
    [fallback] = asyncio.run(editor_edits(_Files(twice), PATCH, lines=True))  # type: ignore[arg-type]
    assert fallback[3] is False and fallback[1] is not None and "return 1" in fallback[1]


def test_tasks_without_a_family_are_dropped_by_a_family_filter() -> None:
    row = load_tasks(TASKS)[0]
    bare = SWETask(**{**{f: getattr(row, f) for f in row.__slots__}, "metadata": {}})
    with pytest.raises(ConfigError, match="keeps no task"):
        select([bare], families=["negate_condition"])


def test_a_sed_demonstration_names_the_changed_line_and_its_gold_text() -> None:
    [fix] = sed_fixes(PATCH) or []
    assert (fix.path, fix.line, fix.fixed) == ("pkg/mod.py", 2, "    if x:")
    assert fix.command("s/not (\\(.*\\))/\\1/") == "sed -i '2s/not (\\(.*\\))/\\1/' pkg/mod.py"
    two_lines = PATCH.replace("-    if not (x):\n", "-    if not (x):\n-    pass\n")
    assert sed_fixes(two_lines.replace("@@ -1,4", "@@ -1,5")) is None
    later = PATCH.replace("@@ -1,4 +1,4 @@", "@@ -40,4 +40,4 @@")
    assert [f.line for f in sed_fixes(later) or []] == [41]


def test_a_listed_sed_demonstration_fixes_the_line_it_copied_from_the_listing(
    tmp_path: Path,
) -> None:
    """demo_edit="sed_listed": the command starts with the location as `git grep -n` lists
    it (path:line, copied left to right) and bash splits it; run for real, it fixes the
    line, and only that line."""
    import subprocess

    [fix] = sed_fixes(PATCH) or []
    expression = "s/not (\\(.*\\))/\\1/"
    command = fix.command(expression, listed=True)
    assert command.startswith("f=pkg/mod.py:2; sed -i ")
    (tmp_path / "pkg").mkdir()
    src = "def f(x):\n    if not (x):\n        return 1\n    if not (x):\n"
    (tmp_path / "pkg" / "mod.py").write_text(src)
    subprocess.run(["bash", "-c", command], cwd=tmp_path, check=True)
    fixed = (tmp_path / "pkg" / "mod.py").read_text().splitlines()
    assert fixed[1] == fix.fixed and fixed[3] == "    if not (x):"
