"""Weights in and out of a serving model: load, validate, apply, bucket and checksum.

    trainer state_dict --safetensors_bucket_parts()--> header + tensor memory --HTTP-->
        one buffer --load_safetensors_bytes()--> views --> apply_named_tensors(model)
    trainer buckets in a memfd --map_shared_buckets(path, spans)--> views --> apply (IPC)
    HF dir --load_named_tensors()--> apply_named_tensors(model)
    checksum_named_tensors(model.state_dict()) == checksum_named_tensors(trainer tensors, dtype=...)

Both sides of a weight sync use these functions, so "the server holds the trainer's weights"
is checked by comparing two strings computed by the same code. A checksum covers a tensor's
raw bytes in the serving dtype, of one of two kinds (``ChecksumKind``):

- ``sha256``: SHA-256 of the bytes (1-2 GiB/s per core), for comparing with other tools;
- ``sum64``: the bytes read as little-endian 64-bit words and summed modulo 2**64, with the
  byte count (``sum64:<nbytes>:<hex>``); one vectorised pass at memory bandwidth (~25 GiB/s
  on 2 cores here), what ``WeightSync.verify`` uses after every sync. A changed element of up
  to 8 bytes changes exactly one word, by less than 2**64 and not by 0, so the sum changes:
  any single changed element, and any change confined to one word, is detected. It is a check
  against lost, stale or misplaced updates, not a cryptographic hash: changes that cancel
  (two elements swapped, +d in one word and -d in another) pass.

The overall checksum hashes the sorted ``name:checksum`` lines (SHA-256), so it does not
depend on the order tensors were sent in.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import mmap
import os
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

import torch

from agentrl.errors import ConfigError

logger = logging.getLogger(__name__)


ChecksumKind = Literal["sha256", "sum64"]
CHECKSUM_KINDS: tuple[str, ...] = get_args(ChecksumKind)
_MASK64 = (1 << 64) - 1


@dataclass(frozen=True, kw_only=True, slots=True)
class WeightsChecksum:
    """A checksum per tensor (``kind``) and one over all of them."""

    overall: str
    tensors: dict[str, str] = field(default_factory=dict)
    dtype: str = ""
    weight_version: int = 0  # filled in when read from a server
    kind: str = "sha256"

    def to_dict(self) -> dict[str, object]:
        return {
            "checksum": self.overall,
            "tensors": self.tensors,
            "dtype": self.dtype,
            "kind": self.kind,
        }


def tensor_checksum(tensor: torch.Tensor, kind: ChecksumKind = "sha256") -> str:
    """The checksum of the tensor's bytes (C order): SHA-256 as hex, or ``tensor_sum64``."""
    if kind == "sum64":
        return tensor_sum64(tensor)
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    if flat.numel() == 0:
        return hashlib.sha256(b"").hexdigest()
    return hashlib.sha256(flat.view(torch.uint8).numpy().data).hexdigest()


def tensor_sum64(tensor: torch.Tensor) -> str:
    """``sum64:<nbytes>:<hex>``: the bytes (C order) as little-endian 64-bit words summed
    modulo 2**64 (``word_sum``), on the tensor's own device."""
    flat = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
    return sum64_digest(flat.numel(), word_sum(flat))


def sum64_digest(nbytes: int, total: int) -> str:
    return f"sum64:{nbytes}:{total & _MASK64:016x}"


def word_sum(flat: torch.Tensor) -> int:
    """Bytes (a 1-D uint8 tensor) as little-endian int64 words summed modulo 2**64; a tail of
    fewer than 8 bytes is one more word, zero-padded. Integer addition wraps and is
    associative, so the result does not depend on the order or the threads torch sums in,
    and the sums of 8-byte-aligned pieces add up to the sum of the whole."""
    n = flat.numel()
    n8 = n - n % 8
    total = 0
    if n8:
        head = flat[:n8]
        try:
            words = head.view(torch.int64)
        except RuntimeError:  # a storage offset that is not a multiple of 8
            words = head.clone().view(torch.int64)
        total = int(words.sum().item())
    if n8 < n:
        total += int.from_bytes(flat[n8:].cpu().numpy().tobytes(), "little")
    return total & _MASK64


