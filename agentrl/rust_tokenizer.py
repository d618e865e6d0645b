"""The Rust ``tokenizers`` object behind a fast Hugging Face tokenizer, where it is safe to use.

    backend = rust_backend(tokenizer, clean_up=False)   # None: use the HF wrapper
    backend.encode(text, add_special_tokens=False).ids
    backend.decode(ids, skip_special_tokens=True)

The HF wrapper converts its arguments and post-processes the text on every call: 4.2 us to
decode a 24-token answer against 0.8 us for its Rust object (timeit, the tiny tokenizer). The
chat template encodes every rendered turn and the inference server decodes every answer on its
HTTP thread, which shares the GIL with the engine, so both call the Rust object directly. A
wrapper may change the text (``clean_up_tokenization_spaces``, a subclass's own ``decode``),
so the object is used only where a probe with special tokens, non-ASCII text and odd spacing
gives the same ids and the same text (with and without special tokens) both ways.
"""

from __future__ import annotations

import contextlib
from typing import Any

_PROBE = "Probe: 12 * 7 = 84 ünïcode 🙂  two  spaces , x"


def rust_backend(tokenizer: Any, *, clean_up: bool | None = None) -> Any | None:
    """``tokenizer``'s Rust object if it encodes and decodes the probe as the wrapper does.

    ``clean_up`` is the ``clean_up_tokenization_spaces`` the caller passes to the wrapper's
    ``decode`` (None: the tokenizer's own default)."""
    backend = getattr(tokenizer, "_tokenizer", None)
    if backend is None or not hasattr(backend, "encode") or not hasattr(backend, "decode"):
        return None
    kwargs = {} if clean_up is None else {"clean_up_tokenization_spaces": clean_up}
    try:
        text = _probe_text(tokenizer)
        ids = [int(i) for i in tokenizer.encode(text, add_special_tokens=False)]
        if list(backend.encode(text, add_special_tokens=False).ids) != ids:
            return None
        if isinstance(tokenizer.eos_token_id, int):
            ids.append(tokenizer.eos_token_id)
        for skip in (True, False):
            slow = tokenizer.decode(ids, skip_special_tokens=skip, **kwargs)
            if backend.decode(ids, skip_special_tokens=skip) != slow:
                return None
    except Exception:  # an odd tokenizer: the wrapper is always right
        return None
    return backend


def _probe_text(tokenizer: Any) -> str:
    """The probe inside the tokenizer's chat template (its special tokens), if it has one."""
    with contextlib.suppress(Exception):
        messages = [{"role": "user", "content": _PROBE}, {"role": "assistant", "content": "ok"}]
        return str(tokenizer.apply_chat_template(messages, tokenize=False))
    return _PROBE
