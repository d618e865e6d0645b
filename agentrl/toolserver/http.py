"""Deprecated: the shared HTTP plumbing moved to ``agentrl.http``.

``from agentrl.toolserver.http import ApiClient, ServerThread, ...`` keeps working for one
release, with a DeprecationWarning; write ``from agentrl.http import ...``.
"""

import warnings

from agentrl.http import (  # noqa: F401  # noqa: F401  # noqa: F401
    NO_DOCS,
    SERVER_LOOP,
    ApiClient,
    ApiError,
    ReplayCache,
    ServerThread,
    TokenBucket,
    api_error,
    check_bind,
    error_body,
    install_error_handlers,
)
from agentrl.toolserver.client import TOKEN_ENV  # noqa: F401

warnings.warn(
    "agentrl.toolserver.http moved to agentrl.http; import ApiClient, ServerThread and the "
    "other HTTP helpers from agentrl.http",
    DeprecationWarning,
    stacklevel=2,
)
