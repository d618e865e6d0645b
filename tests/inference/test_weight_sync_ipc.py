"""Colocated weight syncs against a real embedded server on loopback: shared memory (IPC) and
streamed HTTP tensors change what is served, verify, refuse bad input unchanged, and leave
no shared memory behind (in /dev/shm or mapped in the server)."""

from __future__ import annotations

import os
from pathlib import Path

import httpx2
import pytest
import torch
from transformers import AutoModelForCausalLM

from agentrl.errors import InferenceError
from agentrl.inference.client import InferenceClient
from agentrl.inference.launch import ServerProcess
from agentrl.inference.protocol import SamplingParams
from agentrl.inference.weight_sync import HTTPTensorWeightSync, IPCWeightSync, WeightSync
from agentrl.inference.weights import checksum_named_tensors, safetensors_bytes

PROMPT = [5, 6, 7, 8, 9]


def state(path: Path) -> dict[str, torch.Tensor]:
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).state_dict()


async def logprobs(client: InferenceClient) -> list[float]:
    done = await client.generate(PROMPT, SamplingParams(max_new_tokens=6, temperature=0))
    return done.output_logprobs


def shared_maps(pid: int | None) -> list[str]:
    """Lines of the server's memory map that map a trainer's weight buffer."""
    maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
    return [ln for ln in maps if "memfd:agentrl-weights" in ln]


def own_memfds() -> list[str]:
    """This process's open weight buffers."""
    fds = Path("/proc/self/fd")
    targets = []
    for fd in fds.iterdir():
        try:
            targets.append(os.readlink(fd))
        except OSError:  # closed while listing
            continue
    return [t for t in targets if "memfd:agentrl-weights" in t]


def shm_entries() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


@pytest.mark.parametrize("kind", ["ipc", "tensors"])
async def test_push_serves_new_weights_and_verifies(
    server: ServerProcess, tiny_model: Path, tiny_model_b: Path, kind: str
) -> None:
    a, b = state(tiny_model), state(tiny_model_b)
    before = shm_entries()
    async with InferenceClient([server.url]) as client:
        cfg = WeightSync.Config(bucket_bytes=32 << 10)  # several buckets
        sync = IPCWeightSync(client, cfg) if kind == "ipc" else HTTPTensorWeightSync(client, cfg)
        await sync.push(a.items(), version=1)
        assert await sync.verify()
        on_a = await logprobs(client)
        await sync.push(b.items(), version=2)
        assert await sync.verify()
        report = sync.last_report[server.url]
        assert report.matched == len(b) and report.version == 2 and not report.mismatched
        assert await logprobs(client) != on_a
        served = (await client.weights_checksum())[server.url]
        assert served.overall == checksum_named_tensors(b.items()).overall
        assert served.weight_version == 2
        assert not shared_maps(server.pid)  # the server dropped its mapping after the copy
        await sync.close()
    assert shm_entries() == before and not own_memfds()


async def test_ipc_refuses_bad_input_and_changes_nothing(
    server: ServerProcess, tiny_model: Path, tmp_path: Path
) -> None:
    a = state(tiny_model)
    async with InferenceClient([server.url]) as client:
        sync = IPCWeightSync(client)
        await sync.push(a.items(), version=7)
        want = (await client.weights_checksum())[server.url].overall
        name = next(n for n in a if "layernorm" in n)  # not tied to another tensor
        bad = {**a, name: torch.zeros(3, 3)}
        with pytest.raises(InferenceError, match=rf"{name}: got \(3, 3\)"):
            await sync.push(bad.items(), version=8)
        with pytest.raises(InferenceError, match="not in the served model"):
            await sync.push([*a.items(), ("nope.weight", torch.ones(2))], version=8)
        with pytest.raises(InferenceError, match="lacks 1 tensor"):
            await sync.push([(n, t) for n, t in a.items() if n != name], version=8)
        assert sync.path is not None and own_memfds()
        await sync.close()
        assert sync.path is None and not own_memfds()  # the buffer is gone with the sync
        url = server.url + "/update_weights_from_ipc"
        blob = tmp_path / "blob.bin"
        data = safetensors_bytes({name: a[name]})
        blob.write_bytes(data.replace(b'"F32"', b'"Q32"'))
        cases = [
            ({"path": str(tmp_path / "missing"), "buckets": [[0, 8]]}, "no shared weights file"),
            ({"path": str(blob), "buckets": [[0, len(data) + 1]]}, "lies outside"),
            ({"path": str(blob), "buckets": [[0, len(data)]]}, "expected dtype one of"),
        ]
        for body, message in cases:
            resp = await client.http.post(url, json=body)
            assert resp.status_code == 400 and message in resp.json()["message"], resp.text
        assert (await client.http.post(url, json={"path": 3})).status_code == 400
        sums = (await client.weights_checksum())[server.url]
        assert sums.overall == want and sums.weight_version == 7  # nothing was applied
    assert not shared_maps(server.pid)


async def test_streamed_body_must_match_its_length(server: ServerProcess) -> None:
    url = server.url + "/update_weights_from_tensor"
    async with httpx2.AsyncClient() as http:
        resp = await http.post(url, content=b"\x00" * 4, params={"flush": "0"})
        assert resp.status_code == 400 and "not a safetensors blob" in resp.text
