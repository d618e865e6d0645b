"""InferenceClient's generate transports (aiohttp, httpx2): same answers, same failure rules."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator

import pytest

from agentrl.errors import ConfigError, ServerUnavailableError
from agentrl.inference.client import InferenceClient
from agentrl.inference.launch import ServerProcess
from agentrl.inference.protocol import SamplingParams
from agentrl.inference.wire import finish_reason_dict, generate_response

TRANSPORTS = ["aiohttp", "httpx2"]
GREEDY = SamplingParams(max_new_tokens=6, temperature=0.0)


def _answer() -> bytes:
    body = json.dumps(
        generate_response(
            rid="r",
            text="",
            output_ids=[7, 8],
            finish_reason=finish_reason_dict("length", length=2),
            prompt_tokens=3,
            weight_version=5,
            e2e_latency=0.0,
            output_logprobs=[-0.5, -0.25],
        )
    ).encode()
    head = (
        f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


class _AnswersOncePerConnection(asyncio.Protocol):
    """Answers the first request on a connection, then drops the connection on the next one
    without a word: what a pooled keep-alive connection looks like when the server closed it."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.Transport = transport  # type: ignore[assignment]
        self.buf, self.answered = b"", False

    def data_received(self, data: bytes) -> None:
        self.buf += data
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return
        head = self.buf[:end].lower()
        size = int(head.split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
        if len(self.buf) < end + 4 + size:
            return
        self.buf = self.buf[end + 4 + size :]
        if self.answered:
            self.transport.close()
        else:
            self.answered = True
            self.transport.write(_answer())


@pytest.fixture
async def flaky_url() -> AsyncIterator[str]:
    server = await asyncio.get_running_loop().create_server(
        _AnswersOncePerConnection, "127.0.0.1", 0
    )
    yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    server.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_pooled_connection_the_server_dropped_is_retried_not_failed(
    flaky_url: str, transport: str
) -> None:
    cfg = InferenceClient.Config(transport=transport)  # type: ignore[arg-type]
    async with InferenceClient([flaky_url], cfg) as client:
        for _ in range(3):  # the 2nd and 3rd go out on a dropped connection first
            done = await client.generate([1, 2, 3], GREEDY, session_id="t")
            assert done.output_ids == [7, 8] and done.output_logprobs == [-0.5, -0.25]
            assert done.weight_version == 5 and done.finish_reason == "length"


class _NeverAnswers(asyncio.Protocol):
    def data_received(self, data: bytes) -> None:
        pass


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_server_that_hangs_times_out_and_the_next_one_answers(
    flaky_url: str, transport: str
) -> None:
    hung = await asyncio.get_running_loop().create_server(_NeverAnswers, "127.0.0.1", 0)
    hung_url = f"http://127.0.0.1:{hung.sockets[0].getsockname()[1]}"
    cfg = InferenceClient.Config(transport=transport, timeout_s=0.5)  # type: ignore[arg-type]
    try:
        async with InferenceClient([hung_url, flaky_url], cfg) as client:
            done = await client.generate([1, 2, 3], GREEDY, session_id="t")  # tries hung first
            assert done.server == flaky_url and done.output_ids == [7, 8]
        async with InferenceClient([hung_url], cfg) as client:
            with pytest.raises(ServerUnavailableError, match="Timeout"):
                await client.generate([1, 2, 3], GREEDY)
    finally:
        hung.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_no_server_is_a_clear_error(transport: str) -> None:
    cfg = InferenceClient.Config(transport=transport, connect_timeout_s=2.0)  # type: ignore[arg-type]
    async with InferenceClient(["http://127.0.0.1:9"], cfg) as client:
        with pytest.raises(ServerUnavailableError, match=re.escape("127.0.0.1:9")):
            await client.generate([1], GREEDY)


async def test_transports_get_the_same_tokens(server: ServerProcess) -> None:
    got = {}
    for transport in TRANSPORTS:
        cfg = InferenceClient.Config(transport=transport)  # type: ignore[arg-type]
        async with InferenceClient([server.url], cfg) as client:
            got[transport] = await client.generate([5, 6, 7], GREEDY, session_id="s")
    a, b = got["aiohttp"], got["httpx2"]
    assert a.output_ids == b.output_ids and a.output_logprobs == b.output_logprobs
    assert a.server == b.server == server.url


def test_one_client_serves_one_event_loop_after_another(server: ServerProcess) -> None:
    client = InferenceClient([server.url])  # built outside any loop, as a driver may

    async def once() -> list[int]:
        return (await client.generate([5, 6, 7], GREEDY, session_id="s")).output_ids

    first = asyncio.run(once())
    assert asyncio.run(once()) == first  # a second loop: a fresh session, same answer
    asyncio.run(client.aclose())


def test_an_unknown_transport_names_the_choices() -> None:
    with pytest.raises(ConfigError, match="'aiohttp' or 'httpx2'"):
        InferenceClient(["http://127.0.0.1:1"], InferenceClient.Config(transport="curl"))  # type: ignore[arg-type]
