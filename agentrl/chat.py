"""Chat templates in token space: render, take deltas, and check a token ledger.

    messages --render (Jinja text)--> text --encode (no special tokens added)--> ids
    ledger  = render(initial, generation prompt) + completion_1 + closing_1
              + delta(new messages_1) + completion_2 + ...

A rollout's ledger is built incrementally: the model's tokens go in exactly as generated and
everything else (env/tool messages, the turn separators, the next generation prompt) is the
*delta* the template adds when messages are appended. ``ChatTemplate`` computes those deltas
generically, by diffing renders, with no per-model code:

- the template is probed once: the generation prompt (may be several tokens, e.g. a forced
  ``<think>\\n``), the assistant header and the text that closes an assistant turn (e.g.
  ``<|im_end|>\\n``); after a completion that ended with the turn-end token only the rest
  (``\\n``) is added, after one cut by ``length`` the whole closing text is;
- ``is_prefix_preserving()`` renders probe conversations (reasoning, tool calls) and checks
  that rendering k messages is a prefix of rendering k+1. Templates that rewrite history (e.g.
  drop past ``<think>`` blocks) fail it and the ledger falls back to per-turn segments;
- the delta of new messages is rendered after a small fixed probe conversation (without
  tools: they only change the system prompt) instead of after the whole conversation, so a
  turn costs O(new messages), not O(T). The first time each shape of delta (roles of the new
  messages, tools or not) is seen, the fast result is compared with a full render diff; if
  they differ, the full diff is used for that shape from then on;
- ``check_ledger`` decodes a ledger and compares it with a full render of the conversation,
  reporting the first mismatching token.

Images: a template built for a vision-language model carries its ``Vision``
(``agentrl.vision``; ``from_pretrained`` finds it in the model directory). The template renders
one placeholder per image part; the ledger expands each to the image's token count
(``image_urls`` + ``Vision.expand``) and ``check_ledger`` folds the runs back. A text-only
template refuses image parts (``image_urls`` raises) instead of rendering their repr.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.errors import TokenizationError
from agentrl.rust_tokenizer import rust_backend
from agentrl.types import JSON, Message, ToolCall
from agentrl.vision import Vision, has_images
from agentrl.vision import image_urls as _image_urls

logger = logging.getLogger(__name__)

_MARK = "XQZPROBEQZX"
_PROBE_TOOL: JSON = {
    "type": "function",
    "function": {
        "name": "probe_tool",
        "description": "A probe.",
        "parameters": {
            "type": "object",
            "properties": {"x": {"type": "string"}},
            "required": ["x"],
        },
    },
}


@dataclass(frozen=True, slots=True)
class LedgerMismatch:
    """Where a ledger's decoded text first differs from the full render of its conversation."""

    token_index: int  # first ledger token whose text is not in the render
    char_index: int  # offset in the decoded ledger text
    expected: str  # the render's text from there (a short window)
    got: str  # the ledger's text from there (a short window)


@dataclass(frozen=True, slots=True)
class LedgerCheck:
    ok: bool
    mismatch: LedgerMismatch | None = None

    def raise_for_mismatch(self) -> None:
        if self.mismatch is not None:
            m = self.mismatch
            raise TokenizationError(
                f"token ledger differs from the chat template's render at token {m.token_index} "
                f"(char {m.char_index}): expected {m.expected!r}, got {m.got!r}. The template is "
                f"probably not prefix-preserving in a way the probe missed; use per-turn segments "
                f"(ChatTemplate(..., prefix_preserving=False))."
            )


def _to_dicts(messages: Sequence[Message | JSON]) -> list[JSON]:
    return [m.to_openai() if isinstance(m, Message) else m for m in messages]


