"""The env service's wire contract: its protocol version and request bodies.

Shared by the server (``agentrl.envserver.server``, which validates bodies against these
models) and the client (``agentrl.envserver.client``, which needs only the version and
header, and so does not import the server).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

PROTOCOL_VERSION = 2  # 2: the demonstration has its own route instead of riding on reset
"""Bumped when a route or a frame changes incompatibly; client and server must agree."""
PROTOCOL_HEADER = "X-Agentrl-Env-Protocol"


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ResetRequest(_Body):
    seed: int | None = None
    options: dict[str, Any] | None = None
    request_id: str = ""


class OpenRequest(_Body):
    env_id: str
    kwargs: dict[str, Any] = Field(default_factory=dict)
    protocol: int = PROTOCOL_VERSION
    reset: ResetRequest | None = None
    """Reset the new session in the same request (the answer is then a frame)."""
    request_id: str = ""
    """A retried open with the same id gets the first answer (no second session)."""


class SessionRef(_Body):
    id: str
    token: str = ""


class CloseRequest(_Body):
    sessions: list[SessionRef]


class StepRequest(_Body):
    action: dict[str, Any]
    request_id: str = ""


class DemonstrationRequest(_Body):
    request_id: str = ""


class ToolCallRequest(_Body):
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    id: str = ""
    request_id: str = ""
