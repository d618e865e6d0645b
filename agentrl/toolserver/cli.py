"""``agentrl tools serve MODULE:TOOLSET_FACTORY``: run a tool server in this process.

    agentrl tools serve tools.swe:swe_toolset --sandbox local --port 8770 --token "$TOKEN"

The factory is a ``ToolSet`` or a callable returning one (``load_entry_point`` resolves the
``module:attr`` string). The server binds 127.0.0.1 unless ``--host`` says otherwise, and
refuses a non-loopback address without a token (``--token`` or ``AGENTRL_TOOL_TOKEN``).
"""

from __future__ import annotations

import logging
from typing import Annotated

import typer

from agentrl.errors import ConfigError
from agentrl.http import SERVER_LOOP, check_bind
from agentrl.registry import load_entry_point
from agentrl.tool import ToolSet
from agentrl.toolserver.client import TOKEN_ENV

logger = logging.getLogger(__name__)


def load_toolset(spec: str) -> ToolSet:
    """``"module:attr"`` naming a ToolSet or a no-argument callable returning one."""
    if ":" not in spec:
        raise ConfigError(
            f"expected MODULE:TOOLSET_FACTORY (e.g. tools.swe:swe_toolset), got {spec!r}"
        )
    obj = load_entry_point(spec)
    tools = obj if isinstance(obj, ToolSet) else obj() if callable(obj) else obj
    if not isinstance(tools, ToolSet):
        raise ConfigError(f"{spec} must be a ToolSet or return one, got {type(tools).__name__}")
    return tools


def tools_serve(
    factory: Annotated[
        str, typer.Argument(help="MODULE:TOOLSET_FACTORY, e.g. tools.swe:swe_toolset")
    ],
    sandbox: Annotated[
        str,
        typer.Option(
            help="Sandbox backend per session; '' = local when a tool needs one, 'none' = never."
        ),
    ] = "",
    host: Annotated[
        str, typer.Option(help="Address to bind; non-loopback needs --token.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8770,
    token: Annotated[
        str, typer.Option(envvar=TOKEN_ENV, help="Bearer token clients must send.")
    ] = "",
    call_timeout: Annotated[float, typer.Option(help="Seconds a tool call may run.")] = 300.0,
    rate: Annotated[
        float, typer.Option(help="Calls per second per session (token bucket).")
    ] = 20.0,
    burst: Annotated[int, typer.Option(help="Calls a session may make at once.")] = 40,
    session_ttl: Annotated[
        float, typer.Option(help="Close sessions idle this many seconds.")
    ] = 1800.0,
    max_sandboxes: Annotated[int, typer.Option(help="At most this many live sandboxes.")] = 32,
    max_body_mb: Annotated[
        float, typer.Option(help="Largest request body; larger ones get 413 unread.")
    ] = 16.0,
) -> None:
    """Serve a ToolSet over HTTP: one session (and sandbox) per trajectory."""
    import uvicorn

    from agentrl.sandbox_pool import SandboxPool
    from agentrl.toolserver.server import ToolServer, build_server

    check_bind(host, token, token_env=TOKEN_ENV, serves="run tools")
    config = ToolServer.Config(
        token=token,
        sandbox=sandbox,
        call_timeout_s=call_timeout,
        rate_per_s=rate,
        burst=burst,
        session_ttl_s=session_ttl,
        pool=SandboxPool.Config(max_active=max_sandboxes),
        max_body_bytes=int(max_body_mb * (1 << 20)),
    )
    server = build_server(load_toolset(factory), config)
    logger.info("serving %r on http://%s:%d", server.tools, host, port)
    uvicorn.run(
        server.app(), host=host, port=port, log_level="warning", access_log=False, loop=SERVER_LOOP
    )
