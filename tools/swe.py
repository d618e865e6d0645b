"""The SWE tool set: bash, python, str_replace_editor, search and submit, on one sandbox.

    tools = swe_toolset()
    result = await tools.call(tool_call, sandbox=sb)   # every tool gets the episode's sandbox
    if get_submission(sb): ...                          # the agent called submit

Call ``close_tools(sb)`` (or just close the sandbox) to end the bash session.
"""

from __future__ import annotations

from agentrl.sandbox import Sandbox
from agentrl.tool import ToolSet
from tools._state import state_of
from tools.bash import bash
from tools.editor import str_replace_editor
from tools.python import python
from tools.search import search
from tools.submit import submit


def swe_toolset(*, include_python: bool = True, include_submit: bool = True) -> ToolSet:
    """A fresh ToolSet with the built-in SWE tools (state lives per sandbox, not per set)."""
    tools = [bash, str_replace_editor, search]
    if include_python:
        tools.append(python)
    if include_submit:
        tools.append(submit)
    return ToolSet(tools, name="swe")


async def close_tools(sandbox: Sandbox) -> None:
    """Stop the bash session of ``sandbox`` (closing the sandbox does it too)."""
    st = state_of(sandbox)
    if st.bash is not None:
        await st.bash.close()
        st.bash = None
