"""The collective weight sync over gloo on CPU: ``SGLangWeightSync(mode="distributed")`` as rank
0 broadcasting to real embedded servers (loopback), which join through SGLang's
``/init_weights_update_group`` and receive through ``/update_weights_from_distributed``."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
import torch
from transformers import AutoModelForCausalLM

from agentrl.errors import InferenceError
from agentrl.inference.client import InferenceClient
from agentrl.inference.launch import ServerProcess, free_port
from agentrl.inference.server_collective import join_update_group
from agentrl.inference.weight_sync import SGLangWeightSync
from agentrl.inference.weight_sync.base import buckets
from agentrl.inference.weights import checksum_named_tensors
from agentrl.sockets import listen_socket

PROMPT = [5, 6, 7, 8, 9]
BUCKET = 32 << 10  # the tiny model's tensors make several buckets


def model(path: Path) -> Any:
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def sync(client: InferenceClient, group: str = "wsd") -> SGLangWeightSync:
    cfg = SGLangWeightSync.Config(
        mode="distributed",
        backend="gloo",
        bucket_bytes=BUCKET,
        master_port=free_port(),
        group_name=group,
        group_timeout_s=60,
    )
    return SGLangWeightSync(client, cfg)


async def greedy(http: httpx2.AsyncClient, url: str) -> dict[str, Any]:
    body = {
        "input_ids": PROMPT,
        "return_logprob": True,
        "sampling_params": {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True},
    }
    resp = await http.post(url + "/generate", json=body)
    assert resp.status_code == 200, resp.text
    return resp.json()


def teacher_forced(ref: Any, output: list[int]) -> tuple[list[int], torch.Tensor]:
    """Greedy tokens and their logprobs under ``ref``, from one full-sequence forward."""
    seq = torch.tensor([PROMPT + output])
    with torch.no_grad():
        logits = ref(input_ids=seq).logits[0, len(PROMPT) - 1 : -1].float()  # (C, V)
    logp = torch.log_softmax(logits, -1)
    return logp.argmax(-1).tolist(), logp.gather(1, torch.tensor(output)[:, None])[:, 0]


async def served_checksum(http: httpx2.AsyncClient, url: str) -> tuple[str, int]:
    body = (await http.get(url + "/weights_checksum", params={"per_tensor": 0})).json()
    return body["checksum"], body["weight_version"]


@pytest.fixture(scope="module")
def second_server(tiny_model: Path) -> Iterator[ServerProcess]:
    cfg = ServerProcess.Config(model=str(tiny_model), max_batch_size=8, num_threads=1)
    with ServerProcess(cfg) as proc:
        yield proc


@pytest.mark.parametrize("n_servers", [1, 2])
async def test_broadcast_serves_the_new_weights(
    server: ServerProcess,
    second_server: ServerProcess,
    tiny_model: Path,
    tiny_model_b: Path,
    n_servers: int,
) -> None:
    urls = [server.url, second_server.url][:n_servers]
    ref_b = model(tiny_model_b)
    b = ref_b.state_dict()
    assert len(list(buckets(b.items(), BUCKET))) >= 2
    version = 10 + n_servers
    async with InferenceClient(urls) as client:
        ws = sync(client)
        await ws.push(b.items(), version)
        assert await ws.verify()
        for url in urls:
            report = ws.last_report[url]
            assert report.version == version and not report.mismatched
            assert report.matched == len(b)
            out = await greedy(client.http, url)
            ids = out["output_ids"]
            argmax, logp = teacher_forced(ref_b, ids)
            assert ids == argmax  # greedy under the new weights
            served = torch.tensor([lp for lp, _, _ in out["meta_info"]["output_token_logprobs"]])
            assert torch.allclose(served, logp, atol=1e-4), (served, logp)
            assert out["meta_info"]["weight_version"] == version
        # Back to model a: verify hashes ahead now (every server showed /weights_checksum).
        a = model(tiny_model).state_dict()
        await ws.push(a.items(), version + 100)
        assert await ws.verify() and ws.hash_ahead
        for url in urls:
            want = checksum_named_tensors(a.items()).overall
            assert await served_checksum(client.http, url) == (want, version + 100)
        await ws.close()
        for url in urls:  # close() destroyed the servers' group
            resp = await client.http.post(
                url + "/destroy_weights_update_group", json={"group_name": "wsd"}
            )
            assert resp.status_code == 400 and "no weights update group" in resp.text


async def test_bad_names_and_shapes_are_refused_and_change_nothing(
    server: ServerProcess, tiny_model: Path, tiny_model_b: Path
) -> None:
    a, b = model(tiny_model).state_dict(), model(tiny_model_b).state_dict()
    async with InferenceClient([server.url]) as client:
        ws = sync(client, group="bad")
        await ws.push(a.items(), 20)
        before = await served_checksum(client.http, server.url)
        name = next(n for n in b if "layernorm" in n)
        # The bad tensor comes first: its bucket is refused before any other is sent. (Each
        # bucket is applied on its own, as in SGLang: buckets before a refused one stay.)
        wrong_shape = [(name, torch.zeros(3, 3)), *((n, t) for n, t in b.items() if n != name)]
        with pytest.raises(InferenceError, match=rf"shape mismatch .*{name}: got \(3, 3\)"):
            await ws.push(wrong_shape, 21)
        with pytest.raises(InferenceError, match="not in the served model"):
            await ws.push([("nope.weight", torch.ones(2)), *b.items()], 21)
        assert await served_checksum(client.http, server.url) == before  # nothing applied
        await ws.push(b.items(), 22)  # a fresh group replaces the failed one
        assert await ws.verify()
        url = server.url + "/update_weights_from_distributed"
        malformed: list[tuple[dict[str, Any], list[str]]] = [
            (
                {"names": ["x"], "dtypes": ["floaty"], "shapes": [[1]]},
                ["not a torch dtype", "the group 'bad' was dropped"],
            ),  # its broadcasts never land
            ({"names": ["x"], "dtypes": ["float32"], "shapes": "no"}, ["invalid request"]),
            ({"names": ["x"], "dtypes": [], "shapes": [[1]]}, ["no weights update group 'bad'"]),
        ]
        for body, messages in malformed:
            resp = await client.http.post(url, json={**body, "group_name": "bad"})
            assert resp.status_code == 400, resp.text
            assert all(m in resp.json()["message"] for m in messages), resp.text
        assert await served_checksum(client.http, server.url) == (
            checksum_named_tensors(b.items()).overall,
            22,
        )
        await ws.close()


async def test_update_before_init_is_refused(server: ServerProcess) -> None:
    body = {
        "names": ["model.norm.weight"],
        "dtypes": ["float32"],
        "shapes": [[128]],
        "group_name": "never-initialised",
    }
    async with httpx2.AsyncClient(timeout=30, trust_env=False) as http:
        before = await served_checksum(http, server.url)
        resp = await http.post(server.url + "/update_weights_from_distributed", json=body)
        assert resp.status_code == 400
        assert "POST /init_weights_update_group first" in resp.json()["message"]
        resp = await http.post(
            server.url + "/init_weights_update_group",
            json={
                "master_address": "127.0.0.1",
                "master_port": free_port(),
                "rank_offset": 1,
                "world_size": 2,
                "backend": "nccl",
            },
        )
        assert resp.status_code == 400 and "use backend gloo" in resp.text
        assert await served_checksum(http, server.url) == before


async def test_reinit_replaces_the_group_and_a_silent_trainer_times_out(
    server: ServerProcess, tiny_model_b: Path
) -> None:
    b = model(tiny_model_b).state_dict()
    name = "model.norm.weight"
    update = {
        "names": [name],
        "dtypes": ["float32"],
        "shapes": [list(b[name].shape)],
        "group_name": "silent",
        "weight_version": 31,
    }
    async with httpx2.AsyncClient(timeout=60, trust_env=False) as http:

        async def init() -> Any:
            port = free_port()
            join = asyncio.to_thread(
                join_update_group,
                address="127.0.0.1",
                port=port,
                rank=0,
                world_size=2,
                group_name="silent",
                backend="gloo",
                timeout_s=30,
                listen_fd=listen_socket("127.0.0.1", port).detach(),
            )
            post = http.post(
                server.url + "/init_weights_update_group",
                json={
                    "master_address": "127.0.0.1",
                    "master_port": port,
                    "rank_offset": 1,
                    "world_size": 2,
                    "group_name": "silent",
                    "backend": "gloo",
                    "timeout_s": 3,
                },
            )
            group, resp = await asyncio.gather(join, post)
            assert resp.status_code == 200 and resp.json()["success"], resp.text
            return group

        first = await init()
        second = await init()  # same name: replaces the first group on the server
        new = torch.full_like(b[name], 0.5)
        send = asyncio.to_thread(lambda: second.pg.broadcast(new, 0).wait())
        resp, _ = await asyncio.gather(
            http.post(server.url + "/update_weights_from_distributed", json=update), send
        )
        assert resp.status_code == 200 and resp.json()["weight_version"] == 31, resp.text
        sums = (await http.get(server.url + "/weights_checksum")).json()
        assert sums["tensors"][name] == checksum_named_tensors([(name, new)]).tensors[name]
        # Rank 0 never broadcasts: the server serves meanwhile, then gives up after timeout_s.
        waiting = asyncio.ensure_future(
            http.post(
                server.url + "/update_weights_from_distributed",
                json={**update, "weight_version": 32},
            )
        )
        await asyncio.sleep(0.2)
        assert (await http.get(server.url + "/health")).status_code == 200
        out = await greedy(http, server.url)
        assert not waiting.done()  # generation was served while the receive waited
        resp = await waiting
        assert resp.status_code == 500 and "group was dropped" in resp.text, resp.text
        assert out["meta_info"]["weight_version"] == 31 and len(out["output_ids"]) == 6
        assert (await greedy(http, server.url))["meta_info"]["weight_version"] == 31
        resp = await http.post(server.url + "/update_weights_from_distributed", json=update)
        assert resp.status_code == 400 and "init_weights_update_group first" in resp.text
        first.close()
        second.close()


async def test_a_server_that_left_the_group_fails_one_push_then_rejoins(
    server: ServerProcess, tiny_model_b: Path
) -> None:
    b = model(tiny_model_b).state_dict()
    async with InferenceClient([server.url]) as client:
        ws = sync(client, group="left")
        await ws.push(b.items(), 40)
        resp = await client.http.post(
            server.url + "/destroy_weights_update_group", json={"group_name": "left"}
        )
        assert resp.status_code == 200
        with pytest.raises(InferenceError, match="no weights update group 'left'"):
            await ws.push(b.items(), 41)  # refused at once; rank 0's broadcast does not hang
        await ws.push(b.items(), 42)  # a new group
        assert await ws.verify() and ws.last_report[server.url].version == 42
        await ws.close()
