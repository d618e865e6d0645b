"""The vLLM dialect without a vLLM server: request bodies, answer parsing, url prefixes, the
launcher's command line and the digests that mirror vLLM's fused parameters."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch

from agentrl.errors import ConfigError, InferenceError
from agentrl.inference.backends import make_dialect, split_backend_url
from agentrl.inference.backends.sglang import SGLangDialect
from agentrl.inference.backends.vllm import VLLMDialect, VLLMDigests, VLLMServer
from agentrl.inference.client import InferenceClient
from agentrl.inference.protocol import SamplingParams


def test_request_body_is_vllm_token_api() -> None:
    body = json.loads(
        VLLMDialect().request_body(
            [1, 2, 3],
            SamplingParams(
                max_new_tokens=7, temperature=0.5, top_k=-1, stop_token_ids=(9,), seed=4
            ),
            True,
        )
    )
    assert body["token_ids"] == [1, 2, 3] and body["output_mode"] == "tokens"
    assert body["sampling_params"] == {
        "max_tokens": 7,
        "temperature": 0.5,
        "top_p": 1.0,
        "top_k": 0,
        "detokenize": False,
        "logprobs": 0,
        "stop_token_ids": [9],
        "seed": 4,
    }
    no_lp = json.loads(VLLMDialect().request_body([1], SamplingParams(), False))
    assert "logprobs" not in no_lp["sampling_params"]


def answer(finish: str, spans: list[dict[str, object]]) -> dict[str, object]:
    return {
        "choices": [
            {
                "index": 0,
                "finish_reason": finish,
                "token_ids": [4, 5, 6],
                "logprobs": {"content": [{"token_id": t, "logprob": -t / 10} for t in (4, 5, 6)]},
                "weight_versions": spans,
            }
        ],
        "usage": {"prompt_tokens": 3, "prompt_tokens_details": {"cached_tokens": 2}},
    }


def test_completion_parsing_versions_and_abort() -> None:
    d = VLLMDialect()
    one = d.completion(answer("length", [{"version": "7", "start": 0, "end": 3}]), "u", 0.1)
    assert one.output_ids == [4, 5, 6] and one.output_logprobs == [-0.4, -0.5, -0.6]
    assert (one.finish_reason, one.weight_version, one.prompt_tokens) == ("length", 7, 3)
    assert one.cached_tokens == 2 and one.output_versions == []
    spans = [{"version": "1", "start": 0, "end": 1}, {"version": "2", "start": 1, "end": 3}]
    two = d.completion(answer("abort", spans), "u", 0.1)
    assert two.finish_reason == "abort" and two.weight_version == 2
    assert two.output_versions == [1, 2, 2]
    default = d.completion(answer("stop", [{"version": "default", "start": 0, "end": 3}]), "u", 0)
    assert default.weight_version == 0
    with pytest.raises(InferenceError, match="finish_reason 'error'"):
        d.completion(answer("error", []), "u", 0.1)


def test_url_prefix_picks_the_dialect() -> None:
    assert split_backend_url("vllm+http://h:1/", "sglang") == ("vllm", "http://h:1")
    assert split_backend_url("http://h:1", "vllm") == ("vllm", "http://h:1")
    assert isinstance(make_dialect("embedded"), SGLangDialect)
    with pytest.raises(ConfigError, match="unknown inference backend 'tgi'"):
        make_dialect("tgi")
    client = InferenceClient(["http://a:1", "vllm+http://b:2"])
    assert client.backends == {"http://a:1": "sglang", "http://b:2": "vllm"}
    assert client._servers[1].generate_url == "http://b:2/inference/v1/generate"


def test_launcher_command_passes_flags_through() -> None:
    cfg = VLLMServer.Config(
        model="/m",
        python="/venv/bin/python",
        port=8123,
        max_model_len=512,
        enforce_eager=True,
        extra_args=["--block-size", "16"],
    )
    server = VLLMServer(cfg)
    cmd = server.command()
    assert cmd[:3] == ["/venv/bin/python", "-m", "agentrl.inference.backends.vllm_entry"]
    assert cmd[cmd.index("--port") + 1] == "8123" and cmd[-2:] == ["--block-size", "16"]
    assert "--enable-scale-out" in cmd and "--enforce-eager" in cmd
    assert json.loads(cmd[cmd.index("--weight-transfer-config") + 1]) == {"backend": "agentrl_file"}
    assert cmd[cmd.index("--logprobs-mode") + 1] == "processed_logprobs"
    env = server.environment()
    assert env["VLLM_SERVER_DEV_MODE"] == "1" and env["VLLM_HOST_IP"] == "127.0.0.1"
    assert server.client_url == "vllm+http://127.0.0.1:8123"


def sha(t: torch.Tensor) -> str:
    return hashlib.sha256(t.contiguous().view(-1).view(torch.uint8).numpy().data).hexdigest()


def test_digests_follow_vllm_fusion_and_vocab_padding() -> None:
    q, k, v = torch.randn(4, 2), torch.randn(2, 2), torch.randn(2, 2)
    gate, up, emb = torch.randn(3, 2), torch.randn(3, 2), torch.randn(70, 2)
    dig = VLLMDigests()
    for name, t in [
        ("l.0.self_attn.k_proj.weight", k),
        ("l.0.self_attn.q_proj.weight", q),
        ("l.0.mlp.up_proj.weight", up),
        ("l.0.self_attn.v_proj.weight", v),
        ("l.0.mlp.gate_proj.weight", gate),
        ("m.embed_tokens.weight", emb),
    ]:
        dig.add(name, t)
    assert dig.digests == {
        "l.0.self_attn.qkv_proj.weight": sha(torch.cat([q, k, v])),
        "l.0.mlp.gate_up_proj.weight": sha(torch.cat([gate, up])),
        "m.embed_tokens.weight": sha(torch.cat([emb, torch.zeros(58, 2)])),
    }


def test_serve_execs_the_backend_with_flags(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from agentrl.inference import cli

    seen: list[tuple[str, list[str], dict[str, str]]] = []
    monkeypatch.setattr(cli.os, "execvpe", lambda f, argv, env: seen.append((f, argv, env)))
    cli.serve(tmp_path, port=8011, backend="vllm", python="/v/bin/python", extra=["--foo", "1"])
    # (an interpreter other than this one is not probed: it may hold vllm while this one does not)
    f, argv, env = seen[0]
    assert f == "/v/bin/python" and argv[1:3] == ["-m", "agentrl.inference.backends.vllm_entry"]
    assert argv[argv.index("--model") + 1] == str(tmp_path) and argv[-2:] == ["--foo", "1"]
    assert env["VLLM_SERVER_DEV_MODE"] == "1"
    cli.serve(tmp_path, port=8012, backend="sglang", python="/s/bin/python")
    assert seen[1][1][1:3] == ["-m", "sglang.launch_server"]
    with pytest.raises(ConfigError, match="only"):
        cli.serve(tmp_path, backend="embedded", extra=["--foo"])