def checksum_named_tensors(
    named: Iterable[tuple[str, torch.Tensor]],
    *,
    dtype: torch.dtype | None = None,
    threads: int = 1,
    kind: ChecksumKind = "sha256",
) -> WeightsChecksum:
    """Checksum every tensor (cast to ``dtype`` first when given, e.g. the server's dtype).
    ``sha256`` hashes in ``threads`` threads (hashlib releases the GIL); ``sum64`` ignores
    ``threads`` (torch already sums one tensor on all its threads). The same digests for any
    thread count."""
    if kind not in CHECKSUM_KINDS:
        raise ConfigError(f"checksum kind {kind!r} is not one of {CHECKSUM_KINDS}.")
    cast = [(n, t if dtype is None else t.to(dtype)) for n, t in named]
    if kind == "sha256" and threads > 1 and len(cast) > 1:
        with ThreadPoolExecutor(max_workers=threads) as pool:
            digests = list(pool.map(tensor_checksum, [t for _, t in cast]))
    else:
        digests = [tensor_checksum(t, kind) for _, t in cast]
    per = {n: d for (n, _), d in zip(cast, digests, strict=True)}
    seen_dtype = str(cast[-1][1].dtype).removeprefix("torch.") if cast else ""
    overall = hashlib.sha256("\n".join(f"{k}:{per[k]}" for k in sorted(per)).encode()).hexdigest()
    return WeightsChecksum(overall=overall, tensors=per, dtype=seen_dtype, kind=kind)


def load_named_tensors(path: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of an HF model directory (``*.safetensors``, sharded or not, else ``*.bin``)."""
    root = Path(path)
    if not root.is_dir():
        raise ConfigError(
            f"weights path {str(root)!r} is not a directory; expected a Hugging Face model dir "
            "holding *.safetensors (e.g. one written by save_pretrained)."
        )
    files = sorted(root.glob("*.safetensors"))
    if files:
        from safetensors.torch import load_file

        out: dict[str, torch.Tensor] = {}
        for f in files:
            out.update(load_file(str(f)))
        return out
    bins = sorted(root.glob("pytorch_model*.bin"))
    if not bins:
        raise ConfigError(
            f"no *.safetensors or pytorch_model*.bin in {str(root)!r}; "
            "save the model with save_pretrained(path) first."
        )
    out = {}
    for f in bins:
        out.update(torch.load(f, map_location="cpu", weights_only=True))
    return out


def validate_named_tensors(
    targets: Mapping[str, torch.Tensor], named: Mapping[str, torch.Tensor]
) -> None:
    """Raise ConfigError unless every name exists in ``targets`` with the same shape."""
    unknown = [n for n in named if n not in targets]
    if unknown:
        sample = ", ".join(sorted(targets)[:5])
        raise ConfigError(
            f"{len(unknown)} tensor name(s) not in the served model, e.g. {unknown[:3]}; "
            f"expected Hugging Face state_dict names such as {sample}. "
            "Send model.state_dict() names of the same architecture."
        )
    bad = [
        f"{n}: got {tuple(t.shape)}, expected {tuple(targets[n].shape)}"
        for n, t in named.items()
        if tuple(t.shape) != tuple(targets[n].shape)
    ]
    if bad:
        raise ConfigError(
            f"shape mismatch for {len(bad)} tensor(s): {'; '.join(bad[:3])}. "
            "The weights come from a different model configuration."
        )


def require_complete(
    targets: Mapping[str, torch.Tensor],
    named: Mapping[str, torch.Tensor],
    fix: str = "point update_weights_from_disk at a complete save_pretrained directory",
) -> None:
    """A full load must cover every tensor, except aliases of one it does cover (tied weights)."""
    given_ptrs = {targets[n].data_ptr() for n in named if n in targets}
    missing = [n for n, t in targets.items() if n not in named and t.data_ptr() not in given_ptrs]
    if missing:
        raise ConfigError(
            f"the checkpoint lacks {len(missing)} tensor(s) of the served model, e.g. {missing[:3]}; "
            f"{fix}."
        )


@torch.no_grad()
def apply_named_tensors(model: torch.nn.Module, named: Mapping[str, torch.Tensor]) -> int:
    """Copy tensors into the model in place (cast to its dtype). Validates everything first,
    so a bad update changes nothing. Returns the number of tensors copied."""
    targets = model.state_dict(keep_vars=True)
    validate_named_tensors(targets, named)
    for name, tensor in named.items():
        targets[name].data.copy_(tensor)
    return len(named)


def safetensors_buckets(
    named: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int = 256 << 20
) -> Iterator[bytes]:
    """Serialize tensors as safetensors blobs of about ``bucket_bytes`` each (at least one tensor).
    A tensor sharing storage with one already sent (tied embeddings) is skipped: the server's
    copy is tied too, so updating one updates both."""
    for parts in safetensors_bucket_parts(named, bucket_bytes):
        yield b"".join(parts)


def safetensors_bucket_parts(
    named: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int = 256 << 20
) -> Iterator[list[bytes | memoryview]]:
    """``safetensors_buckets`` without the copy: each bucket as its header followed by the
    tensors' own memory (``safetensors_parts``), to be written or sent piece by piece."""
    bucket: dict[str, torch.Tensor] = {}
    size = 0
    seen: set[tuple[int, tuple[int, ...], torch.dtype]] = set()
    for name, tensor in named:
        key = (tensor.data_ptr(), tuple(tensor.shape), tensor.dtype)
        if tensor.numel() and key in seen:
            continue
        seen.add(key)
        t = tensor.detach().to("cpu").contiguous()
        nbytes = t.numel() * t.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield _parts(bucket)
            bucket, size = {}, 0
        bucket[name] = t
        size += nbytes
    if bucket:
        yield _parts(bucket)


def _parts(tensors: Mapping[str, torch.Tensor]) -> list[bytes | memoryview]:
    parts = safetensors_parts(tensors)
    if parts is None:
        from safetensors.torch import save

        return [save(dict(tensors))]
    return parts


# torch dtype <-> safetensors dtype name (the format's spec: huggingface/safetensors README).
_ST_DTYPES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
}
_TORCH_DTYPES = {v: k for k, v in _ST_DTYPES.items()}


