"""A local tokenizer and tiny-model factory: real Hugging Face directories, built offline.

    path = make_tiny_model("/tmp/tiny", arch="qwen2", hidden_size=64, num_layers=2)
    AutoModelForCausalLM.from_pretrained(path); AutoTokenizer.from_pretrained(path)

No model hub is reachable from the machines agentrl is tested on, so tests, benchmarks and the
quickstart build their model here: a byte-level BPE tokenizer trained with the ``tokenizers``
library on a small built-in corpus (deterministic: the same corpus gives the same vocabulary),
a ChatML chat template with tool calls in the Hermes/Qwen ``<tool_call>{json}</tool_call>``
format, and a randomly initialised Llama- or Qwen2-shaped causal LM from a config. The result
is an ordinary HF directory that ``agentrl serve``, the trainer and ``from_pretrained`` load.

``arch="qwen2_vl"`` writes a tiny vision-language model instead (``Qwen2VLForConditionalGeneration``,
loaded with ``AutoModelForImageTextToText``): the same tokenizer plus Qwen2-VL's three image
tokens, a chat template that renders an image part as ``<|vision_start|><|image_pad|><|vision_end|>``
and a PIL image processor (``preprocessor_config.json``) with small patches and a pixel budget, so
a screenshot becomes a few dozen image tokens (``agentrl.vision``). Qwen2-VL rather than
SmolVLM/Idefics3: its template is ChatML like ours, its image tokens are three added tokens, and
its pixels are patch rows concatenated over images (no per-row padding in a batch).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

logger = logging.getLogger(__name__)

IM_START, IM_END, EOT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
# Single-token markers the model emits as text (not "special": decoding keeps them).
MARKERS = (
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
)

# ChatML with tools, in the Hermes/Qwen format. Prefix-preserving: rendering a conversation
# and then rendering it with more messages only ever appends tokens. Tools are listed one a
# line as ``name(arg1, arg2): description`` (not as JSON schemas): a tiny model's prompt stays
# a few dozen tokens instead of hundreds; calls are still ``<tool_call>{json}</tool_call>``.
CHATML_TOOLS_TEMPLATE = (
    "{% if tools %}"
    "<|im_start|>system\n"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif %}"
    '# Tools\nCall a tool with <tool_call>{"name": ..., "arguments": {...}}</tool_call>. Tools:'
    "{% for tool in tools %}{% set fn = tool.function if tool.function is defined else tool %}"
    "{{ '\\n' }}{{ fn.name }}({{ (fn.parameters.properties if fn.parameters is defined and "
    "fn.parameters.properties is defined else {}) | join(', ') }}): {{ fn.description or '' }}"
    "{% endfor %}<|im_end|>\n"
    "{% elif messages[0].role == 'system' %}"
    "<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if message.role == 'system' %}"
    "{% elif message.role == 'assistant' %}"
    "<|im_start|>assistant\n{{ message.content or '' }}"
    "{% for tc in message.tool_calls or [] %}"
    "{% set fn = tc.function if tc.function is defined else tc %}"
    '<tool_call>{"name": "{{ fn.name }}", "arguments": '
    "{{ fn.arguments if fn.arguments is string else fn.arguments | tojson }}}</tool_call>"
    "{% endfor %}<|im_end|>\n"
    "{% elif message.role == 'tool' %}"
    "<|im_start|>user\n<tool_response>{{ message.content }}</tool_response><|im_end|>\n"
    "{% else %}"
    "<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# The same template, with content parts: text parts as text, image parts as Qwen2-VL's
# placeholder (expanded to one <|image_pad|> per image token by agentrl.vision.Vision.expand).
_CONTENT_PARTS = (
    "{% if message.content is string %}{{ message.content }}{% else %}"
    "{% for part in message.content %}"
    "{% if part.type == 'text' %}{{ part.text }}"
    "{% elif part.type == 'image_url' or part.type == 'image' %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% endif %}{% endfor %}{% endif %}"
)
CHATML_VISION_TEMPLATE = CHATML_TOOLS_TEMPLATE.replace("{{ message.content }}", _CONTENT_PARTS)
VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")

_CORPUS_WORDS = (
    "the a an is are was to of and or in on for with you your what which number numbers answer "
    "Answer guess Guess higher lower correct wrong too high low try again game over target use "
    "calculator tool tools call result error Error invalid expression compute reach make using "
    "each exactly once final sum product difference add subtract multiply divide plus minus times "
    "system user assistant Solve solve question Question task Task step think reasoning between "
    "name arguments expression value true false null left right up down move grid goal wall "
    "reward done Reply reply with only The Find find count letters word words sort list "
)


def _corpus() -> list[str]:
    lines = [_CORPUS_WORDS] * 4
    lines += [" ".join(str(i) for i in range(0, 1000, 7)), "0123456789 +-*/()=<>.,:;!?'\"{}[]_#"]
    lines += [
        '{"name": "calculator", "arguments": {"expression": "(3 + 4) * 5"}}',
        '<tool_call>{"name": "calculator", "arguments": {"expression": "12 * 7"}}</tool_call>',
        "Use the numbers 3, 7, 25 and 50 to reach 81. Answer: 25 + 50 + 7 - 3 - 1",
        "I am thinking of a number between 1 and 100. Guess: 50. Too high. Too low. Correct!",
    ]
    return lines


def build_tokenizer(  # type: ignore[no-untyped-def]
    vocab_size: int = 1024, *, vision: bool = False, corpus: Sequence[str] = ()
):
    """Train a deterministic byte-level BPE tokenizer and wrap it as an HF fast tokenizer.

    ``vision`` adds Qwen2-VL's image tokens (after every other token, so the text ids do not
    change) and the template that renders image parts. ``corpus`` is more text to learn merges
    from (a task's own pages, say), after the built-in corpus: the built-in one is a few hundred
    words, so the task's words otherwise split into single letters, which a pretrained
    tokenizer would never do, and a small model then has to match and copy letter by letter."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    specials = [EOT, IM_START, IM_END]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([*_corpus(), *corpus], trainer=trainer)
    tok.add_tokens([AddedToken(m, special=False, normalized=False) for m in MARKERS])
    if vision:
        tok.add_special_tokens(
            [AddedToken(t, special=True, normalized=False) for t in VISION_TOKENS]
        )
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=EOT,
        bos_token=None,
        unk_token=None,
        chat_template=CHATML_VISION_TEMPLATE if vision else CHATML_TOOLS_TEMPLATE,
        model_max_length=4096,
    )
    return hf


