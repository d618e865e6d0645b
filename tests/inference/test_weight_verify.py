"""Weight verification catches one changed element: ``sum64`` word sums (units), and
``WeightSync.verify`` against a real bfloat16 embedded server on loopback, where one element
of one served tensor is flipped by the server's own update endpoint after a verified sync."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
import torch
from transformers import AutoModelForCausalLM

from agentrl.inference.client import InferenceClient
from agentrl.inference.launch import ServerProcess
from agentrl.inference.weight_sync import HTTPTensorWeightSync, IPCWeightSync, WeightSync
from agentrl.inference.weights import (
    ChecksumKind,
    checksum_named_tensors,
    safetensors_bytes,
    tensor_checksum,
    tensor_sum64,
    word_sum,
)


def reference_word_sum(data: bytes) -> int:
    data += b"\0" * (-len(data) % 8)
    words = (int.from_bytes(data[i : i + 8], "little") for i in range(0, len(data), 8))
    return sum(words) % (1 << 64)


@pytest.mark.parametrize("nbytes", [0, 5, 8, 8 * 1001, 8 * 1001 + 3])
def test_word_sum_is_the_wrapping_sum_of_little_endian_words(nbytes: int) -> None:
    data = torch.randint(0, 256, (nbytes,), dtype=torch.uint8)
    data[::7] = 255  # plenty of carries: the sum wraps many times
    assert word_sum(data) == reference_word_sum(data.numpy().tobytes())
    # Any start offset (an unaligned view) gives the same sum as an aligned copy.
    assert word_sum(data[3:]) == reference_word_sum(data[3:].numpy().tobytes())


def test_sum64_detects_every_single_bit_flip_of_any_element() -> None:
    for t in (
        torch.randn(9, 7).to(torch.bfloat16),
        torch.randn(5),
        torch.arange(3, dtype=torch.int8),
    ):
        base = tensor_sum64(t)
        width = t.element_size() * 8
        ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()]
        for i in range(t.numel()):
            for bit in range(width):
                flipped = t.clone()
                cell = flipped.reshape(-1).view(ints)[i : i + 1]
                cell.copy_(cell ^ torch.tensor(1, dtype=ints).bitwise_left_shift(bit))
                assert tensor_sum64(flipped) != base, (t.dtype, i, bit)
    assert tensor_sum64(torch.zeros(3)) != tensor_sum64(torch.zeros(4))  # lengths count too


def test_sum64_checksums_agree_across_dtypes_casts_and_layouts() -> None:
    w = torch.randn(6, 10)
    named = [("w", w), ("wt", w.t())]  # a non-contiguous view is summed in C order
    got = checksum_named_tensors(named, dtype=torch.bfloat16, kind="sum64")
    assert got.kind == "sum64" and got.dtype == "bfloat16"
    assert got.tensors["wt"] == tensor_checksum(w.t().contiguous().to(torch.bfloat16), "sum64")
    assert got == checksum_named_tensors(named, dtype=torch.bfloat16, kind="sum64", threads=3)


@pytest.fixture(scope="module")
def bf16_server(
    tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("logs") / "server-bf16.log"
    cfg = ServerProcess.Config(
        model=str(tiny_model), dtype="bfloat16", log_path=str(log), num_threads=1
    )
    with ServerProcess(cfg) as proc:
        yield proc


async def put_on_server(http: httpx2.AsyncClient, url: str, name: str, t: torch.Tensor) -> None:
    """Overwrite one served tensor through the server's update endpoint, keeping version 1."""
    resp = await http.post(
        url + "/update_weights_from_tensor",
        params={"flush": 1, "weight_version": 1},
        content=safetensors_bytes({name: t}),
        headers={"content-type": "application/octet-stream"},
    )
    assert resp.status_code == 200 and resp.json()["success"], resp.text


@pytest.mark.parametrize(
    ("path", "checksum"),
    [("ipc", "sum64"), ("ipc-eager", "sum64"), ("tensors", "sum64"), ("ipc", "sha256")],
)
async def test_verify_fails_when_one_bf16_element_of_any_served_tensor_changes(
    bf16_server: ServerProcess, tiny_model: Path, path: str, checksum: ChecksumKind
) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    named = model.state_dict()
    url = bf16_server.url
    async with InferenceClient([url]) as client:
        cfg = WeightSync.Config(
            dtype="bfloat16",
            checksum=checksum,
            bucket_bytes=32 << 10,
            eager_checksums=path == "ipc-eager",
        )  # summed while copying
        ipc = path.startswith("ipc")
        sync = IPCWeightSync(client, cfg) if ipc else HTTPTensorWeightSync(client, cfg)
        await sync.push(named.items(), version=1)
        assert await sync.verify()
        gen = torch.Generator().manual_seed(0)
        for name, tensor in named.items():
            served = tensor.to(torch.bfloat16)
            flipped = served.clone()
            i = int(torch.randint(served.numel(), (1,), generator=gen))
            cell = flipped.reshape(-1).view(torch.int16)[i : i + 1]
            cell.copy_(cell ^ 1)  # the lowest mantissa bit: one ulp
            await put_on_server(client.http, url, name, flipped)
            assert not await sync.verify(), f"one element of {name} changed, verify passed"
            assert name in sync.last_report[url].mismatched
            await put_on_server(client.http, url, name, served)
            assert await sync.verify(), sync.last_report
        await sync.close()
