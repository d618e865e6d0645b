"""The vLLM dialect without a vLLM server: request bodies, answer parsing, url prefixes, the
launcher's command line and the digests that mirror vLLM's fused parameters."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os

import pytest
import torch

from agentrl.errors import ConfigError, InferenceError
from agentrl.inference.backends import make_dialect, split_backend_url
from agentrl.inference.backends.sglang import SGLangDialect
from agentrl.inference.backends.vllm import VLLMDialect, VLLMDigests, VLLMServer
from agentrl.inference.client import InferenceClient
from agentrl.inference.protocol import Completion, SamplingParams


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
    assert env["VLLM_RPC_BASE_PATH"] == server.rpc_dir  # its own socket folder, made at start
    assert not os.path.exists(server.rpc_dir)
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
    # the embedded server takes flags after `--` too; its own parser refuses unknown ones
    with pytest.raises(SystemExit) as exit_info:
        cli.serve(tmp_path, backend="embedded", extra=["--foo"])
    assert exit_info.value.code == 2


def test_top_logprobs_ask_one_more_and_sort_by_rank() -> None:
    d = VLLMDialect()
    body = json.loads(d.request_body([1], SamplingParams(top_logprobs=2), True))
    assert body["sampling_params"]["logprobs"] == 3  # the sampled token is listed first
    entry = {
        "token_id": 9,
        "logprob": -3.0,
        "rank": 4,
        "top_logprobs": [  # vLLM's order: the sampled token, then the best others
            {"token_id": 9, "logprob": -3.0, "rank": 4},
            {"token_id": 1, "logprob": -0.1, "rank": 1},
            {"token_id": 2, "logprob": -1.0, "rank": 2},
        ],
    }
    data = {
        "choices": [{"token_ids": [9], "finish_reason": "length", "logprobs": {"content": [entry]}}]
    }
    c = d.completion(data, "u", 0.0)
    assert c.output_top_logprobs == [[(-0.1, 1), (-1.0, 2), (-3.0, 9)]]  # the caller keeps k


async def test_a_vllm_stream_is_cut_and_aborted_by_its_request_id() -> None:
    """A stand-in for vLLM's generate route (its stream shape, as ``serving.py`` writes it)."""
    from aiohttp import web

    seen: dict[str, object] = {}
    aborted = asyncio.Event()

    async def generate(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        seen["body"] = body
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        rid = body["request_id"]
        for i in range(50):
            if aborted.is_set():
                chunk = {"finish_reason": "abort", "token_ids": [], "weight_versions": [
                    {"version": "3", "start": 0, "end": i}]}  # fmt: skip
            else:
                lp = {"content": [{"token_id": 10 + i, "logprob": -i / 10}]}
                chunk = {"token_ids": [10 + i], "logprobs": lp, "finish_reason": None}
            event = {"request_id": f"generate-tokens-{rid}", "choices": [{"index": 0, **chunk}]}
            await resp.write(f"data: {json.dumps(event)}\n\n".encode())
            if aborted.is_set():
                break
            await asyncio.sleep(0.01)
        usage = {"prompt_tokens": 3, "completion_tokens": i, "total_tokens": 3 + i}
        await resp.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def abort(request: web.Request) -> web.Response:
        seen["abort"] = (await request.json())["request_ids"]
        aborted.set()
        return web.Response()

    app = web.Application()
    app.router.add_post("/inference/v1/generate", generate)
    app.router.add_post("/inference/v1/abort_requests", abort)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        async with InferenceClient([f"vllm+http://127.0.0.1:{port}"]) as client:
            items = [
                x
                async for x in client.generate_stream(
                    [1, 2, 3],
                    SamplingParams(max_new_tokens=50),
                    cut=lambda ids: 4 if len(ids) >= 6 else None,
                )
            ]
    finally:
        await runner.cleanup()
    body = seen["body"]
    assert isinstance(body, dict) and body["stream"] is True and body["output_mode"] == "tokens"
    assert seen["abort"] == [f"generate-tokens-{body['request_id']}"]
    done = items[-1]
    assert isinstance(done, Completion)
    assert done.output_ids == [10, 11, 12, 13] and done.finish_reason == "stop"
    assert done.output_logprobs == [0.0, -0.1, -0.2, -0.3]
    assert done.weight_version == 3 and done.prompt_tokens == 3
    assert sum(len(x) for x in items[:-1] if isinstance(x, list)) == 6  # nothing after the cut
