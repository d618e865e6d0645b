"""Weight-sync pieces without a server: the report's rules, lazy vLLM digests, bucket files,
safetensors views of shared buffers and threaded checksums."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from agentrl.errors import ConfigError
from agentrl.inference.backends.vllm import VLLMDigests
from agentrl.inference.weight_sync import EMPTY_DIGEST, report, write_bucket
from agentrl.inference.weight_sync.base import NamedDigests
from agentrl.inference.weights import (
    checksum_named_tensors,
    load_safetensors_bytes,
    map_shared_buckets,
    safetensors_parts,
    tensor_checksum,
)


def test_report_accepts_tied_aliases_and_blind_tensors_only() -> None:
    emb, norm = torch.randn(8, 4), torch.randn(4)
    sent = NamedDigests()
    sent.add("embed.weight", emb)
    sent.add("norm.weight", norm)
    served = {
        "embed.weight": tensor_checksum(emb),
        "norm.weight": tensor_checksum(norm),
        "lm_head.weight": tensor_checksum(emb),
    }
    r = report(served, sent, version=3, want=3)
    assert r.ok and r.matched == 3 and not r.mismatched
    # A tensor the trainer never sent that is not an alias of a matched one fails.
    r = report({**served, "extra": tensor_checksum(torch.ones(2))}, sent, version=3, want=3)
    assert not r.ok and r.mismatched == ["extra"]
    # Packed (empty) tensors are unverifiable; a stale version fails.
    r = report({**served, "norm.weight": EMPTY_DIGEST}, sent, version=2, want=3)
    assert not r.ok and r.unverifiable == 1 and r.matched == 2 and r.version == 2
    r = report({"norm.weight": tensor_checksum(norm * 2)}, sent, version=3, want=3)
    assert not r.ok and r.mismatched == ["norm.weight"]


def test_vllm_digests_hash_on_demand_and_freeze() -> None:
    q, k, v = torch.randn(4, 2), torch.randn(2, 2), torch.randn(2, 2)
    dig = VLLMDigests(torch.bfloat16)
    for name, t in [("a.q_proj.weight", q), ("a.k_proj.weight", k), ("a.v_proj.weight", v)]:
        dig.add(name, t)
    assert "a.qkv_proj.weight" in dig and "a.q_proj.weight" not in dig
    want = tensor_checksum(torch.cat([q, k, v]).to(torch.bfloat16))
    dig.freeze()  # hashes now, drops the tensors
    assert dig.get("a.qkv_proj.weight") == want and dig.digests == {"a.qkv_proj.weight": want}


def test_bucket_files_round_trip_and_are_overwritten_in_place(tmp_path: Path) -> None:
    path = tmp_path / "bucket-00000.safetensors"
    big = [
        ("w", torch.randn(64, 32, dtype=torch.bfloat16)),
        ("b", torch.randn(7)),
        ("i", torch.arange(3)),
        ("e", torch.empty(0, 4)),
    ]
    assert sorted(write_bucket(path, big)) == ["b", "e", "i", "w"]
    got = load_file(str(path))
    assert all(torch.equal(got[n], t) for n, t in big)
    size = path.stat().st_size
    small = [("w", torch.zeros(2, 2, dtype=torch.bfloat16))]
    inode = path.stat().st_ino
    write_bucket(path, small)  # a smaller layout: same file, truncated
    assert path.stat().st_ino == inode and path.stat().st_size < size
    assert torch.equal(load_file(str(path))["w"], small[0][1])


def test_safetensors_views_of_any_buffer_and_clear_errors(tmp_path: Path) -> None:
    named = {"w": torch.randn(4, 3, dtype=torch.bfloat16), "i": torch.arange(5)}
    parts = safetensors_parts(named)
    assert parts is not None
    blob = b"".join(parts)
    path = tmp_path / "two.bin"
    path.write_bytes(blob + b"\0" * (-len(blob) % 64) + blob)  # two buckets, as IPC lays them
    second = len(blob) + (-len(blob) % 64)
    with pytest.raises(ConfigError, match="more than one bucket"):
        map_shared_buckets(str(path), [(0, len(blob)), (second, len(blob))])
    got = map_shared_buckets(str(path), [(second, len(blob))])
    assert all(torch.equal(got[n], t) for n, t in named.items())
    got = load_safetensors_bytes(memoryview(bytearray(blob)))
    assert all(torch.equal(got[n], t) for n, t in named.items())
    head = len(parts[0])
    with pytest.raises(ConfigError, match="spans bytes"):
        load_safetensors_bytes(blob[:-1])  # truncated data section
    with pytest.raises(ConfigError, match="header length"):
        load_safetensors_bytes(blob[: head - 1])
    with pytest.raises(ConfigError, match="expected dtype one of"):
        load_safetensors_bytes(blob.replace(b'"BF16"', b'"BX16"'))


def test_threaded_checksums_equal_serial_ones() -> None:
    named = [(f"t{i}", torch.randn(100 + i)) for i in range(9)]
    assert checksum_named_tensors(named, threads=3) == checksum_named_tensors(named)
