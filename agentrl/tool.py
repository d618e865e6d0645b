"""Tools: typed Python functions the model can call, grouped in tool sets.

    @tool
    def calculator(expression: str) -> str:
        '''Evaluate an arithmetic expression.

        Args:
            expression: e.g. "(3 + 4) * 5".
        '''

The JSON schema comes from the signature and docstring; the model sees it through the chat
template's ``tools``. Tool-call parsing (text -> ToolCall) lives in ``agentrl/tool_parsers.py``.
"""
# CONTRACT (filled in by the tools work): Tool, tool(), ToolSet, ToolResult.
