"""Weight-sync pieces without a server: the report's rules, lazy vLLM digests, bucket files."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

from agentrl.inference.backends.vllm import VLLMDigests
from agentrl.inference.weight_sync import EMPTY_DIGEST, report, write_bucket
from agentrl.inference.weight_sync.base import NamedDigests
from agentrl.inference.weights import tensor_checksum


def test_report_accepts_tied_aliases_and_blind_tensors_only() -> None:
    emb, norm = torch.randn(8, 4), torch.randn(4)
    sent = NamedDigests()
    sent.add("embed.weight", emb)
    sent.add("norm.weight", norm)
    served = {"embed.weight": tensor_checksum(emb), "norm.weight": tensor_checksum(norm),
              "lm_head.weight": tensor_checksum(emb)}  # fmt: skip
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
    big = [("w", torch.randn(64, 32, dtype=torch.bfloat16)), ("b", torch.randn(7)),
           ("i", torch.arange(3)), ("e", torch.empty(0, 4))]  # fmt: skip
    assert sorted(write_bucket(path, big)) == ["b", "e", "i", "w"]
    got = load_file(str(path))
    assert all(torch.equal(got[n], t) for n, t in big)
    size = path.stat().st_size
    small = [("w", torch.zeros(2, 2, dtype=torch.bfloat16))]
    inode = path.stat().st_ino
    write_bucket(path, small)  # a smaller layout: same file, truncated
    assert path.stat().st_ino == inode and path.stat().st_size < size
    assert torch.equal(load_file(str(path))["w"], small[0][1])