class ChatTemplate:
    """A tokenizer's chat template, in token space.

    ``prefix_preserving`` forces the detection result (None: probe the template).
    ``template_kwargs`` go to every render (e.g. ``{"enable_thinking": False}``).
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        chat_template: str | None = None,
        template_kwargs: dict[str, Any] | None = None,
        prefix_preserving: bool | None = None,
        cache_size: int = 256,
        vision: Vision | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.vision = vision
        self._chat_template = chat_template
        self._kwargs = dict(template_kwargs or {})
        self._prefix_preserving = prefix_preserving
        self._render_cache: OrderedDict[str, list[int]] = OrderedDict()
        self._cache_size = cache_size
        self._fast_ok: dict[tuple[Any, ...], bool] = {}
        self._probe_base: str | None = None
        # the Rust tokenizer where it gives the wrapper's ids and text (skips per-call overhead)
        self._backend: Any = rust_backend(tokenizer, clean_up=False)
        self._probe_structure()

    @classmethod
    def from_pretrained(cls, path: str | Path, **kwargs: Any) -> ChatTemplate:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(path))
        if "vision" not in kwargs:
            kwargs["vision"] = Vision.from_pretrained(path, tokenizer)
        return cls(tokenizer, **kwargs)

    def image_urls(self, messages: Sequence[Message | JSON]) -> list[str]:
        """The image parts' URLs of ``messages`` in order; a text-only template refuses them."""
        if self.vision is None:
            if has_images(messages):
                raise TokenizationError(
                    "a message has an image part but this model is text-only (its directory has "
                    "no image processor); drop image parts (e.g. GUIAgentLoop mode='text') or "
                    "serve a vision-language model (agentrl.tiny.make_tiny_model(arch='qwen2_vl'))"
                )
            return []
        return _image_urls(messages)

    # --- rendering --------------------------------------------------------------------------
    def render_text(
        self,
        messages: Sequence[Message | JSON],
        tools: list[JSON] | None = None,
        *,
        add_generation_prompt: bool = False,
    ) -> str:
        text = self.tokenizer.apply_chat_template(
            _to_dicts(messages),
            tools=tools or None,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            chat_template=self._chat_template,
            **self._kwargs,
        )
        return str(text)

    def encode(self, text: str) -> list[int]:
        if self._backend is not None:
            return list(self._backend.encode(text, add_special_tokens=False).ids)
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        if self._backend is not None:
            return str(self._backend.decode(list(ids), skip_special_tokens=False))
        return str(
            self.tokenizer.decode(
                list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False
            )
        )

    def render(
        self,
        messages: Sequence[Message | JSON],
        tools: list[JSON] | None = None,
        *,
        add_generation_prompt: bool = False,
    ) -> list[int]:
        """Token ids of the rendered conversation (cached: group members share prompts)."""
        key = json.dumps([_to_dicts(messages), tools, add_generation_prompt], default=str)
        hit = self._render_cache.get(key)
        if hit is not None:
            self._render_cache.move_to_end(key)
            return list(hit)
        ids = self.encode(
            self.render_text(messages, tools, add_generation_prompt=add_generation_prompt)
        )
        self._render_cache[key] = ids
        if len(self._render_cache) > self._cache_size:
            self._render_cache.popitem(last=False)
        return list(ids)

    # --- structure of the template ----------------------------------------------------------
    def _probe_structure(self) -> None:
        u = Message(role="user", content="probe question")
        p0 = self.render_text([u])
        p1 = self.render_text([u], add_generation_prompt=True)
        full = self.render_text([u, Message(role="assistant", content=_MARK)])
        if not p1.startswith(p0) or _MARK not in full[len(p0) :]:
            raise TokenizationError(
                "cannot locate the assistant turn in this chat template's render: expected "
                "render([user]) to be a prefix of render([user], add_generation_prompt=True) and "
                f"of render([user, assistant]); got {p1!r} and {full!r}."
            )
        i = full.index(_MARK, len(p0))
        self.generation_prompt = p1[len(p0) :]
        self.assistant_header = full[len(p0) : i]
        self.assistant_suffix = full[i + len(_MARK) :]
        # Text the generation prompt puts inside the assistant content (e.g. a forced "<think>\n").
        gp, hdr = self.generation_prompt, self.assistant_header
        self.content_prefix = gp[len(hdr) :] if gp.startswith(hdr) else ""
        self._probe = [
            Message(role="user", content="probe"),
            Message(role="assistant", content=self.content_prefix + "probe"),
        ]
        self.generation_prompt_ids = self.encode(self.generation_prompt)
        stop: list[int] = []
        eos = getattr(self.tokenizer, "eos_token_id", None)
        if isinstance(eos, int):
            stop.append(eos)
        first = self.encode(self.assistant_suffix)[:1]
        if (
            first
            and first[0] not in stop
            and self.decode(first)
            and self.assistant_suffix.startswith(self.decode(first))
        ):
            stop.append(first[0])
        self.stop_token_ids: tuple[int, ...] = tuple(stop)

    def is_prefix_preserving(self) -> bool:
        """Whether appending messages only ever appends text (probed once, then cached)."""
        if self._prefix_preserving is None:
            self._prefix_preserving = self._probe_prefix_preserving()
            logger.debug("chat template prefix-preserving: %s", self._prefix_preserving)
        return self._prefix_preserving

    def _probe_prefix_preserving(self) -> bool:
        cp = self.content_prefix
        call = ToolCall(name="probe_tool", arguments={"x": "1"}, id="call_probe")
        think = [
            Message(role="system", content="probe system"),
            Message(role="user", content="question one"),
            Message(
                role="assistant", content=cp + "<think>\nreasoning one\n</think>\n\nanswer one"
            ),
            Message(role="user", content="question two"),
            Message(
                role="assistant", content=cp + "<think>\nreasoning two\n</think>\n\nanswer two"
            ),
            Message(role="user", content="question three"),
        ]
        tools = [
            Message(role="user", content="question"),
            Message(role="assistant", content=cp + "calling", tool_calls=(call,)),
            Message(role="tool", content="result one", tool_call_id="call_probe"),
            Message(role="assistant", content=cp + "again", tool_calls=(call,)),
            Message(role="tool", content="result two", tool_call_id="call_probe"),
            Message(role="user", content="done?"),
            Message(role="assistant", content=cp + "done"),
        ]
        rendered_any = False
        # the system-less variant is for templates that reject a system role (e.g. Gemma)
        for msgs, schema in ((think, None), (think[1:], None), (tools, [_PROBE_TOOL])):
            try:
                ok = self._grows_by_appending(msgs, schema)
            except Exception as e:  # a template may refuse a probe (e.g. no tool role)
                logger.debug("chat template refused a probe conversation: %s", e)
                continue
            rendered_any = True
            if not ok:
                return False
        return rendered_any

    def _grows_by_appending(self, msgs: list[Message], tools: list[JSON] | None) -> bool:
        for k in range(1, len(msgs)):
            before = self.render_text(
                msgs[:k], tools, add_generation_prompt=msgs[k].role == "assistant"
            )
            if not self.render_text(msgs[: k + 1], tools).startswith(before):
                return False
        return True

    # --- completions ------------------------------------------------------------------------
    def ends_turn(self, completion_ids: Sequence[int]) -> bool:
        """Whether the completion's last token is the template's turn-end token."""
        return bool(completion_ids) and completion_ids[-1] in self.stop_token_ids

    def completion_text(self, completion_ids: Sequence[int]) -> str:
        """The assistant content a completion stands for (turn-end token dropped)."""
        ids = completion_ids[:-1] if self.ends_turn(completion_ids) else completion_ids
        return self.content_prefix + self.decode(ids)

    def closing_ids(self, completion_ids: Sequence[int]) -> list[int]:
        """Tokens that close the assistant turn after this completion (not generated: mask 0)."""
        suffix = self.assistant_suffix
        if self.ends_turn(completion_ids):
            last = self.decode(completion_ids[-1:])
            if suffix.startswith(last):
                suffix = suffix[len(last) :]
        return self.encode(suffix) if suffix else []

    # --- deltas -----------------------------------------------------------------------------
    def delta_ids(
        self,
        prev_messages: Sequence[Message],
        new_messages: Sequence[Message],
        tools: list[JSON] | None = None,
        *,
        last_completion_ids: Sequence[int] | None = None,
    ) -> list[int]:
        """Tokens that appending ``new_messages`` and the next generation prompt adds.

        ``prev_messages`` are already in the ledger. If they end with an assistant message
        whose tokens are a generated completion, pass those ids as ``last_completion_ids`` so
        the turn is closed correctly (after a turn-end token only the separator is added).
        """
        closing = self.closing_ids(last_completion_ids) if last_completion_ids is not None else []
        return closing + self.encode(self._delta_text(prev_messages, new_messages, tools))

    def _delta_text(
        self, prev: Sequence[Message], new: Sequence[Message], tools: list[JSON] | None
    ) -> str:
        fast_usable = bool(prev) and prev[-1].role == "assistant"
        if not fast_usable:
            return self._delta_text_full(prev, new, tools)
        key = (tuple(m.role for m in new), tools is not None)
        ok = self._fast_ok.get(key)
        if ok is False:
            return self._delta_text_full(prev, new, tools)
        fast = self._delta_text_fast(new)
        if ok is None:
            full = self._delta_text_full(prev, new, tools)
            self._fast_ok[key] = fast == full
            if fast != full:
                logger.info(
                    "chat template delta for %s depends on history; using full renders", key
                )
                return full
        return fast

    def _delta_text_full(
        self, prev: Sequence[Message], new: Sequence[Message], tools: list[JSON] | None
    ) -> str:
        base = self.render_text(prev, tools)
        full = self.render_text([*prev, *new], tools, add_generation_prompt=True)
        if not full.startswith(base):
            raise TokenizationError(
                "the chat template rewrote earlier messages when new ones were appended, so the "
                "token ledger cannot grow by deltas; this template needs per-turn segments "
                "(it should have been detected by is_prefix_preserving())."
            )
        return full[len(base) :]

    def _delta_text_fast(self, new: Sequence[Message]) -> str:
        """The delta rendered after a fixed two-message probe, without tools (cheap)."""
        if self._probe_base is None:
            self._probe_base = self.render_text(self._probe)
        full = self.render_text([*self._probe, *new], add_generation_prompt=True)
        return full[len(self._probe_base) :]

    # --- checks -----------------------------------------------------------------------------
    def check_ledger(
        self,
        messages: Sequence[Message],
        token_ids: Sequence[int],
        tools: list[JSON] | None = None,
    ) -> LedgerCheck:
        """Compare a ledger with a full render of ``messages``.

        The decoded ledger must be a prefix of the render (messages after the last completion
        may be missing from it) that reaches at least the last assistant message's content.
        """
        if self.vision is not None:  # one placeholder per image, as the template renders it
            pad = self.vision.image_token_id
            token_ids = [
                t for i, t in enumerate(token_ids) if t != pad or i == 0 or token_ids[i - 1] != pad
            ]
        got = self.decode(token_ids)
        expected = self.render_text(messages, tools)
        if not expected.startswith(got):
            with_gp = self.render_text(messages, tools, add_generation_prompt=True)
            if with_gp.startswith(got):
                expected = with_gp
            else:
                return LedgerCheck(False, self._mismatch(got, expected, token_ids))
        last_asst = max((i for i, m in enumerate(messages) if m.role == "assistant"), default=-1)
        if last_asst >= 0:
            needed = self.render_text(messages[:last_asst], tools, add_generation_prompt=True)
            if len(got) < len(needed):
                return LedgerCheck(False, self._mismatch(got, expected, token_ids, len(got)))
        return LedgerCheck(True)

    def _mismatch(
        self, got: str, expected: str, ids: Sequence[int], at: int | None = None
    ) -> LedgerMismatch:
        i = (
            at
            if at is not None
            else next(
                (k for k, (a, b) in enumerate(zip(got, expected, strict=False)) if a != b),
                min(len(got), len(expected)),
            )
        )
        lo, hi = 0, len(ids)  # first k with len(decode(ids[:k+1])) > i
        while lo < hi:
            mid = (lo + hi) // 2
            if len(self.decode(ids[: mid + 1])) > i:
                hi = mid
            else:
                lo = mid + 1
        return LedgerMismatch(
            token_index=lo, char_index=i, expected=expected[i : i + 60], got=got[i : i + 60]
        )
