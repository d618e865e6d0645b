"""Every python and bash block on the docs site runs in the default suite or says why not.

A test runs a page's blocks by calling ``docblocks.runnable("<page>", "<lang>")`` (see
tests/docblocks.py); this module finds those calls in tests/ and fails on any python or bash
block of a site page that no default-suite test runs and that carries no
``<!-- no-test: reason -->`` marker. It also fails on bare fences (a block without a language
would escape the check) and on markers attached to no block.
"""

from __future__ import annotations

import ast
import functools
import re
import tomllib
from pathlib import Path

import pytest

from tests import docblocks
from tests.docblocks import ROOT, Block

CHECKED = ("python", "bash")
"""Languages whose blocks must run or be marked."""
ALIASES = {
    "py": "python",
    "python3": "python",
    "pycon": "python",
    "sh": "bash",
    "shell": "bash",
    "console": "bash",
    "zsh": "bash",
}


def deselected_markers() -> set[str]:
    """Markers the default run leaves out (``-m 'not gpu and not slow ...'`` in addopts)."""
    addopts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    return set(re.findall(r"\bnot\s+(\w+)", addopts["addopts"]))


def _marks(decorators: list[ast.expr]) -> set[str]:
    names = set()
    for d in decorators:
        for node in ast.walk(d):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Attribute)
                and node.value.attr == "mark"  # pytest.mark.<name>
            ):
                names.add(node.attr)
    return names


@functools.cache
def runners() -> dict[tuple[str, str], list[str]]:
    """(page, lang) -> the default-suite tests that call ``runnable(page, lang)``."""
    skip = deselected_markers()
    found: dict[tuple[str, str], list[str]] = {}
    for path in sorted((ROOT / "tests").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        consts = {
            t.id: n.value.value
            for n in tree.body
            if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
            for t in n.targets
            if isinstance(t, ast.Name) and isinstance(n.value.value, str)
        }
        module_marks = {
            m
            for n in tree.body
            if isinstance(n, ast.Assign)
            and any(getattr(t, "id", "") == "pytestmark" for t in n.targets)
            for m in _marks([n.value])
        }
        for func in ast.walk(tree):
            if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            if (module_marks | _marks(func.decorator_list)) & skip:
                continue
            for call in ast.walk(func):
                target = _runnable_args(call, consts)
                if target is not None:
                    rel = path.relative_to(ROOT).as_posix()
                    found.setdefault(target, []).append(f"{rel}::{func.name}")
    return found


def _runnable_args(node: ast.AST, consts: dict[str, str]) -> tuple[str, str] | None:
    if not isinstance(node, ast.Call) or len(node.args) != 2:
        return None
    f = node.func
    if getattr(f, "attr", getattr(f, "id", None)) != "runnable":
        return None
    values = [
        a.value if isinstance(a, ast.Constant) else consts.get(getattr(a, "id", ""))
        for a in node.args
    ]
    page, lang = values
    return (page, lang) if isinstance(page, str) and isinstance(lang, str) else None


def site_blocks() -> list[Block]:
    return [b for f in docblocks.site_files() for b in docblocks.parse(f)]


def test_every_python_and_bash_block_runs_or_is_marked() -> None:
    run_by = runners()
    missing = [
        f"{b.where} ({b.lang})"
        for b in site_blocks()
        if b.lang in CHECKED and b.no_test is None and (b.path, b.lang) not in run_by
    ]
    assert not missing, (
        "these blocks are neither run by a default-suite test (one that calls "
        'docblocks.runnable("<page>", "<lang>")) nor marked '
        "<!-- no-test: reason --> on the line before the fence:\n  " + "\n  ".join(missing)
    )


def test_runners_name_site_pages() -> None:
    pages = set(docblocks.site_files())
    stray = {page: tests for (page, _), tests in runners().items() if page not in pages}
    assert not stray, f"runnable() names pages that are not on the site: {stray}"


def test_every_fence_names_its_language() -> None:
    problems = []
    for b in site_blocks():
        if not b.lang:
            problems.append(
                f"{b.where}: a bare fence; name the language (text for output, diagrams)"
            )
        elif b.lang in ALIASES:
            problems.append(f"{b.where}: ```{b.lang}; write ```{ALIASES[b.lang]} so it is checked")
    assert not problems, "\n".join(problems)


def test_markers_sit_on_a_checked_block_and_give_a_reason() -> None:
    problems = []
    for f in docblocks.site_files():
        attached = {b.line - 1: b for b in docblocks.parse(f) if b.no_test is not None}
        for line in docblocks.markers(f):
            b = attached.get(line)
            if b is None:
                problems.append(
                    f"{f}:{line}: a no-test marker not on the line right before a fence"
                )
            elif b.lang not in CHECKED:
                problems.append(f"{f}:{line}: a no-test marker on a {b.lang or 'bare'} block")
            elif not b.no_test:
                problems.append(f"{f}:{line}: a no-test marker without a reason")
    assert not problems, "\n".join(problems)


# ------------------------------------------------------------------ the helper itself


def test_parse_reads_indented_fences_languages_and_markers(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "Intro.\n\n"
        "<!-- no-test: needs a GPU -->\n"
        "```bash\nagentrl train r.yaml \\\n    train.steps=2   # long\n```\n\n"
        "- a list item:\n\n"
        "  ```python\n  x = 1\n\n  print(x)\n  ```\n"
        "````text\n```\n````\n"
    )
    bash, py, text = docblocks.parse(page)
    assert (bash.lang, bash.line, bash.no_test) == ("bash", 4, "needs a GPU")
    assert docblocks.commands(bash) == ["agentrl train r.yaml train.steps=2   # long"]
    assert (py.lang, py.code, py.no_test) == ("python", "x = 1\n\nprint(x)\n", None)
    assert (text.lang, text.code) == ("text", "```\n")
    assert docblocks.markers(page) == [3]


def test_run_bash_applies_overrides_and_rejects_stale_ones(tmp_path: Path) -> None:
    block = Block(
        path="x.md",
        line=1,
        lang="bash",
        code="echo one   # it's one\necho \\\n  two\n",
        no_test=None,
    )
    done = docblocks.run_bash(block, cwd=tmp_path, overrides={"echo two": "echo 2"})
    assert done.stdout.split() == ["one", "2"]
    with pytest.raises(AssertionError, match="match no command of the block: echo three"):
        docblocks.run_bash(block, cwd=tmp_path, overrides={"echo three": "true"})
    with pytest.raises(AssertionError, match=r"x\.md:1 failed \(exit 3\)"):
        docblocks.run_bash(block, cwd=tmp_path, overrides={"echo one": "exit 3"})


def test_python_tracebacks_point_at_the_markdown_line(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("Text.\n\n```python\nx = 1\nraise ValueError(x)\n```\n")
    (block,) = docblocks.parse(page)
    with pytest.raises(AssertionError, match=r'page\.md", line 5'):
        docblocks.run_python([block], cwd=tmp_path)
