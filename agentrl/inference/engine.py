"""Deprecated: the embedded server's batching model runner is ``agentrl.inference.runner``.

It was called ``Engine``, the name of the training engine (``agentrl.engine.Engine``) too.
``Engine``, ``EngineRequest`` and ``EngineResult`` resolve here for one release, with a
DeprecationWarning; write ``ModelRunner``, ``RunnerRequest`` and ``RunnerResult``.
"""

import warnings

from agentrl.inference.runner import ModelRunner as Engine  # noqa: F401
from agentrl.inference.runner_types import RequestParams  # noqa: F401
from agentrl.inference.runner_types import RunnerRequest as EngineRequest  # noqa: F401
from agentrl.inference.runner_types import RunnerResult as EngineResult  # noqa: F401

warnings.warn(
    "agentrl.inference.engine.Engine is now agentrl.inference.runner.ModelRunner "
    "(EngineRequest/EngineResult: RunnerRequest/RunnerResult)",
    DeprecationWarning,
    stacklevel=2,
)
