"""Inference backends: how the client speaks to each kind of server, and how to start one.

    InferenceClient --(per server)--> Dialect.request_body(input_ids, SamplingParams) -> bytes
        POST url + Dialect.generate_path --> JSON --> Dialect.completion(...) -> Completion
    control (pause, resume, abort, reload from disk, weight version) -> Dialect methods

A dialect is the small per-backend object that builds the generate request and parses the
answer, so the rest of agentrl only ever sees a ``Completion``. Two exist:

- ``sglang`` (default): SGLang's native ``POST /generate``; the embedded server speaks it too;
- ``vllm``: vLLM's token-in/token-out ``POST /inference/v1/generate``
  (``--enable-scale-out``) and its RL control routes (``VLLM_SERVER_DEV_MODE=1``).

A server URL picks its dialect with a ``NAME+`` prefix (``"vllm+http://127.0.0.1:8000"``);
a bare URL uses ``InferenceClient.Config.backend``. Process launchers live beside the
dialects: ``backends.vllm.VLLMServer`` and ``backends.sglang.SGLangServer``.
"""

from __future__ import annotations

from agentrl.errors import ConfigError
from agentrl.inference.backends.base import Dialect

__all__ = ["DIALECTS", "Dialect", "make_dialect", "split_backend_url"]

DIALECTS = ("sglang", "vllm")
"""Dialect names; ``embedded`` is an alias of ``sglang`` (the embedded server speaks it)."""


def make_dialect(name: str) -> Dialect:
    """A fresh dialect object (each client owns its own, with its own caches)."""
    if name in ("sglang", "embedded"):
        from agentrl.inference.backends.sglang import SGLangDialect

        return SGLangDialect()
    if name == "vllm":
        from agentrl.inference.backends.vllm import VLLMDialect

        return VLLMDialect()
    raise ConfigError(
        f"unknown inference backend {name!r}; expected one of embedded, {', '.join(DIALECTS)} "
        "(as InferenceClient.Config.backend or a 'NAME+http://...' url prefix)."
    )


def split_backend_url(url: str, default: str) -> tuple[str, str]:
    """``"vllm+http://h:p/"`` -> ``("vllm", "http://h:p")``; a bare url gets ``default``."""
    head, sep, rest = url.partition("+")
    if sep and "://" in rest and "://" not in head:
        return head, rest.rstrip("/")
    return default, url.rstrip("/")
