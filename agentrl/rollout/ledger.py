"""The token ledger of one rollout: token ids exactly as trained on, built turn by turn.

    messages --ChatTemplate delta--> prompt ids (loss 0) --server--> completion ids (loss 1)

Two modes, chosen once per chat template:

- prefix-preserving templates (ChatML, Llama 3, ...): one segment grows by appending, for each
  turn, the tokens that close the previous assistant turn, the delta of the new messages and
  the generation prompt (loss mask 0), then the completion exactly as generated (loss mask 1,
  server logprobs, weight version per token). O(new tokens) work per turn.
- other templates (e.g. ones that drop past ``<think>`` blocks): per-turn segments. Each turn
  starts a new segment whose prompt is a fresh full render of the conversation so far, so
  every segment is exactly what the model saw when it generated that completion.

Images (a vision-language template, ``ChatTemplate.vision``): the image parts of the messages a
prompt adds become their placeholder tokens, expanded to each image's token count, and their
URLs are appended to ``Segment.images`` in the same order; ``prompt_images()`` is what the
model request must carry with the ids. A text-only template refuses image parts.

``new_segment()`` starts a fresh segment on purpose (sub-agents, context compaction). The
ledger remembers how many messages each segment covers, so ``check`` can compare every
segment with a full render of the conversation prefix it stands for.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from agentrl.chat import ChatTemplate, LedgerCheck
from agentrl.types import JSON, Message, Segment


@dataclass(slots=True)
class _Open:
    """Bookkeeping for the segment being built."""

    segment: Segment
    messages_done: int  # messages whose tokens are in the segment
    last_completion: list[int] | None = None  # tail of the last completion (to close the turn)


@dataclass(slots=True)
class TokenLedger:
    """Segments of (prompt, completion) tokens for one rollout. See the module docstring."""

    template: ChatTemplate
    tools: list[JSON] | None = None
    per_turn: bool = False
    segments: list[Segment] = field(default_factory=list)
    segment_messages: list[int] = field(default_factory=list)  # messages covered, per segment
    completion_messages: list[list[int]] = field(default_factory=list)  # per segment: indices
    raw_segments: set[int] = field(default_factory=set)
    refused: tuple[int, int] | None = None  # (tokens, image tokens) of the prompt last refused
    _open: _Open | None = None

    @classmethod
    def for_template(cls, template: ChatTemplate, tools: list[JSON] | None) -> TokenLedger:
        return cls(template=template, tools=tools, per_turn=not template.is_prefix_preserving())

    def new_segment(self) -> None:
        """Close the current segment; the next prompt is a full render in a new one."""
        self._open = None

    def prompt(
        self,
        messages: Sequence[Message],
        *,
        raw_ids: list[int] | None = None,
        limit: int | None = None,
    ) -> list[int] | None:
        """Append the prompt tokens for generating after ``messages``; return the model input.

        ``raw_ids`` appends those ids verbatim instead of a template delta (token mode).
        Returns None, appending nothing, if the prompt would be ``limit`` tokens or longer.
        """
        o = self._open
        fresh = o is None or (self.per_turn and o.last_completion is not None)
        if raw_ids is not None:
            ids = list(raw_ids)
        elif fresh:
            ids = self.template.render(messages, self.tools, add_generation_prompt=True)
        else:
            assert o is not None
            done = o.messages_done
            ids = self.template.delta_ids(
                messages[:done], messages[done:], self.tools, last_completion_ids=o.last_completion
            )
        urls: list[str] = []
        if raw_ids is None:
            urls = self.template.image_urls(messages if fresh or o is None else messages[done:])
            if urls and self.template.vision is not None:
                ids = self.template.vision.expand(ids, urls)
        base = 0 if fresh or o is None else len(o.segment)
        if limit is not None and base + len(ids) >= limit:
            pad = self.template.vision.image_token_id if urls and self.template.vision else -1
            self.refused = (base + len(ids), ids.count(pad))
            return None
        if fresh or o is None:
            o = self._start()
        o.messages_done = len(messages)
        o.last_completion = None
        if raw_ids is not None:
            self.raw_segments.add(len(self.segments) - 1)
        o.segment.extend_prompt(ids)
        o.segment.images.extend(urls)
        self.segment_messages[-1] = len(messages)
        return list(o.segment.token_ids)

    def prompt_images(self) -> list[str]:
        """The images of the open segment (those the last ``prompt()`` returned ids for)."""
        return list(self._open.segment.images) if self._open is not None else []

    def _start(self) -> _Open:
        seg = Segment()
        self.segments.append(seg)
        self.segment_messages.append(0)
        self.completion_messages.append([])
        self._open = _Open(segment=seg, messages_done=0)
        return self._open

    def add_completion(
        self, ids: list[int], logprobs: list[float], versions: int | list[int], messages_after: int
    ) -> None:
        """Append generated tokens; ``messages_after`` counts messages incl. the assistant one."""
        o = self._open
        if o is None:
            raise RuntimeError("add_completion() before prompt()")
        o.segment.extend_generated(ids, logprobs, versions)
        o.last_completion = ids[-1:] if ids else []
        o.messages_done = messages_after
        self.segment_messages[-1] = messages_after
        self.completion_messages[-1].append(messages_after - 1)

    @property
    def total_tokens(self) -> int:
        return sum(len(s) for s in self.segments)

    def check(
        self, messages: Sequence[Message], raw_text: Callable[[int], str]
    ) -> list[tuple[int, LedgerCheck]]:
        """Compare every template-built segment with a full render; returns (segment, result).

        ``raw_text(i)`` is the generated text of the assistant message ``messages[i]``. In
        each segment the assistant messages generated *in that segment* are rendered from
        their raw text (the ledger holds exactly those tokens; the parsed message may differ
        in whitespace or tool-call formatting), earlier ones as parsed messages.
        """
        out = []
        for i, (seg, n) in enumerate(zip(self.segments, self.segment_messages, strict=True)):
            if i in self.raw_segments:
                continue
            msgs = list(messages[:n])
            for k in self.completion_messages[i]:
                msgs[k] = Message(role="assistant", content=raw_text(k))
            out.append((i, self.template.check_ledger(msgs, seg.token_ids, self.tools)))
        return out
