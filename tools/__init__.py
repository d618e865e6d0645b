"""Built-in tools that act on a sandbox: bash, python, str_replace_editor, search, submit.

    from tools.swe import swe_toolset
    tools = swe_toolset()
    await tools.call(tool_call, sandbox=sb)

Each tool takes the sandbox as an injected argument (hidden from the model's schema). They are
registered in ``agentrl.tool.TOOLS`` by lazy import strings, so importing this package is cheap.
"""

from __future__ import annotations

from agentrl.tool import register_tool

_BUILTIN = {
    "bash": ("tools.bash:bash", "Persistent bash shell in the sandbox"),
    "python": ("tools.python:python", "Run a Python snippet in the sandbox"),
    "str_replace_editor": ("tools.editor:str_replace_editor", "View and edit files"),
    "search": ("tools.search:search", "grep/find over the workspace"),
    "submit": ("tools.submit:submit", "Submit the final answer and diff"),
}

for _name, (_spec, _desc) in _BUILTIN.items():
    register_tool(_spec, name=_name, description=_desc)
