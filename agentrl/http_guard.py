"""Deprecated: the HTTP guard moved to ``agentrl.http`` (``agentrl.http.guard``).

``from agentrl.http_guard import HttpGuard`` keeps working for one release, with a
DeprecationWarning; write ``from agentrl.http import HttpGuard``.
"""

import warnings

from agentrl.http.guard import (  # noqa: F401  # noqa: F401
    SESSION_HEADER,
    BodyTooLarge,
    HttpGuard,
    Refusal,
    bearer_headers,
    header,
    is_loopback,
    tokens_equal,
)

warnings.warn(
    "agentrl.http_guard moved to agentrl.http; import HttpGuard and friends from agentrl.http",
    DeprecationWarning,
    stacklevel=2,
)