def safetensors_parts(tensors: Mapping[str, torch.Tensor]) -> list[bytes | memoryview] | None:
    """The pieces of the safetensors file of ``tensors`` (contiguous, CPU): the length-prefixed
    header, then each tensor's own memory (no copy). Wider dtypes first, so every tensor starts
    aligned to its element size. None if a dtype has no safetensors name here."""
    if any(t.dtype not in _ST_DTYPES for t in tensors.values()):
        return None
    order = sorted(tensors, key=lambda n: -tensors[n].element_size())
    header: dict[str, object] = {}
    parts: list[bytes | memoryview] = []
    offset = 0
    for name in order:
        t = tensors[name]
        nbytes = t.numel() * t.element_size()
        header[name] = {
            "dtype": _ST_DTYPES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + nbytes],
        }
        if nbytes:
            parts.append(t.reshape(-1).view(torch.uint8).numpy().data)
        offset += nbytes
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    return [len(head).to_bytes(8, "little") + head, *parts]


def safetensors_bytes(tensors: Mapping[str, torch.Tensor]) -> bytes:
    """The safetensors file of ``tensors`` (contiguous, CPU) as ``bytes``, copying each tensor's
    bytes once (``safetensors.torch.save`` copies twice)."""
    return b"".join(_parts(tensors))


