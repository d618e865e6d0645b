"""A local tokenizer and tiny-model factory: real Hugging Face directories, built offline.

    path = make_tiny_model("/tmp/tiny", arch="qwen2", hidden_size=64, num_layers=2)
    AutoModelForCausalLM.from_pretrained(path); AutoTokenizer.from_pretrained(path)

No model hub is reachable from the machines agentrl is tested on, so tests, benchmarks and the
quickstart build their model here: a byte-level BPE tokenizer trained with the ``tokenizers``
library on a small built-in corpus (deterministic: the same corpus gives the same vocabulary),
a ChatML chat template with tool calls in the Hermes/Qwen ``<tool_call>{json}</tool_call>``
format, and a randomly initialised Llama- or Qwen2-shaped causal LM from a config. The result
is an ordinary HF directory that ``agentrl serve``, the trainer and ``from_pretrained`` load.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Literal

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


def build_tokenizer(vocab_size: int = 1024):  # type: ignore[no-untyped-def]
    """Train a deterministic byte-level BPE tokenizer and wrap it as an HF fast tokenizer."""
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
    tok.train_from_iterator(_corpus(), trainer=trainer)
    tok.add_tokens([AddedToken(m, special=False, normalized=False) for m in MARKERS])
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=EOT,
        bos_token=None,
        unk_token=None,
        chat_template=CHATML_TOOLS_TEMPLATE,
        model_max_length=4096,
    )
    return hf


def make_tiny_model(
    path: str | Path,
    *,
    arch: Literal["qwen2", "llama"] = "qwen2",
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
) -> Path:
    """Write a randomly initialised tiny causal LM and its tokenizer as an HF directory."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(vocab_size)
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
    config: Qwen2Config | LlamaConfig
    if arch == "qwen2":
        config = Qwen2Config(**common)
    elif arch == "llama":
        config = LlamaConfig(**common)
    else:
        raise ValueError(f"arch must be 'qwen2' or 'llama', got {arch!r}")
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    model.generation_config.eos_token_id = [common["eos_token_id"], common["pad_token_id"]]
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    (path / "agentrl_tiny.json").write_text(json.dumps({"arch": arch, "seed": seed}))
    logger.info("wrote tiny %s model (%d params) to %s", arch, model.num_parameters(), path)
    return path
