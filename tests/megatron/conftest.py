"""CPU fixtures for the Megatron engine's tests: an import shim and a one-process group.

Megatron-core imports a Triton kernel module at import time (MoE paged stash); CPU wheels of
torch ship without Triton, so when Triton is missing that one module is replaced by a stub
that names its exports (the kernels are never launched by a dense model). The shim lives here,
in the tests, only.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest


def _stub_triton_kernels() -> None:
    if importlib.util.find_spec("triton") is not None:
        return
    import torch  # noqa: F401  (torch first: it inspects sys.modules for Triton)

    name = "megatron.core.transformer.moe.ops.paged_stash"
    stub = types.ModuleType(name)
    stub.__dict__.update(
        GLOBAL_BLOCK_SIZE=1024, paged_stash_copy_kernel=None, paged_stash_pop_kernel=None
    )
    sys.modules.setdefault(name, stub)


if importlib.util.find_spec("megatron") is None:  # the `megatron` extra is not installed
    collect_ignore_glob = ["test_*.py"]
else:
    _stub_triton_kernels()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test here carries the `megatron` marker (run apart: `pytest -m megatron tests/megatron`)."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.megatron)


@pytest.fixture(scope="package")
def megatron_group() -> Iterator[None]:
    """torch.distributed (gloo, world size 1) and Megatron's parallel state, TP = PP = 1.

    On a machine without CUDA, ``torch.cuda.current_device`` answers "cpu" and
    ``torch.cuda.synchronize`` does nothing for the session: Megatron's rotary embedding moves
    its frequencies to the current CUDA device and its checkpoint writer synchronises CUDA.
    """
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state

    started = not dist.is_initialized()
    if started:
        from agentrl.distributed.rendezvous import init_process_group_bound

        init_process_group_bound(
            backend="gloo", master_addr="127.0.0.1", master_port=0, rank=0, world_size=1
        )
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)
    patch = pytest.MonkeyPatch()
    if not torch.cuda.is_available():
        patch.setattr(torch.cuda, "current_device", lambda: "cpu")
        patch.setattr(torch.cuda, "synchronize", lambda *args: None)
    yield
    patch.undo()
    parallel_state.destroy_model_parallel()
    if started:
        dist.destroy_process_group()


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from agentrl.tiny import make_tiny_model

    root = tmp_path_factory.mktemp("megatron_tiny")
    return {arch: make_tiny_model(root / arch, arch=arch) for arch in ("llama", "qwen2")}
