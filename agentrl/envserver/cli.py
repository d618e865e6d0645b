"""``agentrl envs serve ID...``: serve registered envs over HTTP in this process.

    agentrl envs serve games/GuessNumber-v0 arith/Calculator-v0 --port 8780 --token "$TOKEN"

The server binds 127.0.0.1 unless ``--host`` says otherwise, and refuses a non-loopback
address without a token (``--token`` or ``AGENTRL_ENV_TOKEN``). ``--module`` imports modules
that register envs of your own first.
"""

from __future__ import annotations

import logging
from typing import Annotated

import typer

from agentrl.cli_options import Modules
from agentrl.http import SERVER_LOOP, check_bind
from agentrl.registry import import_modules

logger = logging.getLogger(__name__)

TOKEN_ENV = "AGENTRL_ENV_TOKEN"


def envs_serve(
    env_ids: Annotated[list[str], typer.Argument(help="Registered env ids to serve.")],
    host: Annotated[
        str, typer.Option(help="Address to bind; non-loopback needs --token.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8780,
    token: Annotated[
        str, typer.Option(envvar=TOKEN_ENV, help="Bearer token clients must send.")
    ] = "",
    max_sessions: Annotated[int, typer.Option(help="Envs alive at once.")] = 256,
    open_wait: Annotated[
        float, typer.Option(help="Seconds a new session waits for a slot before 503.")
    ] = 2.0,
    session_ttl: Annotated[
        float, typer.Option(help="Close sessions idle this many seconds.")
    ] = 600.0,
    step_timeout: Annotated[float, typer.Option(help="Seconds a reset or step may run.")] = 300.0,
    max_body_mb: Annotated[
        float, typer.Option(help="Largest request body; larger ones get 413 unread.")
    ] = 4.0,
    module: Modules = None,
) -> None:
    """Serve registered envs over HTTP: one env per session, its tools beside it."""
    import uvicorn

    from agentrl.env import ENVS
    from agentrl.envserver.asgi import http_protocol
    from agentrl.envserver.server import EnvServer

    check_bind(host, token, token_env=TOKEN_ENV, serves="run envs and their tools")
    import_modules(module or [])
    for env_id in env_ids:
        ENVS.spec(env_id)  # an unknown id fails now, with "did you mean"
    config = EnvServer.Config(
        env_ids=list(env_ids),
        token=token,
        max_sessions=max_sessions,
        open_wait_s=open_wait,
        session_ttl_s=session_ttl,
        step_timeout_s=step_timeout,
        max_body_bytes=int(max_body_mb * (1 << 20)),
    )
    server = EnvServer(config)
    logger.info("serving %s on http://%s:%d", ", ".join(env_ids), host, port)
    uvicorn.run(
        server.app(),
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        loop=SERVER_LOOP,
        http=http_protocol(),
        proxy_headers=False,  # nothing here reads the client's address
    )
