"""Push a trainer's weights to inference servers, bucketed and versioned, and verify them.

    trainer named tensors --push(named, version, targets=None)--> [kept for lazy checksums]
        DiskWeightSync        safetensors shards in a dir -> each server reloads from disk
        HTTPTensorWeightSync  safetensors buckets over HTTP  (embedded server)
        IPCWeightSync         buckets in a memfd; the server maps it (embedded, same machine)
        SGLangWeightSync      /update_weights_from_disk, or /init_weights_update_group +
                              /update_weights_from_distributed (NCCL or gloo broadcast)
        VLLMWeightSync        /init_weight_transfer_engine, /start_weight_update,
                              /update_weights per bucket (written while the previous one
                              loads), /finish_weight_update {weight_version}
    verify(targets=None) -> every server's checksums (and weight version) == the trainer's -> bool

Every implementation is used the same way (``await sync.push(model.state_dict().items(), v)``
then ``await sync.verify()``); ``last_report`` says what was compared and ``times`` where the
seconds went (write / load / verify). ``targets`` pushes to and checks some servers only (a
restarted server catching up). Checksums are SHA-256 of the raw bytes in the serving dtype
(``Config.dtype``), computed by ``weights.py`` and ``backends/vllm.py`` on both sides, when
``verify`` asks for them. vLLM names fused parameters differently (``qkv_proj``);
``VLLMDigests`` maps the trainer's names. vLLM's CPU backend drops the unpacked copy of linear
weights after packing them for oneDNN, so those report the digest of an empty tensor: they
are counted as ``unverifiable`` (and never hashed), and ``verify`` passes when every tensor
that can be compared matches.

Modules: ``base`` (interface, checksums, reports), ``files`` (one-copy safetensors files),
``disk`` (disk and HTTP tensors), ``ipc`` (shared memory), ``sglang``, ``vllm``.
"""

from agentrl.inference.weight_sync.base import (
    EMPTY_DIGEST,
    Named,
    ServerReport,
    SyncTimes,
    Targets,
    WeightSync,
    WeightSyncConfig,
    report,
)
from agentrl.inference.weight_sync.disk import DiskWeightSync, HTTPTensorWeightSync, write_shards
from agentrl.inference.weight_sync.files import write_bucket
from agentrl.inference.weight_sync.ipc import IPCWeightSync
from agentrl.inference.weight_sync.sglang import SGLangSyncConfig, SGLangWeightSync
from agentrl.inference.weight_sync.vllm import VLLMSyncConfig, VLLMWeightSync

__all__ = [
    "EMPTY_DIGEST",
    "DiskWeightSync",
    "HTTPTensorWeightSync",
    "IPCWeightSync",
    "Named",
    "SGLangSyncConfig",
    "SGLangWeightSync",
    "ServerReport",
    "SyncTimes",
    "Targets",
    "VLLMSyncConfig",
    "VLLMWeightSync",
    "WeightSync",
    "WeightSyncConfig",
    "report",
    "write_bucket",
    "write_shards",
]
