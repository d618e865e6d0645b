"""MCP in and out: an MCP server's tools as a ToolSet, and a ToolSet served over MCP (stdio).

    # in: spawn an MCP server and use its tools like ours
    tools = await mcp_toolset(["npx", "-y", "@modelcontextprotocol/server-everything"])
    result = await tools.call(ToolCall(name="echo", arguments={"message": "hi"}))
    await tools.aclose()                       # or: async with await mcp_toolset(...) as tools

    # out: serve our tools to any MCP client (Claude Desktop, an IDE, mcp_toolset itself)
    python -m agentrl.mcp tools.swe:swe_toolset --sandbox local

In: ``mcp_toolset`` starts a background task that holds the MCP connection (``mcp.Client``:
a stdio subprocess for an argv or ``StdioServerParameters``, Streamable HTTP for a URL), lists
the tools and wraps each as a ``SchemaTool``. A call goes ToolCall -> ``tools/call`` ->
``CallToolResult`` -> ``ToolResult`` (text blocks joined; other blocks described; ``isError``
kept). A JSON-RPC error that blames the request (unknown tool, bad params) is an error result
for the model; a dead connection or a server-side crash raises ``SandboxError``.

Out: ``mcp_server(tools)`` is an MCP low-level ``Server`` whose ``tools/list`` is
``ToolSet.schemas()`` and whose ``tools/call`` is ``ToolSet.call``. Over stdio there is one
client per process, so ``serve_mcp`` gives that client one sandbox (when a tool takes one)
for the life of the process. Why the low-level server rather than ``FastMCP``: our tools
already carry their JSON schema and validation, so there is nothing for a decorator to add.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys
from collections.abc import Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

from agentrl.errors import ConfigError, SandboxError
from agentrl.tool import ToolResult, ToolSet
from agentrl.toolserver.client import SchemaTool
from agentrl.types import JSON, ToolCall

if TYPE_CHECKING:
    import mcp
    import mcp_types
    from mcp.server.lowlevel import Server

    from agentrl.sandbox import Sandbox

logger = logging.getLogger(__name__)

_BLAME_REQUEST = (-32602, -32601)  # INVALID_PARAMS, METHOD_NOT_FOUND


def _require_mcp() -> None:
    try:
        import mcp  # noqa: F401
    except ImportError as e:
        raise ConfigError("MCP support needs the `mcp` package: pip install 'mcp>=2.3'") from e


# --- in -------------------------------------------------------------------------------------------
class MCPToolSet(ToolSet):
    """The tools of one MCP server connection. Close it with ``aclose()``."""

    def __init__(self, name: str, timeout_s: float) -> None:
        super().__init__(name=name)
        self.timeout_s = timeout_s
        self._client: mcp.Client | None = None
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()

    async def _connect(self, target: Any, connect_timeout_s: float) -> None:
        """Hold the connection in a task of its own (anyio scopes must exit where they began)."""
        from mcp import Client

        ready: asyncio.Future[list[mcp_types.Tool]] = asyncio.get_running_loop().create_future()

        async def hold() -> None:
            try:
                async with Client(target) as client:
                    self._client = client
                    tools, cursor = [], None
                    while True:
                        page = await client.list_tools(cursor=cursor)
                        tools += page.tools
                        if not (cursor := page.next_cursor):
                            break
                    ready.set_result(tools)
                    await self._stop.wait()
            except BaseException as e:
                if not ready.done():
                    ready.set_exception(
                        SandboxError(
                            f"could not connect to MCP server {target!r}: {type(e).__name__}: {e}"
                        )
                    )
                elif not isinstance(e, asyncio.CancelledError):
                    logger.warning("MCP connection to %r ended: %s", target, e)
            finally:
                self._client = None

        self._task = asyncio.get_running_loop().create_task(hold())
        try:
            async with asyncio.timeout(connect_timeout_s):
                listed = await ready
        except TimeoutError:
            raise SandboxError(
                f"MCP server {target!r} did not answer within "
                f"{connect_timeout_s:g}s (initialize + tools/list)"
            ) from None
        for t in listed:
            schema = {
                "name": t.name,
                "description": t.description or "",
                "parameters": dict(t.input_schema or {"type": "object", "properties": {}}),
            }
            self.add(SchemaTool(schema, self.call))

    async def call(self, tool_call: ToolCall, **injected: Any) -> ToolResult:
        from mcp import MCPError

        if tool_call.name not in self:
            return await super().call(tool_call)  # the unknown-tool error result
        client = self._client
        if client is None:
            raise SandboxError(f"the MCP connection of tool set {self.name!r} is closed")
        try:
            async with asyncio.timeout(self.timeout_s):
                res = await client.call_tool(tool_call.name, tool_call.arguments)
        except TimeoutError:
            return ToolResult(
                content=f"Error: tool {tool_call.name!r} timed out after {self.timeout_s:g}s.",
                is_error=True,
                metadata={"error": "timeout"},
            )
        except MCPError as e:
            if e.code in _BLAME_REQUEST:
                return ToolResult(
                    content=f"Error: {e.message}",
                    is_error=True,
                    metadata={"error": "arguments", "code": e.code},
                )
            raise SandboxError(
                f"MCP tool {tool_call.name!r} failed on the server: {e.message}"
            ) from e
        except Exception as e:  # the transport died under the call
            raise SandboxError(
                f"MCP call {tool_call.name!r} failed: {type(e).__name__}: {e}"
            ) from e
        return to_tool_result(res)

    async def aclose(self) -> None:
        self._stop.set()
        if self._task is not None and self._client is None:  # still connecting: give up now
            self._task.cancel()
        if self._task is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(self._task, 10)
            self._task = None

    async def __aenter__(self) -> MCPToolSet:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


def to_tool_result(res: mcp_types.CallToolResult) -> ToolResult:
    """An MCP ``CallToolResult`` as the ToolResult the model sees."""
    parts: list[str] = []
    for block in res.content:
        text = getattr(block, "text", None)
        kind = getattr(block, "type", "content")
        parts.append(text if isinstance(text, str) else f"[{kind} content not shown]")
    meta: JSON = {}
    if res.structured_content is not None:
        meta["structured"] = res.structured_content
    return ToolResult(content="\n".join(parts), is_error=bool(res.is_error), metadata=meta)


async def mcp_toolset(
    server: mcp.StdioServerParameters | str | Sequence[str],
    *,
    name: str = "mcp",
    timeout_s: float = 300.0,
    connect_timeout_s: float = 60.0,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
) -> MCPToolSet:
    """Connect to an MCP server and return its tools as a ToolSet.

    ``server``: an argv (``["python", "-m", "pkg.server"]``, spawned and spoken to over stdio),
    ``StdioServerParameters``, or an ``http(s)://`` URL (Streamable HTTP). ``timeout_s``
    bounds each call (then an error result), ``connect_timeout_s`` the handshake and listing.
    """
    _require_mcp()
    from mcp import StdioServerParameters

    target: Any = server
    if isinstance(server, str):
        if not server.startswith(("http://", "https://")):
            raise ConfigError(
                f"an MCP server string must be an http(s) URL, got {server!r}; "
                "pass a command as a list, e.g. ['python', '-m', 'pkg.server']"
            )
    elif not isinstance(server, StdioServerParameters):
        argv = list(server)
        if not argv:
            raise ConfigError("mcp_toolset needs a non-empty command to start the MCP server")
        target = StdioServerParameters(command=argv[0], args=argv[1:], env=env, cwd=cwd)
    tools = MCPToolSet(name, timeout_s)
    try:
        await tools._connect(target, connect_timeout_s)
    except BaseException:
        await tools.aclose()
        raise
    return tools


# --- out ------------------------------------------------------------------------------------------
def mcp_server(tools: ToolSet, *, sandbox: Sandbox | None = None) -> Server[Any]:
    """An MCP ``Server`` exposing ``tools``; sandboxed tools run in ``sandbox``."""
    _require_mcp()
    import mcp_types as types
    from mcp.server.lowlevel import Server

    injected = {"sandbox": sandbox} if sandbox is not None else {}

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(
            tools=[
                types.Tool(name=t.name, description=t.description, input_schema=t.parameters)
                for t in tools
            ]
        )

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        tc = ToolCall(name=params.name, arguments=dict(params.arguments or {}))
        res = await tools.call(tc, **injected)
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=res.content)], is_error=res.is_error
        )

    return Server(tools.name, on_list_tools=list_tools, on_call_tool=call_tool)


async def serve_mcp(
    tools: ToolSet, *, sandbox: str = "", sandbox_config: object | None = None
) -> None:
    """Serve ``tools`` over MCP on stdin/stdout until the client disconnects.

    ``sandbox``: backend for tools that take one ("" = "local" when needed, "none" = never).
    """
    _require_mcp()
    from mcp.server.stdio import stdio_server

    from agentrl.sandbox import make_sandbox

    wants = any("sandbox" in t.inject for t in tools)
    kind = sandbox or ("local" if wants else "none")
    async with contextlib.AsyncExitStack() as stack:
        sb = None
        if kind != "none":
            sb = await stack.enter_async_context(await make_sandbox(kind, sandbox_config))
        server = mcp_server(tools, sandbox=sb)
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())


def tools_mcp(factory: str, sandbox: str = "") -> None:
    """Serve a ToolSet over MCP on stdin/stdout (``agentrl tools mcp MODULE:FACTORY``).

    Args:
        factory: MODULE:TOOLSET_FACTORY, e.g. tools.swe:swe_toolset.
        sandbox: Sandbox backend for tools that take one ('' = local when needed, 'none').
    """
    from agentrl.toolserver.cli import load_toolset

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)  # stdout is the protocol
    asyncio.run(serve_mcp(load_toolset(factory), sandbox=sandbox))


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m agentrl.mcp MODULE:TOOLSET_FACTORY [--sandbox KIND]``."""
    p = argparse.ArgumentParser(prog="python -m agentrl.mcp", description=main.__doc__)
    p.add_argument("factory", help="MODULE:TOOLSET_FACTORY, e.g. tools.swe:swe_toolset")
    p.add_argument("--sandbox", default="", help="'' = local when a tool needs one; 'none'")
    a = p.parse_args(argv)
    tools_mcp(a.factory, a.sandbox)


if __name__ == "__main__":
    main()
