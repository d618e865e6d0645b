"""HTTP plumbing every agentrl server and client shares, in one place.

    guard    HttpGuard: bearer and per-session tokens checked before a body is read, body caps
    service  structured JSON errors, body parsing, replayable request ids, rate limits,
             the bind check, a uvicorn thread
    client   ApiClient: a client per event loop, bearer token, retries of transport failures
    asgi     raw-ASGI helpers for a server's hot routes below FastAPI (read the body, answer)

The tool server, the sandbox server and the embedded inference server use it; so must any
later server (the OpenAI gateway, the env service).
"""

from agentrl.http.client import ApiClient, api_error
from agentrl.http.guard import (
    SESSION_HEADER,
    BodyTooLarge,
    HttpGuard,
    Refusal,
    bearer_headers,
    header,
    is_loopback,
    tokens_equal,
)
from agentrl.http.service import (
    NO_DOCS,
    SERVER_LOOP,
    ApiError,
    ReplayCache,
    ServerThread,
    TokenBucket,
    check_bind,
    error_body,
    install_error_handlers,
    json_response,
    parse_body,
    validation_message,
)

__all__ = [
    "NO_DOCS",
    "SERVER_LOOP",
    "SESSION_HEADER",
    "ApiClient",
    "ApiError",
    "BodyTooLarge",
    "HttpGuard",
    "Refusal",
    "ReplayCache",
    "ServerThread",
    "TokenBucket",
    "api_error",
    "bearer_headers",
    "check_bind",
    "error_body",
    "header",
    "install_error_handlers",
    "is_loopback",
    "json_response",
    "parse_body",
    "tokens_equal",
    "validation_message",
]
