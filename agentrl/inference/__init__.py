"""Inference: the token-exact HTTP contract, the client/router, the servers and weight sync."""

from agentrl.inference.protocol import Completion, Generator, SamplingParams

__all__ = ["Completion", "Generator", "SamplingParams"]
