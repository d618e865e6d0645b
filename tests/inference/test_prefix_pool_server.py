"""The prefix pool through the real server: a conversation's second turn, sent over HTTP
after the first finished, copies the first turn's KV (``/metrics`` counts it) and its
logprobs still equal a teacher-forced forward; ``--no-prefix-pool`` turns it off."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from agentrl.inference.launch import ServerProcess
from tests.inference.test_inference_server import (
    engine_stats,
    gen_body,
    get,
    post,
    teacher_forced,
)


@pytest.fixture(scope="module", params=["pool", "no-pool"])
def pool_server(
    request: pytest.FixtureRequest, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ServerProcess, bool]]:
    log = tmp_path_factory.mktemp("logs") / f"{request.param}.log"
    extra = ["--no-prefix-pool"] if request.param == "no-pool" else []
    cfg = ServerProcess.Config(
        model=str(tiny_model), max_batch_size=8, log_path=str(log), num_threads=1, extra_args=extra
    )
    with ServerProcess(cfg) as proc:
        yield proc, request.param == "pool"


async def _metrics(url: str) -> dict[str, float]:
    text = (await get(url, "/metrics")).text
    return {
        line.split()[0]: float(line.split()[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }


async def test_second_turn_copies_the_first_turns_kv(
    pool_server: tuple[ServerProcess, bool], tiny_model: Path
) -> None:
    server, on = pool_server
    ref: Any = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    sp = {"max_new_tokens": 10, "temperature": 1.0, "ignore_eos": True, "seed": 4}
    turn1 = list(range(40, 90))
    first = (await post(server.url, "/generate", gen_body(turn1, **sp))).json()
    turn2 = [*turn1, *first["output_ids"], *range(300, 320)]
    second = (await post(server.url, "/generate", gen_body(turn2, **sp))).json()
    served = torch.tensor([lp for lp, _tok, _ in second["meta_info"]["output_token_logprobs"]])
    want = teacher_forced(ref, turn2, second["output_ids"], 1.0)
    assert (served - want).abs().max().item() <= 1e-5
    m = await _metrics(server.url)
    if on:  # turn 1's prompt and answer (less its last, never fed, token) of turn 2's prompt
        shared = len(turn1) + len(first["output_ids"]) - 1
        assert m["agentrl_pool_hit_rate"] >= shared / (len(turn1) + len(turn2)) - 1e-9
        assert m["agentrl_pool_entries"] >= 1
    else:
        assert m["agentrl_pool_hit_rate"] == 0 and m["agentrl_pool_entries"] == 0


async def test_flush_cache_drops_the_parked_prefixes(
    pool_server: tuple[ServerProcess, bool],
) -> None:
    """/flush_cache (SGLang's name) forgets the pool: the next turn prefills from scratch."""
    server, on = pool_server
    sp = {"max_new_tokens": 4, "temperature": 0.0, "ignore_eos": True}
    turn1 = list(range(100, 140))
    first = (await post(server.url, "/generate", gen_body(turn1, **sp))).json()
    parked = (await _metrics(server.url))["agentrl_pool_entries"]
    flushed = (await post(server.url, "/flush_cache", {})).json()
    assert flushed["success"] is True and flushed["dropped"] == parked
    assert (await _metrics(server.url))["agentrl_pool_entries"] == 0
    before = (await engine_stats(server.url))["pool_hit_tokens"]
    turn2 = [*turn1, *first["output_ids"], 7, 8]
    await post(server.url, "/generate", gen_body(turn2, **sp))
    assert (await engine_stats(server.url))["pool_hit_tokens"] == before  # nothing reused
    assert parked >= (1 if on else 0)
