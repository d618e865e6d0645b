"""The embedded server's HTTP tests, rerun with ``--engine dynamic`` (transformers' cache).

The default engine is the static one (``StaticRunner``); every test of
``test_inference_server.py`` (token-exact /generate, logprobs against teacher forcing, stop
reasons, abort, pause/resume, streaming, weight updates mid-request, OpenAI routes) runs again
here against a server whose engine is the dynamic ``ModelRunner``; plus /metrics on both.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agentrl.inference.launch import ServerProcess
from tests.inference.test_inference_server import *  # noqa: F403 (the tests, rerun here)
from tests.inference.test_inference_server import engine_stats, gen_body, get, post


@pytest.fixture(scope="module")
def server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("logs") / "dynamic.log"
    cfg = ServerProcess.Config(
        model=str(tiny_model),
        max_batch_size=32,
        log_path=str(log),
        num_threads=1,
        extra_args=["--engine", "dynamic"],
    )
    with ServerProcess(cfg) as proc:
        yield proc


async def test_dynamic_engine_serves_and_reports_metrics(server: ServerProcess) -> None:
    assert (await engine_stats(server.url))["engine"] == "dynamic"
    r = await post(server.url, "/generate", gen_body([5, 6, 7], max_new_tokens=4, ignore_eos=True))
    assert r.status_code == 200
    text = (await get(server.url, "/metrics")).text
    values = {
        line.split()[0]: float(line.split()[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }
    assert values["agentrl_tokens_generated"] >= 4 and values["agentrl_queue_length"] == 0
    assert values["agentrl_tokens_per_s"] > 0
