"""The oracle's demonstration edits: the gold patch as editor replacements or sed commands.

``swe/Repo-v0`` (``SWEEnv.ademonstration``) turns the gold patch into the tool calls a model
should make. A small model copies short strings better than long ones, so the curriculum
options shorten them: ``demo_edit="line"`` replaces only the changed line, and
``demo_edit="sed"`` runs one ``sed -i '<line><expression>' <path>`` per changed line
(``"sed_listed"``: the same, its location first as ``git grep -n`` lists it), with an
expression that undoes the task's mutation family (``recipes/swe.yaml``: ``s/not (\\(.*\\))/\\1/``
for negated conditions), so the model copies a path and a line number.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from agentrl.sandbox import Sandbox


@dataclass(frozen=True, slots=True)
class SedFix:
    """One changed line of a gold patch: where it is and what it must read after the fix."""

    path: str
    line: int
    """1-based, in the buggy (base) file."""
    fixed: str
    """The line as the gold patch leaves it, indentation included."""

    def command(self, expression: str, *, listed: bool = False) -> str:
        """``sed -i '<line><expression>' <path>``; ``listed``: the location first, written as
        ``git grep -n`` lists it, ``f=<path>:<line>; sed -i "${f##*:}"'<expression>' "${f%:*}"``,
        so a model copies one listing line left to right instead of a number and then the
        path that came before it."""
        if not listed:
            return f"sed -i '{self.line}{expression}' {shlex.quote(self.path)}"
        where = shlex.quote(f"{self.path}:{self.line}")
        return f'f={where}; sed -i "${{f##*:}}"\'{expression}\' "${{f%:*}}"'


def sed_fixes(patch: str) -> list[SedFix] | None:
    """The gold patch as one ``SedFix`` per hunk, or None when a hunk changes more (or less)
    than one line, or a file is added or deleted."""
    from envs.swe.grade import split_patch

    out: list[SedFix] = []
    for paths, section in split_patch(patch):
        if not paths or "\nnew file mode" in section or "\ndeleted file mode" in section:
            return None
        heads = list(re.finditer(r"^@@ -(\d+)(?:,\d+)? \+\d+(?:,\d+)? @@[^\n]*\n", section, re.M))
        if not heads:
            return None
        for head, nxt in zip(heads, [*heads[1:], None], strict=True):
            body = section[head.end() : nxt.start() if nxt else len(section)].splitlines()
            body = [ln for ln in body if not ln.startswith("\\")]
            minus = [i for i, ln in enumerate(body) if ln[:1] == "-"]
            plus = [ln[1:] for ln in body if ln[:1] == "+"]
            if len(minus) != 1 or len(plus) != 1:
                return None
            before = sum(1 for ln in body[: minus[0]] if ln[:1] == " " or ln == "")
            out.append(SedFix(paths[-1], int(head.group(1)) + before, plus[0]))
    return out or None


async def sed_gives_the_fix(sb: Sandbox, fix: SedFix, expression: str) -> bool:
    """Whether ``expression`` at ``fix.line`` turns the line into the gold line (checked on
    sed's output, the file untouched)."""
    r = await sb.exec(
        f"sed '{fix.line}{expression}' {shlex.quote(fix.path)} | sed -n '{fix.line}p'",
        timeout_s=30,
    )
    return r.ok and r.stdout.rstrip("\n") == fix.fixed


async def editor_edits(
    sb: Sandbox, patch: str, *, lines: bool = False
) -> list[tuple[str, str | None, str, bool]]:
    """A patch as editor replacements: (path, old text, new text, False) per hunk, or (path,
    None, the file's section of the patch, False) where a hunk adds or deletes a file or its
    old text is not unique in the file. ``lines``: a hunk that changes one line becomes
    (path, old line stripped, new line stripped, True) where the old line is unique."""
    from envs.swe.grade import split_patch

    out: list[tuple[str, str | None, str, bool]] = []
    for paths, section in split_patch(patch):
        path = paths[-1] if paths else ""
        hunks = re.split(r"^@@[^\n]*@@[^\n]*\n", section, flags=re.MULTILINE)[1:]
        if not hunks or "\nnew file mode" in section or "\ndeleted file mode" in section:
            out.append((path, None, section, False))
            continue
        try:
            text = (await sb.read_file(path)).decode()
        except Exception:
            out.append((path, None, section, False))
            continue
        edits: list[tuple[str, str, bool]] = []
        for h in hunks:
            hunk = [ln for ln in h.splitlines(keepends=True) if not ln.startswith("\\")]
            minus = [ln[1:].strip() for ln in hunk if ln[:1] == "-"]
            plus = [ln[1:].strip() for ln in hunk if ln[:1] == "+"]
            if lines and len(minus) == len(plus) == 1 and minus[0] and text.count(minus[0]) == 1:
                edits.append((minus[0], plus[0], True))
                continue
            old = "".join(ln[1:] for ln in hunk if ln[:1] in (" ", "-"))
            new = "".join(ln[1:] for ln in hunk if ln[:1] in (" ", "+"))
            edits.append((old, new, False))
        if all(text.count(old) == 1 for old, _, _ in edits):
            out.extend((path, old, new, line) for old, new, line in edits)
        else:
            out.append((path, None, section, False))
    return out
