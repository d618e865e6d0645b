"""The env service's wire format: JSON with binary parts carried as raw bytes.

    body = pack({"observation": [...], "reward": 1.0})   # bytes: a frame
    obj = unpack(body)                                    # the same object back

Observations may hold images (OpenAI content parts whose ``image_url.url`` is a
``data:image/png;base64,...`` URL) or raw ``bytes`` values. Base64 inside JSON would cost a
third more bytes than the image; here each such value travels as raw bytes after the JSON:

    b"ARLF" | u32 header length (big-endian) | header JSON | blob 0 | blob 1 | ...

The header is the object with each binary value replaced by ``{"$blob": i}`` (raw bytes) or
``{"$data_url": i, "mime": m}`` (a base64 data URL, rebuilt on the other side character for
character), plus ``"$blobs": [len0, len1, ...]``. A PNG observation of N bytes costs N plus
a few dozen bytes of header. Why our own framing: no msgpack/CBOR library is a dependency,
the format is twenty lines each way, and JSON stays readable in the header.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import struct
from collections.abc import Callable
from typing import Any

from agentrl.errors import EnvError

MEDIA_TYPE = "application/x-agentrl-frame"
MAGIC = b"ARLF"
_DATA_URL = re.compile(r"data:([\w.+/-]+);base64,")
_MIN_INLINE = 256  # shorter data URLs stay in the JSON (the framing would not pay)


def pack(obj: Any, default: Callable[[Any], Any] | None = None) -> bytes:
    """``obj`` (JSON values, ``bytes``, base64 data URLs) as one frame; ``default`` turns what
    JSON cannot write into what it can (as ``json.dumps``'s)."""
    blobs: list[bytes] = []

    def binary(v: Any) -> Any:
        if isinstance(v, bytes | bytearray | memoryview):
            blobs.append(bytes(v))
            return {"$blob": len(blobs) - 1}
        if default is None:
            raise TypeError(f"Object of type {type(v).__name__} is not JSON serializable")
        return default(v)

    # Fast path (most frames): one C-encoder pass, raw bytes via the hook; only a frame that
    # may hold a data URL is walked in Python.
    body = json.dumps(obj, separators=(",", ":"), default=binary)
    if '"data:' not in body:
        fast = f'{{"$body":{body},"$blobs":{json.dumps([len(b) for b in blobs])}}}'.encode()
        return b"".join([MAGIC, struct.pack(">I", len(fast)), fast, *blobs])
    blobs.clear()

    def walk(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: walk(x) for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [walk(x) for x in v]
        if isinstance(v, bytes | bytearray | memoryview):
            blobs.append(bytes(v))
            return {"$blob": len(blobs) - 1}
        if isinstance(v, str) and len(v) >= _MIN_INLINE and v.startswith("data:"):
            m = _DATA_URL.match(v)
            if m is not None:
                b64 = v[m.end() :]
                try:
                    raw = base64.b64decode(b64, validate=True)
                except (binascii.Error, ValueError):
                    return v
                if base64.b64encode(raw).decode("ascii") == b64:  # rebuilt exactly
                    blobs.append(raw)
                    return {"$data_url": len(blobs) - 1, "mime": m.group(1)}
        return v

    header = walk(obj)
    head = json.dumps(
        {"$body": header, "$blobs": [len(b) for b in blobs]}, separators=(",", ":"), default=default
    )
    hb = head.encode()
    return b"".join([MAGIC, struct.pack(">I", len(hb)), hb, *blobs])


def unpack(data: bytes) -> Any:
    """The object ``pack`` framed; ``EnvError`` for a malformed frame."""
    if data[:4] != MAGIC or len(data) < 8:
        raise EnvError(f"env server sent a malformed frame (starts {bytes(data[:16])!r})")
    (n,) = struct.unpack(">I", data[4:8])
    head = json.loads(data[8 : 8 + n])
    view, at, blobs = memoryview(data), 8 + n, []
    for size in head["$blobs"]:
        blobs.append(bytes(view[at : at + size]))
        at += size
    if at != len(data):
        raise EnvError(f"env server frame is {len(data)} bytes, its header says {at}")

    def walk(v: Any) -> Any:
        if isinstance(v, dict):
            if "$blob" in v and len(v) == 1:
                return blobs[v["$blob"]]
            if "$data_url" in v and len(v) == 2:
                b64 = base64.b64encode(blobs[v["$data_url"]]).decode("ascii")
                return f"data:{v['mime']};base64,{b64}"
            return {k: walk(x) for k, x in v.items()}
        if isinstance(v, list):
            return [walk(x) for x in v]
        return v

    return walk(head["$body"])
