"""Fixtures for the env service tests: in-process env servers on loopback."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from agentrl.chat import ChatTemplate
from agentrl.envserver.server import EnvServer
from agentrl.tiny import build_tokenizer
from tests.envserver.support import serve


@pytest.fixture(scope="session")
def chatml() -> ChatTemplate:
    return ChatTemplate(build_tokenizer())


@pytest.fixture
def env_server() -> Iterator[tuple[EnvServer, str]]:
    server, thread, url = serve()
    yield server, url
    thread.stop()
