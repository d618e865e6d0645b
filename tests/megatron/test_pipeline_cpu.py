"""The Megatron engine with pipeline parallelism (PP=2, TP=1) on two gloo ranks, on CPU.

    pp_worker (2 spawned ranks, one decoder layer per stage) -> rank{r}_{step}.pt
    this process: the same model on one rank (TP = PP = 1) and the torch engine
        -> logprobs / entropy equal on both ranks, stage-local parameters, HF weights equal

Forward-only scoring runs Megatron's pipelined schedule (p2p sends between the stages over
gloo) and the last stage broadcasts the result; the worker answers Megatron's CUDA calls on
CPU (tests only).
"""

from __future__ import annotations

import socket
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from agentrl.engine import EngineConfig
from trainers.engines import ENGINES

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trainers"))
from test_torch_engine import make_batch

EMBED, OUTPUT = "embedding.word_embeddings.weight", "output_layer.weight"
FINAL_NORM = "decoder.final_layernorm.weight"


def _spawn(model: Path, out: Path, steps: tuple[str, ...]) -> str | None:
    """Run pp_worker on two ranks; None, or the traceback of the rank that raised."""
    import pp_worker
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    try:
        mp.start_processes(
            pp_worker.run, args=(port, str(model), str(out), steps), nprocs=2, start_method="spawn"
        )
    except mp.ProcessRaisedException as e:
        return str(e)
    return None


@pytest.fixture(scope="module")
def pipelined(
    tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, str | None]:
    """The worker's output directory after padded scoring, then named_weights / export."""
    out = tmp_path_factory.mktemp("pp")
    return out, _spawn(tiny_models["qwen2"], out, ("logprobs", "weights"))


@pytest.fixture(scope="module")
def one_rank(megatron_group: None, tiny_models: dict[str, Path]) -> dict[str, Any]:
    """Single-rank Megatron results and the torch engine's HF weights, for comparison."""
    # imported here, not at collection: megatron-core patches torch when imported
    from trainers.engines.megatron.engine import MegatronEngine

    cfg = EngineConfig(
        model_path=str(tiny_models["qwen2"]), device="cpu", role="ref", micro_batch_size=2
    )
    ours = MegatronEngine(cfg)
    ours.initialize()
    ref = ENGINES.make("torch", config=cfg)
    ref.initialize()
    logprobs, entropy = ours.compute_logprobs(make_batch(), with_entropy=True)
    return {
        "logprobs": logprobs,
        "entropy": entropy,
        "params": {n: p.detach().clone() for n, p in ours.model.named_parameters()},
        "weights": dict(ours.named_weights()),
        "hf": dict(ref.named_weights()),
    }


def _load(out: Path, step: str, error: str | None) -> list[dict[str, Any]]:
    files = [out / f"rank{r}_{step}.pt" for r in range(2)]
    if not all(f.is_file() for f in files):
        pytest.fail(f"pp_worker did not finish step {step!r}:\n{error}")
    return [torch.load(f, weights_only=False) for f in files]


def _check_logprobs(results: list[dict[str, Any]], want: dict[str, Any]) -> None:
    for res in results:
        torch.testing.assert_close(res["logprobs"], want["logprobs"], rtol=0, atol=1e-5)
        torch.testing.assert_close(res["entropy"], want["entropy"], rtol=0, atol=1e-5)


def test_pipelined_logprobs_match_one_rank(
    pipelined: tuple[Path, str | None], one_rank: dict[str, Any]
) -> None:
    """Both stages get the last stage's logprobs and entropy, equal to one rank's."""
    results = _load(pipelined[0], "logprobs", pipelined[1])
    _check_logprobs(results, one_rank)
    for key in ("logprobs", "entropy"):  # the last stage's tensors, broadcast bit for bit
        assert torch.equal(results[0][key], results[1][key]), key


def test_each_stage_holds_its_layers(
    pipelined: tuple[Path, str | None], one_rank: dict[str, Any]
) -> None:
    """Stage 0: embedding + global layer 0; stage 1: global layer 1 as local layer 0 + head."""
    first, last = _load(pipelined[0], "logprobs", pipelined[1])
    assert first["stage"] == (True, False) and last["stage"] == (False, True)
    full = one_rank["params"]
    assert EMBED in first["local"] and EMBED not in last["local"]
    assert FINAL_NORM in last["local"] and FINAL_NORM not in first["local"]
    assert OUTPUT in last["local"] and OUTPUT not in first["local"]  # tied copy on the last stage
    torch.testing.assert_close(last["local"][OUTPUT], full[EMBED], rtol=0, atol=0)
    for stage, res in enumerate((first, last)):
        layers = {n.split(".")[2] for n in res["local"] if n.startswith("decoder.layers.")}
        assert layers == {"0"}
        for name, tensor in res["local"].items():
            glob = name.replace("decoder.layers.0.", f"decoder.layers.{stage}.")
            if name != OUTPUT:
                assert torch.equal(tensor, full[glob]), name


def test_pipelined_named_weights_are_the_hf_weights(
    pipelined: tuple[Path, str | None], one_rank: dict[str, Any]
) -> None:
    """Every stage iterates the full HF weights (each tensor broadcast from its owner stage,
    received on the model's device) and export_hf writes them."""
    out, error = pipelined
    results = _load(out, "weights", error)
    want = one_rank["hf"]
    assert one_rank["weights"].keys() == want.keys()
    for res in results:
        assert res["weights"].keys() == want.keys()
        for name, tensor in want.items():
            assert torch.equal(res["weights"][name], tensor), name
    from safetensors.torch import load_file

    exported = load_file(str(out / "export" / "model.safetensors"))
    assert exported.keys() == want.keys()
    for name, tensor in want.items():
        assert torch.equal(exported[name], tensor), name


def test_pipelined_packed_logprobs_match_one_rank(
    tiny_models: dict[str, Path], tmp_path: Path, one_rank: dict[str, Any]
) -> None:
    """Packed (THD) micro-batches through the pipeline: the same logprobs as padded one-rank."""
    error = _spawn(tiny_models["qwen2"], tmp_path, ("packed",))
    _check_logprobs(_load(tmp_path, "packed", error), one_rank)
