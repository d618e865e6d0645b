"""In-process pieces of the inference stack: sampling, weights, wire helpers, tool-call parsing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from agentrl.errors import ConfigError, InferenceError
from agentrl.inference.cli import serve
from agentrl.inference.launch import ServerProcess
from agentrl.inference.openai_chat import message_json, reply_message
from agentrl.inference.sampling import RowSampling, sample_rows
from agentrl.inference.weights import (
    apply_named_tensors,
    checksum_named_tensors,
    load_safetensors_bytes,
    safetensors_buckets,
    safetensors_bytes,
    validate_named_tensors,
)
from agentrl.inference.wire import WireSamplingParams, parse_weight_version
from agentrl.tool_parsers import get_tool_parser


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_greedy_row_picks_argmax_with_raw_logprob() -> None:
    logits = torch.randn(3, 50, generator=gen(0))
    out = sample_rows(logits, [RowSampling(temperature=0.0)] * 3)
    assert out.tokens == logits.argmax(-1).tolist()
    expected = torch.log_softmax(logits, -1).gather(1, logits.argmax(-1, keepdim=True))[:, 0]
    assert torch.allclose(torch.tensor(out.logprobs), expected)


def test_sampled_logprob_is_unfiltered_tempered_log_softmax() -> None:
    logits = torch.randn(4, 64, generator=gen(1))
    rows = [RowSampling(temperature=0.5, top_k=5, top_p=0.9, generator=gen(i)) for i in range(4)]
    out = sample_rows(logits, rows)
    ref = torch.log_softmax(logits / 0.5, -1)
    for i, tok in enumerate(out.tokens):
        assert tok in logits[i].topk(5).indices.tolist()  # the filter decided the draw
        assert out.logprobs[i] == pytest.approx(ref[i, tok].item(), abs=1e-6)  # not the logprob


def test_top_k_one_and_tiny_top_p_are_greedy() -> None:
    logits = torch.randn(2, 40, generator=gen(2))
    rows = [
        RowSampling(temperature=1.0, top_k=1, generator=gen(0)),
        RowSampling(temperature=1.0, top_p=1e-6, generator=gen(1)),
    ]
    assert sample_rows(logits, rows).tokens == logits.argmax(-1).tolist()


def test_seeded_rows_reproduce_whatever_the_batch() -> None:
    logits = torch.randn(5, 30, generator=gen(3))
    alone = sample_rows(logits[2:3], [RowSampling(temperature=1.0, generator=gen(9))]).tokens[0]
    rows = [RowSampling(temperature=1.0, generator=gen(100 + i)) for i in range(5)]
    rows[2] = RowSampling(temperature=1.0, generator=gen(9))
    assert sample_rows(logits, rows).tokens[2] == alone


def test_top_logprobs_are_sorted_alternatives() -> None:
    logits = torch.randn(1, 20, generator=gen(4))
    out = sample_rows(logits, [RowSampling(temperature=0.0, top_logprobs=3)])
    top = out.top[0]
    assert top is not None and [t for _, t in top] == logits[0].topk(3).indices.tolist()


def test_checksums_track_values_and_buckets_round_trip() -> None:
    named = {f"w{i}": torch.randn(64, 64, generator=gen(i)) for i in range(6)}
    blobs = list(safetensors_buckets(named.items(), bucket_bytes=40_000))
    assert len(blobs) == 3  # 16 KiB tensors, two per bucket
    back: dict[str, torch.Tensor] = {}
    for blob in blobs:
        back.update(load_safetensors_bytes(blob))
    assert checksum_named_tensors(back.items()) == checksum_named_tensors(named.items())
    named["w0"][0, 0] += 1.0
    assert (
        checksum_named_tensors(back.items()).overall
        != checksum_named_tensors(named.items()).overall
    )
    assert checksum_named_tensors(named.items(), dtype=torch.bfloat16).dtype == "bfloat16"


def test_tied_tensors_are_sent_once() -> None:
    shared = torch.randn(8, 4)
    blobs = list(safetensors_buckets([("embed.weight", shared), ("lm_head.weight", shared)]))
    assert list(load_safetensors_bytes(blobs[0])) == ["embed.weight"]


def test_safetensors_bytes_reads_back_with_the_library_and_ours() -> None:
    from safetensors.torch import load, save

    named = {
        "bf16": torch.randn(3, 5).to(torch.bfloat16),
        "f32": torch.randn(7),
        "flag": torch.tensor([True, False, True]),
        "empty": torch.zeros(0, 4),
        "scalar": torch.tensor(3.0),
        "i64": torch.arange(5),
    }
    ours = safetensors_bytes(named)
    for back in (load(ours), load_safetensors_bytes(ours), load_safetensors_bytes(save(named))):
        assert set(back) == set(named)
        for name, t in named.items():
            assert back[name].dtype == t.dtype and torch.equal(back[name], t), name


def test_bad_updates_are_refused_before_any_copy() -> None:
    model = torch.nn.Linear(4, 3)
    before = checksum_named_tensors(model.state_dict().items())
    with pytest.raises(ConfigError, match="not in the served model"):
        apply_named_tensors(model, {"weight": torch.ones(3, 4), "nope": torch.ones(1)})
    with pytest.raises(ConfigError, match=r"expected \(3, 4\)"):
        validate_named_tensors(model.state_dict(), {"weight": torch.ones(4, 3)})
    assert checksum_named_tensors(model.state_dict().items()) == before
    with pytest.raises(ConfigError, match="not a safetensors blob"):
        load_safetensors_bytes(b"garbage")


def test_wire_helpers() -> None:
    assert (
        parse_weight_version("default") == 0
        and parse_weight_version("7") == 7
        and parse_weight_version(3) == 3
    )
    sp = WireSamplingParams(frequency_penalty=0.5, stop="x")
    assert sp.unsupported() == ["frequency_penalty"] and sp.stop_strings() == ("x",)
    # only what the request set, in the declared order; an "off" value sent explicitly is fine
    parsed = WireSamplingParams.model_validate_json('{"n": 2, "min_p": 0.1, "logit_bias": null}')
    assert parsed.unsupported() == ["min_p", "n"]
    assert WireSamplingParams(min_p=0.0, repetition_penalty=1.0).unsupported() == []


def test_chat_replies_split_tool_calls_with_the_shared_parser() -> None:
    text = 'Let me compute.<tool_call>{"name": "calculator", "arguments": {"expression": "12 * 7"}}</tool_call>'
    hermes = get_tool_parser("hermes")
    message, errors = reply_message(text, "stop", hermes, tools_on=True)
    body = message_json(message)
    assert not errors and body["content"] == "Let me compute."
    assert body["tool_calls"][0]["function"]["name"] == "calculator"
    assert json.loads(body["tool_calls"][0]["function"]["arguments"]) == {"expression": "12 * 7"}
    broken = "<tool_call>{not json}</tool_call>"
    message, errors = reply_message(broken, "stop", hermes, tools_on=True)
    assert message.content == broken and not message.tool_calls and errors


def test_serve_command_refuses_other_backends_and_bad_paths(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="vllm is not installed"):
        serve(tmp_path, backend="vllm")
    with pytest.raises(ConfigError, match="unknown"):
        serve(tmp_path, backend="tgi")
    with pytest.raises(ConfigError, match="not a directory"):
        serve(tmp_path / "missing")


def test_server_process_reports_a_failed_start_with_its_log(tmp_path: Path) -> None:
    proc = ServerProcess(
        ServerProcess.Config(
            model=str(tmp_path / "no-model"),
            startup_timeout_s=120,
            log_path=str(tmp_path / "server.log"),
        )
    )
    with pytest.raises(InferenceError, match="exited with code"):
        proc.start()
    assert not proc.alive() and "no-model" in proc.log_tail()


def test_text_stream_holds_back_what_may_become_a_call_or_a_stop() -> None:
    from agentrl.inference.openai_chat import TextStream

    s = TextStream(hold=["<tool_call>"], stops=["STOP"], strip=True)
    got = [
        s.push(t)
        for t in ("  Hel", "  Hello wor", "  Hello world <tool", "  Hello world <tool_call>{")
    ]
    assert "".join(got) == "Hello world"  # nothing of the call (or its opening) went out
    assert s.finish("Hello world") == ""
    plain = TextStream(stops=["STOP"])
    assert plain.push("ab ST") == "ab"  # "ST" and the character before may start "STOP"
    assert plain.push("ab STOP and more") == " " and plain.push("ab STOP and more!") == ""
    assert plain.finish("ab ") == ""
    assert TextStream().push("caf\ufffd") == "caf"  # an unfinished UTF-8 character waits


def test_chat_requests_are_validated_with_openai_errors() -> None:
    from agentrl.inference.openai_chat import OpenAIError, parse_chat_request

    for raw, param in (
        (b"{", None),
        (b'{"messages": [{"role": "user", "content": "x"}], "n": 3}', "n"),
        (b'{"messages": []}', "messages"),
        (b'{"messages": [{"role": "user", "content": "x"}], "temperature": 9}', "temperature"),
    ):
        with pytest.raises(OpenAIError) as e:
            parse_chat_request(raw)
        assert e.value.status == 400 and e.value.body()["error"]["param"] == param


def test_the_server_decodes_through_the_rust_tokenizer_only_where_it_gives_the_same_text() -> None:
    import random

    from agentrl.inference.server import text_decoder
    from agentrl.tiny import build_tokenizer

    tok = build_tokenizer()
    decode = text_decoder(tok)
    assert decode.__name__ == "fast"
    rng = random.Random(0)
    for _ in range(50):  # random ids: special tokens, markers and broken UTF-8 included
        ids = [rng.randrange(len(tok)) for _ in range(rng.randrange(1, 40))]
        for skip in (True, False):
            assert decode(ids, skip) == tok.decode(ids, skip_special_tokens=skip)

    class WrapperDiffers:  # an HF wrapper that post-processes what its Rust object decodes
        _tokenizer = tok._tokenizer

        def __getattr__(self, name: str) -> object:
            return getattr(tok, name)

        def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
            return tok.decode(ids, skip_special_tokens=skip_special_tokens).replace(" ,", ",")

    wrapper = WrapperDiffers()
    cleaned = text_decoder(wrapper)
    assert cleaned.__name__ == "slow"
    ids = tok.encode("a , b")
    assert cleaned(ids, True) == wrapper.decode(ids, skip_special_tokens=True) == "a, b"
