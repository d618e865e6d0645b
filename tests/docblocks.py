"""The docs site's fenced code blocks: find them, run them, and know which ones are marked.

    page file --parse--> Block(path, line, lang, code, no_test)
    runnable("docs/guides/x.md", "python") --> its unmarked python blocks (what a test must run)
    exec_blocks(blocks, namespace)        in this process, in order, in one namespace
    run_python(blocks, cwd=tmp_path)      in a subprocess with a timeout
    run_bash(block, cwd=tmp_path, overrides={"agentrl train r.yaml": "agentrl train r.yaml train.steps=1"})

The site's pages are ``docs/**/*.md`` and the files they include with pymdownx.snippets
(``--8<-- "README.md"``). Each python and bash block on them runs in the default test suite,
through a test that calls ``runnable(<page>, <lang>)``, or carries a marker, an HTML comment
(Material leaves it out of the page) on the line right before its fence:

    <!-- no-test: trains for 2.5 minutes; tests/trainers/test_quickstart.py runs it shrunk -->
    ```bash
    agentrl train recipes/quickstart.yaml
    ```

``tests/test_docs_site.py`` fails on a block that is neither. Tracebacks from ``exec_blocks``
and ``run_python`` point at the Markdown file and line.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
_MARKER = re.compile(r"^\s*<!--\s*no-test:(?P<reason>.*?)-->\s*$")
_SNIPPET = re.compile(r'^\s*-+8<-+\s+"(?P<path>[^"]+)"\s*$')


@dataclass(frozen=True, kw_only=True)
class Block:
    """One fenced block of a Markdown file."""

    path: str
    """The file, relative to the repository root (``docs/guides/x.md``, ``README.md``)."""
    line: int
    """1-based line of the opening fence."""
    lang: str
    """The fence's language (``python``, ``bash``); empty for a bare fence."""
    code: str
    """The block's text, dedented by the fence's indentation."""
    no_test: str | None
    """The reason of a ``<!-- no-test: reason -->`` marker on the line before; None if absent."""

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


def parse(path: str | Path) -> list[Block]:
    """Every fenced block of a Markdown file, in order (indented fences in lists too)."""
    p = (ROOT / path).resolve()
    rel = p.relative_to(ROOT).as_posix() if p.is_relative_to(ROOT) else str(p)
    lines = p.read_text(encoding="utf-8").splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        indent, fence = len(m["indent"]), m["fence"]
        end = i + 1
        while end < len(lines) and not _closes(lines[end], fence):
            end += 1
        body = [
            ln[indent:] if ln[:indent].strip() == "" else ln.lstrip() for ln in lines[i + 1 : end]
        ]
        marker = _MARKER.match(lines[i - 1]) if i > 0 else None
        info = m["info"].strip()
        out.append(
            Block(
                path=rel,
                line=i + 1,
                lang=info.split()[0].lstrip("{.").rstrip("}") if info else "",
                code="\n".join(body) + "\n",
                no_test=marker["reason"].strip() if marker else None,
            )
        )
        i = end + 1
    return out


def _closes(line: str, fence: str) -> bool:
    s = line.strip()
    return s.startswith(fence[0] * len(fence)) and s.strip(fence[0]) == ""


def markers(path: str | Path) -> list[int]:
    """1-based lines of every ``no-test`` marker in a file (attached to a block or not)."""
    text = (ROOT / path).read_text(encoding="utf-8").splitlines()
    return [i + 1 for i, ln in enumerate(text) if _MARKER.match(ln)]


def site_files() -> list[str]:
    """The site's Markdown sources: docs/**/*.md and the files they include, repo-relative."""
    pages = sorted(p.relative_to(ROOT).as_posix() for p in DOCS.rglob("*.md"))
    included = []
    for page in pages:
        for ln in (ROOT / page).read_text(encoding="utf-8").splitlines():
            m = _SNIPPET.match(ln)
            if m and m["path"] not in included:
                included.append(m["path"])
    return pages + included


def blocks(page: str, lang: str) -> list[Block]:
    """The ``lang`` blocks of a page (marked ones too), in order."""
    return [b for b in parse(page) if b.lang == lang]


def runnable(page: str, lang: str) -> list[Block]:
    """The ``lang`` blocks of a page that carry no ``no-test`` marker: a test must run them.

    Call it with the page as a literal (``runnable("docs/guides/x.md", "python")``):
    tests/test_docs_site.py finds the tests that run each page's blocks by that call.
    """
    found = [b for b in blocks(page, lang) if b.no_test is None]
    if not found:
        raise AssertionError(f"{page} has no unmarked {lang} blocks; drop this runnable() call")
    return found


def exec_blocks(found: list[Block], namespace: dict[str, object]) -> None:
    """Run python blocks in order in one namespace, in this process."""
    for b in found:
        exec(compile("\n" * b.line + b.code, str(ROOT / b.path), "exec"), namespace)


_DRIVER = """
import json, sys
namespace = {"__name__": "__main__"}
for path, line, code in json.loads(sys.argv[1]):
    exec(compile("\\n" * line + code, path, "exec"), namespace)
"""


def run_python(
    found: list[Block], *, cwd: Path, timeout_s: float = 120, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run python blocks in order in one namespace, in a fresh interpreter in ``cwd``."""
    payload = json.dumps([(str(ROOT / b.path), b.line, b.code) for b in found])
    return _run([sys.executable, "-c", _DRIVER, payload], found, cwd, timeout_s, env)


def commands(block: Block) -> list[str]:
    """A bash block's commands: continuation lines joined, blank and comment lines dropped."""
    out, pending = [], ""
    for ln in block.code.splitlines():
        pending += ln.lstrip() if pending else ln
        if pending.endswith("\\"):
            pending = pending[:-1].rstrip() + " "
            continue
        if pending.strip() and not pending.lstrip().startswith("#"):
            out.append(pending.strip())
        pending = ""
    return out


def _words(command: str) -> list[str]:
    return shlex.split(command, comments=True)


def run_bash(
    block: Block,
    *,
    cwd: Path,
    overrides: dict[str, str] | None = None,
    timeout_s: float = 120,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a bash block's commands in order (``set -euo pipefail``) in ``cwd``.

    ``overrides`` maps a command as written (comments aside) to the command run instead,
    e.g. to shrink a long run; an override that matches no command is an error, so a doc edit
    cannot silently leave a shrunk command behind. The interpreter's ``bin`` comes first on
    PATH, so ``agentrl`` and ``python`` are this environment's.
    """
    todo = {tuple(_words(k)): v for k, v in (overrides or {}).items()}
    script = ["set -euo pipefail"]
    for cmd in commands(block):
        script.append(todo.pop(tuple(_words(cmd)), None) or cmd)
    if todo:
        stale = ", ".join(shlex.join(k) for k in todo)
        raise AssertionError(f"{block.where}: overrides match no command of the block: {stale}")
    return _run(["bash", "-c", "\n".join(script)], [block], cwd, timeout_s, env)


def _run(
    argv: list[str], found: list[Block], cwd: Path, timeout_s: float, env: dict[str, str] | None
) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, **(env or {})}
    full["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{full.get('PATH', '')}"
    full["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), full.get("PYTHONPATH")]))
    where = ", ".join(b.where for b in found)
    try:
        done = subprocess.run(
            argv, cwd=cwd, env=full, capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"{where} ran past {timeout_s:.0f} s") from e
    if done.returncode != 0:
        raise AssertionError(
            f"{where} failed (exit {done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
    return done
