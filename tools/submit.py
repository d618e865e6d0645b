"""Submit the final answer; in a git workspace the diff of all changes is recorded with it.

The diff is taken against ``HEAD`` with a throwaway index (``GIT_INDEX_FILE`` in /tmp), so
new files are included and the repository's own index is not touched. The env reads the
submission back with ``get_submission(sandbox)``.
"""

from __future__ import annotations

from agentrl.sandbox import Sandbox
from agentrl.tool import tool
from tools._state import Submission, get_submission, state_of

_DIFF = (
    "git rev-parse --is-inside-work-tree >/dev/null 2>&1 || exit 0; "
    'idx=$(mktemp); cp "$(git rev-parse --git-dir)/index" "$idx" 2>/dev/null; '
    'GIT_INDEX_FILE="$idx" git add -A && GIT_INDEX_FILE="$idx" git diff --cached --binary HEAD; '
    'rc=$?; rm -f "$idx"; exit $rc'
)


async def workspace_diff(sandbox: Sandbox) -> str:
    """``git diff`` of the workspace against HEAD, new files included ("" if not a repo)."""
    r = await sandbox.exec(["sh", "-c", _DIFF], timeout_s=120)
    return r.stdout if r.exit_code == 0 else ""


@tool(inject=("sandbox",))
async def submit(sandbox: Sandbox, answer: str = "") -> str:
    """Submit your work and end the task. Call this once, when you are done.

    Args:
        answer: Your final answer or a short summary of the change you made.
    """
    diff = await workspace_diff(sandbox)
    state_of(sandbox).submission = Submission(answer=answer, diff=diff)
    files = diff.count("\ndiff --git ") + diff.startswith("diff --git ")
    return f"Submitted ({files} file(s) changed)." if diff else "Submitted."


__all__ = ["Submission", "get_submission", "submit", "workspace_diff"]
