"""The embedded server behind HttpGuard, as a real process on loopback: the optional bearer token
(``--api-key``) is checked before a body is read, bodies over ``--max-body-mb`` get 413 with and
without a Content-Length, and weight sync over HTTP still works (its route has its own cap)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx2
import pytest
import torch
from transformers import AutoModelForCausalLM

from agentrl.errors import InferenceError
from agentrl.inference.client import InferenceClient
from agentrl.inference.launch import ServerProcess
from agentrl.inference.protocol import SamplingParams
from agentrl.inference.weight_sync import HTTPTensorWeightSync
from agentrl.inference.weights import checksum_named_tensors
from tests.toolserver.test_toolserver_guard import raw_head

KEY = "inference-key-0123456789"
PROMPT = [5, 6, 7, 8, 9]
GENERATE = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 2, "temperature": 0}}


@pytest.fixture(scope="module")
def keyed(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server with a key, a 0.25 MiB body cap, and a 2 MiB cap on weight buckets."""
    log = tmp_path_factory.mktemp("logs") / "keyed.log"
    args = ["--api-key", KEY, "--max-body-mb", "0.25", "--max-weight-body-mb", "2"]
    cfg = ServerProcess.Config(
        model=str(tiny_model), log_path=str(log), num_threads=1, extra_args=args
    )
    with ServerProcess(cfg) as proc:
        yield proc


async def chunks(n_mb: int) -> AsyncIterator[bytes]:
    yield b'{"input_ids": [5, 6, 7], "text_pad": "'
    for _ in range(n_mb):
        yield b"a" * (1 << 20)
    yield b'"}'


def test_the_key_is_checked_before_any_body(keyed: ServerProcess) -> None:
    assert httpx2.get(keyed.url + "/health").status_code == 200  # probes need no key
    for path in ("/generate", "/update_weights_from_tensor", "/v1/chat/completions"):
        # a 256 MB body is announced and never sent: the answer cannot have waited for it
        status, body = raw_head(
            keyed.url, f"POST {path} HTTP/1.1\nHost: x\nContent-Length: {256 << 20}\n"
        )
        assert status == 401 and b"bearer token" in body, (path, body)
    assert httpx2.get(keyed.url + "/get_weight_version").status_code == 401
    wrong = {"Authorization": "Bearer nope"}
    assert httpx2.post(keyed.url + "/generate", json=GENERATE, headers=wrong).status_code == 401
    ok = httpx2.post(
        keyed.url + "/generate", json=GENERATE, headers={"Authorization": f"Bearer {KEY}"}
    )
    assert ok.status_code == 200 and len(ok.json()["output_ids"]) == 2


def test_weight_bodies_over_their_cap_are_refused_unread(keyed: ServerProcess) -> None:
    head = (
        f"POST /update_weights_from_tensor?flush=0 HTTP/1.1\nHost: x\n"
        f"Authorization: Bearer {KEY}\nContent-Length: {17 << 30}\n"
    )
    status, body = raw_head(keyed.url, head)
    assert status == 413 and b"at most 2 MiB" in body and b"--max-weight-body-mb" in body


async def test_client_with_the_key_generates_and_syncs_weights_over_http(
    keyed: ServerProcess, tiny_model_b: Path
) -> None:
    new = AutoModelForCausalLM.from_pretrained(tiny_model_b, dtype=torch.float32).state_dict()
    assert sum(t.numel() * t.element_size() for t in new.values()) > 0.25 * (1 << 20)
    async with InferenceClient([keyed.url], InferenceClient.Config(api_key=KEY)) as client:
        done = await client.generate(PROMPT, SamplingParams(max_new_tokens=3, temperature=0))
        assert len(done.output_ids) == 3
        sync = HTTPTensorWeightSync(client)  # one bucket of the whole model: over 0.25 MiB
        await sync.push(new.items(), version=5)
        assert await sync.verify()
        served = (await client.weights_checksum())[keyed.url]
        assert served.overall == checksum_named_tensors(new.items()).overall
        assert served.weight_version == 5
        await sync.close()
    async with InferenceClient([keyed.url], InferenceClient.Config(api_key="wrong")) as client:
        with pytest.raises(InferenceError, match=r"\(401\).*bearer token"):
            await client.generate(PROMPT, SamplingParams(max_new_tokens=1))


async def test_bodies_over_the_cap_get_413_with_and_without_content_length(
    keyed: ServerProcess,
) -> None:
    auth = {"Authorization": f"Bearer {KEY}", "content-type": "application/json"}
    async with httpx2.AsyncClient(base_url=keyed.url, headers=auth, timeout=60) as c:
        size = len(b"".join([x async for x in chunks(1)]))
        for headers in ({"content-length": str(size)}, {}):
            r = await c.post("/generate", content=chunks(1), headers=headers)
            assert r.status_code == 413, r.text
            msg = r.json()["error"]["message"]
            assert "at most 0.25 MiB" in msg and "--max-body-mb" in msg
        assert (await c.post("/generate", json=GENERATE)).status_code == 200  # still serving


def test_no_key_by_default_but_still_a_body_cap(server: ServerProcess) -> None:
    assert httpx2.post(server.url + "/generate", json=GENERATE).status_code == 200
    status, body = raw_head(
        server.url, f"POST /generate HTTP/1.1\nHost: x\nContent-Length: {65 << 20}\n"
    )
    assert status == 413 and b"at most 64 MiB" in body
