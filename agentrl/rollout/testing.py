"""In-process Generators for testing AgentLoops and envs without an inference server.

    gen = ScriptedGenerator(template, ["<tool_call>...</tool_call>", "The answer is 42."])
    gen = TorchGenerator.from_pretrained(path)       # a real (tiny) HF model, sampled with torch

Both implement the ``Generator`` protocol (token ids in, token ids + logprobs out), so a
``RolloutContext`` or ``RolloutCollector`` runs against them exactly as against the HTTP
client. ``ScriptedGenerator`` returns text you choose per turn (a list, or a function of the
prompt text and turn index, sync or async) with deterministic fake logprobs;
``TorchGenerator`` samples a causal LM token by token with a KV cache and reports the sampled
tokens' log-probabilities (temperature applied; ``top_p``/``top_k`` are ignored), or, given
``respond``, teacher-forces that text and reports the model's logprobs for it.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from agentrl.chat import ChatTemplate
from agentrl.errors import InferenceError
from agentrl.inference.protocol import Completion, Cut, SamplingParams, cut_completion
from agentrl.tiny import CHATML_TOOLS_TEMPLATE

# Template variants of the tiny ChatML template, for testing token-ledger code:
# Qwen3-like: assistant turns before the last user message lose their <think> block
# (not prefix-preserving).
THINK_STRIPPING_TEMPLATE = (
    "{% set ns = namespace(last_user=-1) %}"
    "{% for m in messages %}{% if m.role == 'user' %}{% set ns.last_user = loop.index0 %}"
    "{% endif %}{% endfor %}"
    + CHATML_TOOLS_TEMPLATE.replace(
        "<|im_start|>assistant\n{{ message.content or '' }}",
        "{% set c = message.content or '' %}"
        "{% if loop.index0 < ns.last_user and '</think>' in c %}"
        "{% set c = c.split('</think>')[-1].lstrip('\\n') %}{% endif %}"
        "<|im_start|>assistant\n{{ c }}",
    )
)
# DeepSeek-R1-like: the generation prompt forces the reasoning block open (multi-token,
# part of it belongs to the assistant's content).
FORCED_THINK_TEMPLATE = CHATML_TOOLS_TEMPLATE.replace(
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}",
)

Respond = Callable[[str, int], "str | Awaitable[str]"]


def _as_respond(responses: Sequence[str] | Respond) -> Respond:
    if callable(responses):
        return responses
    items = list(responses)
    if not items:
        raise ValueError("ScriptedGenerator needs at least one response")
    return lambda _prompt, turn: items[min(turn, len(items) - 1)]


class _Scripted:
    def __init__(self, template: ChatTemplate, respond: Sequence[str] | Respond | None) -> None:
        self.template = template
        self.respond = _as_respond(respond) if respond is not None else None
        self.weight_version = 0
        self.calls = 0

    async def _text(self, input_ids: list[int]) -> str:
        assert self.respond is not None
        prompt = self.template.decode(input_ids)
        header = self.template.assistant_header or self.template.generation_prompt
        turn = max(prompt.count(header) - 1, 0) if header else 0
        out = self.respond(prompt, turn)
        return await out if inspect.isawaitable(out) else out  # type: ignore[no-any-return]

    def _forced_ids(self, text: str, sampling: SamplingParams) -> tuple[list[int], str]:
        """Token ids of ``text`` + the turn-end token, cut to max_new_tokens."""
        ids = self.template.encode(text)
        stop = sampling.stop_token_ids or self.template.stop_token_ids
        if stop:
            ids.append(stop[0])
        if len(ids) > sampling.max_new_tokens:
            return ids[: sampling.max_new_tokens], "length"
        return ids, "stop"


class ScriptedGenerator(_Scripted):
    """Answers with scripted text: ``responses[turn]`` (the last one repeats) or ``respond(prompt, turn)``.

    The turn index counts assistant turns already in the prompt. Logprobs are fake but fixed
    per token id; ``weight_version`` is settable. ``calls`` counts requests.
    """

    def __init__(
        self,
        template: ChatTemplate,
        responses: Sequence[str] | Respond,
        *,
        token_delay_s: float = 0.0,
    ) -> None:
        super().__init__(template, responses)
        self.token_delay_s = token_delay_s

    async def generate(
        self,
        input_ids: list[int],
        sampling: SamplingParams,
        *,
        session_id: str | None = None,
        images: Sequence[str] = (),
    ) -> Completion:
        """The scripted reply; ``images`` are accepted and not looked at."""
        self.calls += 1
        ids, finish = self._forced_ids(await self._text(input_ids), sampling)
        return Completion(
            output_ids=ids,
            output_logprobs=[-0.01 * (1 + t % 97) for t in ids],
            finish_reason=finish,  # type: ignore[arg-type]
            weight_version=self.weight_version,
            prompt_tokens=len(input_ids),
        )

    async def generate_stream(
        self,
        input_ids: list[int],
        sampling: SamplingParams,
        *,
        session_id: str | None = None,
        cut: Cut | None = None,
    ) -> AsyncIterator[list[int] | Completion]:
        """The same completion, one token at a time, ``token_delay_s`` apart (a slow server);
        ``cut`` ends it early as ``StreamingGenerator`` says."""
        c = await self.generate(input_ids, sampling, session_id=session_id)
        for i, t in enumerate(c.output_ids):
            await asyncio.sleep(self.token_delay_s)
            yield [t]
            n = cut(c.output_ids[: i + 1]) if cut is not None else None
            if n is not None:
                yield cut_completion(c, n)
                return
        yield c


class TorchGenerator(_Scripted):
    """A causal LM run in-process with torch: sampled completions with their logprobs."""

    def __init__(
        self,
        model: Any,
        template: ChatTemplate,
        *,
        seed: int = 0,
        respond: Sequence[str] | Respond | None = None,
    ) -> None:
        super().__init__(template, respond)
        self.model = model.eval()
        self.seed = seed

    @classmethod
    def from_pretrained(cls, path: str | Path, **kwargs: Any) -> TorchGenerator:
        from transformers import AutoModelForCausalLM

        return cls(
            AutoModelForCausalLM.from_pretrained(str(path)),
            ChatTemplate.from_pretrained(path),
            **kwargs,
        )

    async def generate(
        self,
        input_ids: list[int],
        sampling: SamplingParams,
        *,
        session_id: str | None = None,
        images: Sequence[str] = (),
    ) -> Completion:
        if not input_ids:
            raise InferenceError("empty prompt")
        if images:
            raise InferenceError(
                "TorchGenerator runs text-only causal LMs; a prompt with images needs the "
                "embedded server (agentrl serve) with a vision-language model"
            )
        self.calls += 1
        if self.respond is not None:
            ids, finish = self._forced_ids(await self._text(input_ids), sampling)
            lps = self._score(input_ids, ids)
        else:
            ids, lps, finish = self._sample(input_ids, sampling, self.seed * 100_003 + self.calls)
        await asyncio.sleep(0)  # let other rollouts run between requests
        return Completion(
            output_ids=ids,
            output_logprobs=lps,
            finish_reason=finish,  # type: ignore[arg-type]
            weight_version=self.weight_version,
            prompt_tokens=len(input_ids),
        )

    def _sample(
        self, input_ids: list[int], sp: SamplingParams, seed: int
    ) -> tuple[list[int], list[float], str]:
        import torch

        g = torch.Generator().manual_seed(seed)
        stop = set(sp.stop_token_ids or self.template.stop_token_ids)
        x = torch.tensor([input_ids])
        past: Any = None
        cache_kw = "past_key_values"
        ids: list[int] = []
        lps: list[float] = []
        with torch.no_grad():
            for _ in range(sp.max_new_tokens):
                kw = {} if past is None else {cache_kw: past}
                out = self.model(input_ids=x, use_cache=True, **kw)
                cache_kw = (
                    "cache" if "cache" in out else "past_key_values"
                )  # transformers 5.x / 4.x
                past = out[cache_kw]
                logits = out.logits[0, -1].float()
                if sp.temperature <= 0:
                    logp = torch.log_softmax(logits, -1)
                    tok = int(torch.argmax(logp))
                else:
                    logp = torch.log_softmax(logits / sp.temperature, -1)
                    tok = int(torch.multinomial(logp.exp(), 1, generator=g))
                ids.append(tok)
                lps.append(float(logp[tok]))
                if tok in stop:
                    return ids, lps, "stop"
                x = torch.tensor([[tok]])
        return ids, lps, "length"

    def _score(self, input_ids: list[int], ids: list[int]) -> list[float]:
        import torch

        if not ids:
            return []
        with torch.no_grad():
            logits = self.model(input_ids=torch.tensor([input_ids + ids])).logits[0].float()
        logp = torch.log_softmax(logits[len(input_ids) - 1 : -1], -1)  # (C, V)
        return [float(v) for v in logp.gather(1, torch.tensor(ids)[:, None])[:, 0]]