def load_safetensors_bytes(data: bytes | bytearray | memoryview) -> dict[str, torch.Tensor]:
    """Parse one bucket into tensors that share ``data``'s memory (no copy; the server only
    copies them into its model). ``data`` may be bytes, a bytearray or a memoryview of a
    mapped file. ConfigError naming the problem if it is not a safetensors blob."""
    view = memoryview(data).cast("B")
    if not view.nbytes:
        return {}
    if view.nbytes < 8:
        raise _not_safetensors(f"{view.nbytes} bytes, shorter than the 8-byte header length")
    n = int.from_bytes(view[:8], "little")
    if n > view.nbytes - 8:
        raise _not_safetensors(f"header length {n} exceeds the {view.nbytes - 8} bytes after it")
    try:
        header = json.loads(bytes(view[8 : 8 + n]))
    except ValueError as exc:
        raise _not_safetensors(f"header is not JSON ({exc})") from exc
    if not isinstance(header, dict):
        raise _not_safetensors(f"header is a {type(header).__name__}, expected an object")
    out: dict[str, torch.Tensor] = {}
    with warnings.catch_warnings():  # read-only buffers; these tensors are never written
        warnings.simplefilter("ignore", UserWarning)
        for name, info in header.items():
            if name != "__metadata__":
                out[name] = _view(view, 8 + n, name, info)
    return out


def _not_safetensors(why: str) -> ConfigError:
    return ConfigError(
        f"weights buffer is not a safetensors blob: {why}; "
        "send bytes from agentrl.inference.weights.safetensors_buckets()."
    )


def _view(data: memoryview, base: int, name: str, info: Any) -> torch.Tensor:
    """Tensor ``name`` of a safetensors buffer: a view when aligned, else a copy."""
    try:
        dtype = _TORCH_DTYPES[info["dtype"]]
        start, end = (int(x) for x in info["data_offsets"])
        shape = [int(x) for x in info["shape"]]
    except KeyError as exc:
        raise _not_safetensors(
            f"tensor {name!r} has {info.get('dtype') if isinstance(info, dict) else info!r}; "
            f"expected dtype one of {sorted(_TORCH_DTYPES)} with shape and data_offsets"
        ) from exc
    except (TypeError, ValueError, AttributeError) as exc:
        raise _not_safetensors(f"tensor {name!r} has a malformed entry {info!r}") from exc
    size = torch.empty(0, dtype=dtype).element_size()
    count = math.prod(shape)
    if not 0 <= start <= end <= len(data) - base or end - start != count * size:
        raise _not_safetensors(
            f"tensor {name!r} ({info['dtype']} {shape}) spans bytes [{start}, {end}) of a "
            f"{len(data) - base}-byte data section; expected {count * size} bytes inside it"
        )
    if count == 0:
        return torch.empty(shape, dtype=dtype)
    if (base + start) % size:  # a writer that does not align: copy this one tensor
        return torch.frombuffer(bytearray(data[base + start : base + end]), dtype=dtype).reshape(
            shape
        )
    return torch.frombuffer(data, dtype=dtype, count=count, offset=base + start).reshape(shape)


def map_shared_buckets(path: str, spans: Sequence[tuple[int, int]]) -> dict[str, torch.Tensor]:
    """The tensors of safetensors buckets at byte ``spans`` (offset, length) of a shared-memory
    file (a trainer's memfd as ``/proc/PID/fd/N``, or a file in /dev/shm), as views of one
    read-only mapping: the caller's copy into its model is the only copy. The mapping lives
    as long as the tensors. ConfigError when the file or a span is not there."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
    except FileNotFoundError as exc:
        raise ConfigError(
            f"no shared weights file {path!r}; the trainer that wrote it must run on this "
            "machine and keep it open until the update returns (IPCWeightSync does)."
        ) from exc
    except OSError as exc:
        raise ConfigError(
            f"cannot map shared weights file {path!r} ({exc}); the server must run on the "
            "trainer's machine as the same user (else use the tensors or disk weight sync)."
        ) from exc
    view = memoryview(mm)
    out: dict[str, torch.Tensor] = {}
    for offset, length in spans:
        if offset < 0 or length < 0 or offset + length > size:
            raise ConfigError(
                f"bucket [{offset}, {offset + length}) lies outside {path!r} ({size} bytes); "
                "send the spans IPCWeightSync wrote."
            )
        named = load_safetensors_bytes(view[offset : offset + length])
        twice = sorted(set(named) & set(out))
        if twice:
            raise ConfigError(f"tensor(s) {twice[:3]} appear in more than one bucket.")
        out.update(named)
    return out
