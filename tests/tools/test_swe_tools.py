"""str_replace_editor, search, submit and swe_toolset, against a real local sandbox."""

from __future__ import annotations

import pytest

from agentrl.sandbox import Sandbox
from agentrl.tool import TOOLS, get_tool
from agentrl.types import ToolCall
from tools._state import get_submission
from tools.editor import EditorError, str_replace_editor
from tools.search import search
from tools.submit import submit
from tools.swe import close_tools, swe_toolset


async def edit(sb: Sandbox, command: str, path: str, **kw: object) -> str:
    return await str_replace_editor(command=command, path=path, sandbox=sb, **kw)  # type: ignore[no-any-return]


async def test_create_view_and_ranges(sandbox: Sandbox) -> None:
    out = await edit(sandbox, "create", "pkg/mod.py", file_text="a = 1\nb = 2\nc = 3\n")
    assert out.startswith("Created")
    assert await sandbox.read_file("pkg/mod.py") == b"a = 1\nb = 2\nc = 3\n"
    view = await edit(sandbox, "view", "pkg/mod.py")
    assert view.splitlines()[:3] == ["     1\ta = 1", "     2\tb = 2", "     3\tc = 3"]
    assert (
        await edit(sandbox, "view", "pkg/mod.py", view_range=[2, 3])
        == "     2\tb = 2\n     3\tc = 3"
    )
    assert (await edit(sandbox, "view", "pkg/mod.py", view_range=[3, -1])).startswith(
        "     3\tc = 3"
    )
    with pytest.raises(EditorError, match="outside"):
        await edit(sandbox, "view", "pkg/mod.py", view_range=[0, 99])
    listing = await edit(sandbox, "view", ".")
    assert "pkg/mod.py" in listing


async def test_str_replace_needs_exactly_one_match(sandbox: Sandbox) -> None:
    await edit(sandbox, "create", "f.py", file_text="x = 1\ny = 1\nx = 1\n")
    with pytest.raises(EditorError, match="does not appear verbatim"):
        await edit(sandbox, "str_replace", "f.py", old_str="z = 1")
    with pytest.raises(EditorError, match=r"occurs 2 times in .* \(lines \[1, 3\]\)"):
        await edit(sandbox, "str_replace", "f.py", old_str="x = 1")
    out = await edit(sandbox, "str_replace", "f.py", old_str="x = 1\ny", new_str="x = 2\ny")
    assert "     1\tx = 2" in out
    assert await sandbox.read_file("f.py") == b"x = 2\ny = 1\nx = 1\n"


async def test_insert_and_undo_history(sandbox: Sandbox) -> None:
    await edit(sandbox, "create", "g.txt", file_text="one\ntwo")
    await edit(sandbox, "insert", "g.txt", insert_line=0, new_str="zero")
    await edit(sandbox, "insert", "g.txt", insert_line=3, new_str="three")
    assert await sandbox.read_file("g.txt") == b"zero\none\ntwo\nthree"
    with pytest.raises(EditorError, match="outside"):
        await edit(sandbox, "insert", "g.txt", insert_line=99, new_str="x")
    await edit(sandbox, "undo_edit", "g.txt")
    assert await sandbox.read_file("g.txt") == b"zero\none\ntwo"
    await edit(sandbox, "undo_edit", "g.txt")
    assert await sandbox.read_file("g.txt") == b"one\ntwo"
    await edit(sandbox, "undo_edit", "g.txt")  # undoing the creation removes the file
    with pytest.raises(FileNotFoundError):
        await sandbox.read_file("g.txt")
    with pytest.raises(EditorError, match="no edit"):
        await edit(sandbox, "undo_edit", "g.txt")


async def test_editor_errors_reach_the_model_as_error_results(sandbox: Sandbox) -> None:
    tools = swe_toolset()
    call = ToolCall(name="str_replace_editor", arguments={"command": "view", "path": "missing.py"})
    r = await tools.call(call, sandbox=sandbox)
    assert r.is_error and "missing.py" in r.content
    call = ToolCall(name="str_replace_editor", arguments={"command": "explode", "path": "x"})
    r = await tools.call(call, sandbox=sandbox)
    assert r.is_error and "view" in r.content  # the schema lists the valid commands


async def test_search_content_and_files(sandbox: Sandbox) -> None:
    for i in range(30):
        await sandbox.write_file(f"src/m{i}.py", f"def handler_{i}():\n    return {i}\n")
    await sandbox.write_file("notes.txt", "def handler_in_text(): pass\n")
    out = await search(pattern=r"def handler_(1|2)\b", sandbox=sandbox, path="src")
    assert sorted(out.splitlines()) == [
        f"{sandbox.workdir}/src/m1.py:1:def handler_1():",
        f"{sandbox.workdir}/src/m2.py:1:def handler_2():",
    ]
    out = await search(pattern="handler_", sandbox=sandbox, file_glob="*.py", max_results=5)
    assert len(out.splitlines()) == 6 and "more than 5 results" in out and "notes.txt" not in out
    out = await search(pattern="m1*.py", sandbox=sandbox, mode="files")
    assert len(out.splitlines()) == 11  # m1 and m10..m19
    assert (await search(pattern="nothing_here", sandbox=sandbox)).startswith("No matches")


async def test_submit_records_answer_and_full_diff(sandbox: Sandbox) -> None:
    if (await sandbox.exec("command -v git", timeout_s=10)).exit_code != 0:
        pytest.skip("git is not installed in this sandbox's image")
    setup = (
        "git init -q . && git config user.email t@t && git config user.name t && "
        "printf 'old\\n' > a.txt && git add a.txt && git commit -qm init"
    )
    assert (await sandbox.exec(setup, timeout_s=30)).exit_code == 0
    await edit(sandbox, "str_replace", "a.txt", old_str="old", new_str="new")
    await edit(sandbox, "create", "b.txt", file_text="brand new\n")
    status_before = (await sandbox.exec("git status --porcelain", timeout_s=30)).stdout
    assert get_submission(sandbox) is None
    out = await submit(sandbox=sandbox, answer="fixed it")
    assert out == "Submitted (2 file(s) changed)."
    sub = get_submission(sandbox)
    assert sub is not None and sub.answer == "fixed it"
    assert "-old\n+new" in sub.diff and "+brand new" in sub.diff and "b.txt" in sub.diff
    assert (await sandbox.exec("git status --porcelain", timeout_s=30)).stdout == status_before


async def test_submit_outside_a_repo(sandbox: Sandbox) -> None:
    assert await submit(sandbox=sandbox) == "Submitted."
    sub = get_submission(sandbox)
    assert sub is not None and sub.diff == ""


async def test_toolset_and_registry(sandbox: Sandbox) -> None:
    tools = swe_toolset()
    assert tools.names == ["bash", "str_replace_editor", "search", "python", "submit"]
    for schema in tools.schemas():
        assert "sandbox" not in schema["function"]["parameters"]["properties"]
    assert swe_toolset(include_python=False, include_submit=False).names == [
        "bash",
        "str_replace_editor",
        "search",
    ]
    assert {"bash", "python", "search", "str_replace_editor", "submit"} <= set(TOOLS.ids())
    assert get_tool("bash") is tools["bash"]
    r = await tools.call(ToolCall(name="bash", arguments={"command": "echo hi"}), sandbox=sandbox)
    assert r.content == "hi\n"
    await close_tools(sandbox)
