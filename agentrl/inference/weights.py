"""Weights in and out of a serving model: load, validate, apply, bucket and checksum.

    trainer state_dict --safetensors_buckets()--> bytes --HTTP--> load_safetensors_bytes()
        --> apply_named_tensors(model)            (server, between decode steps)
    HF dir --load_named_tensors()--> apply_named_tensors(model)
    checksum_named_tensors(model.state_dict()) == checksum_named_tensors(trainer tensors, dtype=...)

Both sides of a weight sync use these functions, so "the server holds the trainer's weights"
is checked by comparing two strings computed by the same code. A checksum is the SHA-256 of a
tensor's raw bytes in the serving dtype; the overall checksum hashes the sorted
``name:checksum`` lines, so it does not depend on the order tensors were sent in.
"""

from __future__ import annotations

import hashlib
import json
import logging
import warnings
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from agentrl.errors import ConfigError

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True, slots=True)
class WeightsChecksum:
    """SHA-256 per tensor and one over all of them."""

    overall: str
    tensors: dict[str, str] = field(default_factory=dict)
    dtype: str = ""
    weight_version: int = 0  # filled in when read from a server

    def to_dict(self) -> dict[str, object]:
        return {"checksum": self.overall, "tensors": self.tensors, "dtype": self.dtype}


def tensor_checksum(tensor: torch.Tensor) -> str:
    """SHA-256 of the tensor's bytes (C order), as hex."""
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    if flat.numel() == 0:
        return hashlib.sha256(b"").hexdigest()
    return hashlib.sha256(flat.view(torch.uint8).numpy().data).hexdigest()


def checksum_named_tensors(
    named: Iterable[tuple[str, torch.Tensor]], *, dtype: torch.dtype | None = None
) -> WeightsChecksum:
    """Checksum every tensor (cast to ``dtype`` first when given, e.g. the server's dtype)."""
    per: dict[str, str] = {}
    seen_dtype = ""
    for name, tensor in named:
        t = tensor if dtype is None else tensor.to(dtype)
        seen_dtype = str(t.dtype).removeprefix("torch.")
        per[name] = tensor_checksum(t)
    overall = hashlib.sha256("\n".join(f"{k}:{per[k]}" for k in sorted(per)).encode()).hexdigest()
    return WeightsChecksum(overall=overall, tensors=per, dtype=seen_dtype)


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
    targets: Mapping[str, torch.Tensor], named: Mapping[str, torch.Tensor]
) -> None:
    """A full load must cover every tensor, except aliases of one it does cover (tied weights)."""
    given_ptrs = {targets[n].data_ptr() for n in named if n in targets}
    missing = [n for n, t in targets.items() if n not in named and t.data_ptr() not in given_ptrs]
    if missing:
        raise ConfigError(
            f"the checkpoint lacks {len(missing)} tensor(s) of the served model, e.g. {missing[:3]}; "
            "point update_weights_from_disk at a complete save_pretrained directory."
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
            yield safetensors_bytes(bucket)
            bucket, size = {}, 0
        bucket[name] = t
        size += nbytes
    if bucket:
        yield safetensors_bytes(bucket)


# torch dtype <-> safetensors dtype name (the format's spec: huggingface/safetensors README).
_ST_DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16",
              torch.bfloat16: "BF16", torch.int64: "I64", torch.int32: "I32", torch.int16: "I16",
              torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL",
              torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2"}  # fmt: skip
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
        header[name] = {"dtype": _ST_DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + nbytes]}  # fmt: skip
        if nbytes:
            parts.append(t.reshape(-1).view(torch.uint8).numpy().data)
        offset += nbytes
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    return [len(head).to_bytes(8, "little") + head, *parts]


def safetensors_bytes(tensors: Mapping[str, torch.Tensor]) -> bytes:
    """The safetensors file of ``tensors`` (contiguous, CPU) as ``bytes``, copying each tensor's
    bytes once (``safetensors.torch.save`` copies twice)."""
    parts = safetensors_parts(tensors)
    if parts is None:
        from safetensors.torch import save

        return save(dict(tensors))
    return b"".join(parts)


def load_safetensors_bytes(data: bytes) -> dict[str, torch.Tensor]:
    """Parse one bucket into read-only tensors that share ``data``'s memory (no copy; the
    server only copies them into its model). ConfigError if it is not a safetensors blob."""
    if not data:
        return {}
    try:
        n = int.from_bytes(data[:8], "little")
        header = json.loads(data[8 : 8 + n])
        base = 8 + n
        out: dict[str, torch.Tensor] = {}
        with warnings.catch_warnings():  # bytes are read-only; these tensors are never written
            warnings.simplefilter("ignore", UserWarning)
            for name, info in header.items():
                if name != "__metadata__":
                    out[name] = _view(data, base, info)
        return out
    except Exception:
        pass  # not our layout (or not safetensors): let the library decide
    from safetensors.torch import load

    try:
        return load(data)
    except Exception as exc:
        raise ConfigError(
            f"request body is not a safetensors blob ({type(exc).__name__}: {exc}); "
            "send bytes from agentrl.inference.weights.safetensors_buckets()."
        ) from exc


def _view(data: bytes, base: int, info: dict[str, Any]) -> torch.Tensor:
    dtype = _TORCH_DTYPES[info["dtype"]]
    start, end = info["data_offsets"]
    shape = info["shape"]
    if end == start:
        return torch.empty(shape, dtype=dtype)
    size = torch.empty(0, dtype=dtype).element_size()
    if (base + start) % size or (end - start) % size or end + base > len(data):
        raise ValueError("misaligned or truncated tensor")
    count = (end - start) // size
    return torch.frombuffer(data, dtype=dtype, count=count, offset=base + start).reshape(shape)
