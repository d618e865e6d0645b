"""model.tiny.corpus_demos: the tiny model's tokenizer also learns the envs' words, from
train-split demonstrations only."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer

from agentrl.errors import ConfigError
from agentrl.tiny import build_tokenizer
from trainers.config import load_run_config
from trainers.sft import base_model, demonstrations

WORDS = ' checkbox "wooden bicycle" unchecked'


def test_a_corpus_turns_its_words_into_tokens_and_keeps_the_builtin_ones() -> None:
    plain = build_tokenizer()
    rich = build_tokenizer(corpus=[WORDS] * 8)
    assert len(plain(WORDS)["input_ids"]) >= 2 * len(rich(WORDS)["input_ids"])
    assert rich.tokenize(" bicycle") == ["Ġbicycle"]
    # the built-in corpus still comes first: its words stay single tokens
    assert rich.tokenize(" answer") == plain.tokenize(" answer") == ["Ġanswer"]
    assert build_tokenizer(corpus=[WORDS] * 8).get_vocab() == rich.get_vocab()  # deterministic


def _cfg(tmp_path: Path, corpus_demos: int):  # type: ignore[no-untyped-def]
    return load_run_config(
        None,
        [
            f"output_dir={tmp_path}",
            "name=c",
            "model.tiny.hidden_size=32",
            "model.tiny.num_layers=1",
            f"model.tiny.corpus_demos={corpus_demos}",
            "data.eval_fraction=0.5",
            "data.envs=[{id: gui/Browser-v0, kwargs: {task: open, backend: pillow, "
            "screenshots: false}}]",
        ],
    )


def test_the_base_model_tokenizer_learns_the_train_demonstrations_words(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, 32)
    tok = AutoTokenizer.from_pretrained(base_model(cfg))
    train = demonstrations(cfg.data, 32)  # the train split's first 32 (tests/test_splits.py)
    texts = ["\n".join(m.text for m in c.messages) for c in train]
    assert tok.get_vocab() == build_tokenizer(corpus=texts).get_vocab()
    target = texts[0].split('"')[1]  # 'Open the link "adjective noun".'
    assert len(tok.tokenize(" " + target)) == 2
    plain = AutoTokenizer.from_pretrained(base_model(_cfg(tmp_path / "plain", 0)))
    assert plain.get_vocab() == build_tokenizer().get_vocab()


def test_a_negative_count_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="corpus_demos must be >= 0"):
        _cfg(tmp_path, -1)
