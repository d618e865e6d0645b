"""Answers the embedded inference server's routes share: errors, refused updates, versions.

Errors follow OpenAI's shape (``wire.error_body``), which SGLang also uses; a refused weight
update adds SGLang's ``success``/``message`` fields. The route modules (``server``,
``openai_api``, ``server_weights``, ``server_collective``) import these from here, so none of
them imports another at run time.
"""

from __future__ import annotations

from fastapi import Response

from agentrl.errors import ConfigError
from agentrl.http import json_response
from agentrl.inference.wire import error_body


def error_response(message: str, status: int = 400) -> Response:
    kind = "BadRequestError" if status < 500 else "InternalServerError"
    return json_response(error_body(message, status=status, kind=kind), status)


def update_failure(message: str, status: int = 400) -> Response:
    """The answer of a refused weight update: SGLang's ``success``/``message`` fields plus ours."""
    return json_response(
        {"success": False, "message": message, "error": {"message": message}}, status
    )


def parse_version(value: int | str | None) -> int | None:
    """A weight version sent by a client: an int, a numeric string, or None."""
    if value is None or isinstance(value, int):
        return value
    if value.lstrip("-").isdigit():
        return int(value)
    raise ConfigError(f"weight_version must be an integer, got {value!r}.")
