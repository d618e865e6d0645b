"""A tiny vision-language model, built once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

import tests.vision.picture_env  # noqa: F401 (registers test-vision/Picture-v0)
from agentrl.tiny import make_tiny_model


@pytest.fixture(scope="session")
def tiny_vlm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("vision") / "vlm", arch="qwen2_vl", seed=0)
