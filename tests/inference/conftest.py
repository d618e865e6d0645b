"""Shared fixtures: a tiny model built once, and one embedded server process per test module."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agentrl.inference.launch import ServerProcess
from agentrl.tiny import make_tiny_model


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("inference") / "tiny", seed=0)


@pytest.fixture(scope="session")
def tiny_model_b(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Same architecture and tokenizer as ``tiny_model``, different weights."""
    return make_tiny_model(tmp_path_factory.mktemp("inference") / "tiny_b", seed=1)


@pytest.fixture(scope="module")
def server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("logs") / "server.log"
    cfg = ServerProcess.Config(
        model=str(tiny_model), max_batch_size=32, log_path=str(log), num_threads=1
    )
    with ServerProcess(cfg) as proc:
        yield proc
