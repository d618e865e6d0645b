"""A file viewer and editor for the model: view, create, str_replace, insert, undo_edit.

Files are read and written through ``Sandbox.read_file``/``write_file``; every change pushes
the previous contents onto a per-file history (per sandbox), which ``undo_edit`` pops.
``str_replace`` edits only when ``old_str`` occurs exactly once, so an edit never lands in a
place the model did not mean; the errors say how many matches there were and where.
"""

from __future__ import annotations

from typing import Literal

from agentrl.errors import ToolError
from agentrl.sandbox import Sandbox
from agentrl.tool import tool
from tools._state import clip, state_of

SNIPPET_LINES = 4
MAX_HISTORY = 20
Command = Literal["view", "create", "str_replace", "insert", "undo_edit"]


class EditorError(ToolError):
    """A request the editor cannot carry out; the message is for the model."""


def numbered(text: str, start: int = 1) -> str:
    return "\n".join(f"{i:6}\t{line}" for i, line in enumerate(text.split("\n"), start))


async def _read_text(sandbox: Sandbox, path: str) -> str:
    data = await sandbox.read_file(path)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise EditorError(f"{path} is not UTF-8 text; inspect it with bash instead") from None


async def _write(sandbox: Sandbox, path: str, text: str, old: bytes | None) -> None:
    history = state_of(sandbox).history.setdefault(path, [])
    history.append(old)
    del history[:-MAX_HISTORY]
    await sandbox.write_file(path, text.encode("utf-8"))


def _snippet(text: str, first_line: int, n_lines: int) -> str:
    lines = text.split("\n")
    lo = max(first_line - 1 - SNIPPET_LINES, 0)
    hi = min(first_line - 1 + n_lines + SNIPPET_LINES, len(lines))
    return numbered("\n".join(lines[lo:hi]), lo + 1)


async def view(sandbox: Sandbox, path: str, view_range: list[int] | None) -> str:
    r = await sandbox.exec(["test", "-d", path], timeout_s=30)
    if r.exit_code == 0:
        listing = await sandbox.exec(
            ["find", path, "-maxdepth", "2", "-not", "-path", "*/.*"], timeout_s=30
        )
        return f"Files and directories up to 2 levels deep in {path}:\n{clip(listing.stdout)}"
    text = await _read_text(sandbox, path)
    if not view_range:
        return clip(numbered(text))
    n = len(text.split("\n"))
    if len(view_range) != 2:
        raise EditorError(f"view_range must be [start, end], got {view_range}")
    start, end = view_range
    end = n if end == -1 else end
    if not 1 <= start <= n or not start <= end <= n:
        raise EditorError(
            f"view_range {view_range} is outside the file's lines [1, {n}]; "
            "use [start, -1] to read to the end"
        )
    return clip(numbered("\n".join(text.split("\n")[start - 1 : end]), start))


async def str_replace(sandbox: Sandbox, path: str, old_str: str, new_str: str) -> str:
    text = await _read_text(sandbox, path)
    count = text.count(old_str) if old_str else 0
    if count == 0:
        raise EditorError(
            f"no replacement was made: old_str does not appear verbatim in {path} "
            "(check whitespace and indentation; view the file first)"
        )
    if count > 1:
        lines, pos = [], text.find(old_str)
        while pos != -1:
            lines.append(text.count("\n", 0, pos) + 1)
            pos = text.find(old_str, pos + 1)
        raise EditorError(
            f"no replacement was made: old_str occurs {count} times in {path} "
            f"(lines {lines[:10]}); include more surrounding lines to make it unique"
        )
    first_line = text.count("\n", 0, text.find(old_str)) + 1
    new_text = text.replace(old_str, new_str, 1)
    await _write(sandbox, path, new_text, text.encode("utf-8"))
    snippet = _snippet(new_text, first_line, new_str.count("\n") + 1)
    return f"Edited {path}. The changed region:\n{snippet}"


async def insert(sandbox: Sandbox, path: str, insert_line: int, new_str: str) -> str:
    text = await _read_text(sandbox, path)
    lines = text.split("\n")
    if not 0 <= insert_line <= len(lines):
        raise EditorError(f"insert_line {insert_line} is outside [0, {len(lines)}] for {path}")
    new_lines = new_str.split("\n")
    new_text = "\n".join(lines[:insert_line] + new_lines + lines[insert_line:])
    await _write(sandbox, path, new_text, text.encode("utf-8"))
    snippet = _snippet(new_text, insert_line + 1, len(new_lines))
    return f"Inserted {len(new_lines)} line(s) after line {insert_line} of {path}:\n{snippet}"


async def create(sandbox: Sandbox, path: str, file_text: str) -> str:
    try:
        old: bytes | None = await sandbox.read_file(path)
    except FileNotFoundError:
        old = None
    await _write(sandbox, path, file_text, old)
    verb = "Overwrote" if old is not None else "Created"
    return f"{verb} {path} ({file_text.count(chr(10)) + 1} lines)."


async def undo_edit(sandbox: Sandbox, path: str) -> str:
    history = state_of(sandbox).history.get(path)
    if not history:
        raise EditorError(f"there is no edit of {path} to undo")
    old = history.pop()
    if old is None:
        await sandbox.exec(["rm", "-f", "--", path], timeout_s=30)
        return f"Undid the creation of {path}; it no longer exists."
    await sandbox.write_file(path, old)
    return f"Restored {path} to its previous contents:\n{clip(numbered(old.decode('utf-8', 'replace')))}"


def _need(value: str | int | None, name: str, command: str) -> None:
    if value is None:
        raise EditorError(f"command {command!r} needs the parameter {name!r}")


@tool(inject=("sandbox",))
async def str_replace_editor(
    command: Command,
    path: str,
    sandbox: Sandbox,
    file_text: str | None = None,
    old_str: str | None = None,
    new_str: str | None = None,
    insert_line: int | None = None,
    view_range: list[int] | None = None,
) -> str:
    """View, create and edit files. Paths may be absolute or relative to the workspace.

    Args:
        command: "view" (a file with line numbers, or a directory listing), "create" (write
            file_text), "str_replace" (replace old_str, which must occur exactly once, by
            new_str), "insert" (new_str after line insert_line; 0 = top) or "undo_edit"
            (revert the last change to path).
        path: The file or directory, e.g. "src/app.py".
        file_text: The whole file, for "create".
        old_str: The exact text to replace, for "str_replace" (include enough lines to be unique).
        new_str: The replacement ("str_replace", default empty) or the text to insert ("insert").
        insert_line: For "insert": the line after which new_str goes.
        view_range: For "view" of a file: [start, end] line numbers, 1-based; end -1 means EOF.
    """
    path = sandbox.resolve(path)
    if command == "view":
        return await view(sandbox, path, view_range)
    if command == "create":
        _need(file_text, "file_text", command)
        return await create(sandbox, path, file_text or "")
    if command == "str_replace":
        _need(old_str, "old_str", command)
        return await str_replace(sandbox, path, old_str or "", new_str or "")
    if command == "insert":
        _need(insert_line, "insert_line", command)
        _need(new_str, "new_str", command)
        return await insert(sandbox, path, int(insert_line or 0), new_str or "")
    return await undo_edit(sandbox, path)
