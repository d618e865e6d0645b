"""The agentrl exception tree. Every error agentrl raises on purpose is one of these.

    AgentRLError
    ├── ConfigError                 a bad recipe, override or argument; names the key and the fix
    ├── RegistryError
    │   ├── UnknownIdError          no such id (says "did you mean ...")
    │   │   └── UnknownEnvError
    │   └── DuplicateIdError        an id registered twice
    ├── EnvError                    an env failed to reset/step  -> RolloutStatus.ERROR_ENV
    │   ├── EnvCheckError           an env failed the env checker (agentrl/env_checker.py)
    │   └── EnvServerError          an env server died, was unreachable or full (masked too)
    ├── ToolError                   a tool failed               -> an error observation
    │   └── ToolCallParseError      the model's tool call could not be parsed
    ├── SandboxError                a sandbox failed            -> RolloutStatus.ERROR_SANDBOX
    ├── InferenceError              a server failed or refused  -> RolloutStatus.ERROR_INFERENCE
    │   ├── ServerUnavailableError  no healthy server left to try
    │   ├── StreamBrokenError       a stream broke after tokens were handed out (not retried)
    │   └── AbortedError            the request was aborted (pause / partial rollout)
    ├── RewardError                 a reward function failed    -> RolloutStatus.ERROR_REWARD
    ├── TokenizationError           a chat template broke the token ledger's assumptions
    └── TrainingError               a worker or engine failed during training
        ├── WorkerDiedError         a Ray worker process died (names the rank and method)
        ├── WorkerTimeoutError      a worker call did not finish within its timeout
        └── ResourceUnavailableError  a placement group could not be reserved in time

Failures inside a rollout become a ``RolloutStatus``; these exceptions are how the parts
report them to the AgentLoop machinery, which turns them into values.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence


class AgentRLError(Exception):
    """Base class of every error agentrl raises on purpose."""


class ConfigError(AgentRLError, ValueError):
    """A bad recipe, override or argument."""


class RegistryError(AgentRLError):
    pass


class UnknownIdError(RegistryError, KeyError):
    """An id that is not registered. The message suggests close matches."""

    def __init__(
        self,
        kind: str,
        key: str,
        known: Iterable[str],
        hint: str = "",
        *,
        reason: str = "",
        suggestions: Sequence[str] | None = None,
    ) -> None:
        """``reason`` replaces the opening "no KIND 'KEY'."; ``suggestions`` replace the
        spelling-based ones (e.g. the versions of an env that exist)."""
        known = sorted(known)
        close = (
            list(suggestions)
            if suggestions is not None
            else difflib.get_close_matches(key, known, n=3, cutoff=0.6)
        )
        msg = reason or f"no {kind} {key!r}."
        if close:
            msg += " Did you mean " + " or ".join(repr(c) for c in close) + "?"
        elif known:
            msg += f" Known: {', '.join(known[:20])}{' ...' if len(known) > 20 else ''}."
        if hint:
            msg += f" {hint}"
        super().__init__(msg)
        self.key = key
        self.suggestions = close

    def __str__(self) -> str:  # KeyError quotes its message; we want it plain
        return str(self.args[0])


class UnknownEnvError(UnknownIdError):
    pass


class DuplicateIdError(RegistryError, ValueError):
    pass


class EnvError(AgentRLError):
    pass


class EnvCheckError(EnvError):
    """An env failed ``agentrl.env_checker.check_env``; the message lists the failed checks."""


class EnvServerError(EnvError):
    """An env server (``agentrl envs serve``) died, could not be reached, was full or lost the
    session: an infrastructure failure (``RolloutStatus.ERROR_ENV``, masked out of the loss),
    never a reward of 0."""


class ToolError(AgentRLError):
    pass


class ToolCallParseError(ToolError):
    pass


class SandboxError(AgentRLError):
    pass


class InferenceError(AgentRLError):
    pass


class ServerUnavailableError(InferenceError):
    pass


class StreamBrokenError(InferenceError):
    """A streamed generation broke after some tokens had been handed out. It is not retried
    elsewhere (the caller has already seen those tokens); ``output_ids`` are what arrived."""

    def __init__(self, message: str, output_ids: Sequence[int] = ()) -> None:
        super().__init__(message)
        self.output_ids = list(output_ids)


class AbortedError(InferenceError):
    pass


class RewardError(AgentRLError):
    pass


class TokenizationError(AgentRLError):
    pass


class TrainingError(AgentRLError):
    pass


class WorkerDiedError(TrainingError):
    pass


class WorkerTimeoutError(TrainingError):
    pass


class ResourceUnavailableError(TrainingError):
    pass
