"""Search the workspace: file contents (``grep -rnI``) or file names (``find``), capped.

``.git`` directories are skipped. At most ``max_results`` lines come back, each cut to 300
characters, with a note when there were more.
"""

from __future__ import annotations

from typing import Literal

from agentrl.errors import ToolError
from agentrl.sandbox import Sandbox
from agentrl.tool import tool

MAX_RESULTS = 200
MAX_LINE_CHARS = 300

_GREP = 'grep -rnIE --color=never --exclude-dir=.git "$@" 2>/dev/null | head -n "$LIMIT"'
_FIND = 'find "$@" -not -path "*/.git/*" 2>/dev/null | head -n "$LIMIT"'


@tool(inject=("sandbox",))
async def search(
    pattern: str,
    sandbox: Sandbox,
    path: str = ".",
    mode: Literal["content", "files"] = "content",
    file_glob: str | None = None,
    max_results: int = 50,
) -> str:
    """Search file contents for a regular expression, or file names for a glob.

    Args:
        pattern: For "content": an extended regex, e.g. "def (parse|load)_config". For
            "files": a name glob, e.g. "*test*.py".
        path: Directory (or file) to search, relative to the workspace by default.
        mode: "content" (grep -rn) or "files" (find -name).
        file_glob: For "content": only search files whose name matches, e.g. "*.py".
        max_results: Maximum number of lines to return (at most 200).
    """
    limit = min(max(int(max_results), 1), MAX_RESULTS)
    where = sandbox.resolve(path)
    if mode == "content":
        args = [*(["--include", file_glob] if file_glob else []), "-e", pattern, "--", where]
        script = _GREP
    elif mode == "files":
        args = [where, "-name", pattern]
        script = _FIND
    else:
        raise ToolError(f"mode must be 'content' or 'files', got {mode!r}")
    r = await sandbox.exec(
        ["bash", "-c", script, "search", *args], timeout_s=60, env={"LIMIT": str(limit + 1)}
    )
    if r.timed_out:
        return "[the search timed out after 60s; search a smaller path]"
    lines = [ln[:MAX_LINE_CHARS] for ln in r.stdout.splitlines()]
    if not lines:
        return f"No matches for {pattern!r} in {where}."
    more = len(lines) > limit
    out = "\n".join(lines[:limit])
    if more:
        out += f"\n[more than {limit} results; narrow the pattern or the path]"
    return out