def make_tiny_model(
    path: str | Path,
    *,
    arch: Literal["qwen2", "llama", "qwen2_vl"] = "qwen2",
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int | None = None,
    vocab_size: int = 1024,
    max_position_embeddings: int = 4096,
    seed: int = 0,
    chat_template: str | None = None,
    dtype: str = "float32",
    vision: TinyVision | None = None,
    corpus: Sequence[str] = (),
) -> Path:
    """Write a randomly initialised tiny causal LM (or, ``arch="qwen2_vl"``, a vision-language
    model with ``vision``'s image side) and its tokenizer as an HF directory; ``corpus``: more
    text for the tokenizer (``build_tokenizer``)."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    if arch not in ("qwen2", "llama", "qwen2_vl"):
        raise ValueError(f"arch must be 'qwen2', 'llama' or 'qwen2_vl', got {arch!r}")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(vocab_size, vision=arch == "qwen2_vl", corpus=corpus)
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    n_vocab = len(tokenizer)
    common = dict(
        vocab_size=n_vocab,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 4 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.convert_tokens_to_ids(IM_END),
        pad_token_id=tokenizer.convert_tokens_to_ids(EOT),
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    if arch == "qwen2_vl":
        model = _tiny_vlm(common, tokenizer, vision or TinyVision(), hidden_size // num_heads)
        model = model.to(getattr(torch, dtype))
    else:
        config = Qwen2Config(**common) if arch == "qwen2" else LlamaConfig(**common)
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    model.generation_config.eos_token_id = [common["eos_token_id"], common["pad_token_id"]]
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    if arch == "qwen2_vl":
        _image_processor(vision or TinyVision()).save_pretrained(path)
    (path / "agentrl_tiny.json").write_text(json.dumps({"arch": arch, "seed": seed}))
    logger.info("wrote tiny %s model (%d params) to %s", arch, model.num_parameters(), path)
    return path


@dataclass(frozen=True, kw_only=True)
class TinyVision:
    """The image side of a tiny ``qwen2_vl`` model: its vision tower and its image processor.

    A (H, W) image is resized (keeping its aspect) to multiples of ``patch_size *
    merge_size`` with ``min_pixels <= H * W <= max_pixels``, and becomes ``H * W /
    (patch_size * merge_size) ** 2`` image tokens: an 800x600 screenshot, 64 with the defaults.
    """

    depth: int = 2
    embed_dim: int = 32
    num_heads: int = 2
    patch_size: int = 8
    merge_size: int = 2
    min_pixels: int = 16 * 16
    max_pixels: int = 128 * 128


def _tiny_vlm(common: dict[str, Any], tokenizer: Any, v: TinyVision, head_dim: int) -> Any:
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    half = head_dim // 2  # M-RoPE splits each head's rotary frequencies over (t, h, w)
    section = [half - 2 * (half // 3), half // 3, half // 3]
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in VISION_TOKENS}
    text = dict(common)
    text["rope_parameters"] = {
        "rope_type": "default",
        "rope_theta": 10000.0,
        "mrope_section": section,
    }
    config = Qwen2VLConfig(
        text_config=text,
        vision_config=dict(
            depth=v.depth,
            embed_dim=v.embed_dim,
            hidden_size=common["hidden_size"],
            num_heads=v.num_heads,
            patch_size=v.patch_size,
            spatial_merge_size=v.merge_size,
            temporal_patch_size=2,
        ),
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        tie_word_embeddings=True,
    )
    return Qwen2VLForConditionalGeneration(config)


def _image_processor(v: TinyVision) -> Any:
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    return Qwen2VLImageProcessorPil(
        patch_size=v.patch_size,
        merge_size=v.merge_size,
        temporal_patch_size=2,
        min_pixels=v.min_pixels,
        max_pixels=v.max_pixels,
    )
