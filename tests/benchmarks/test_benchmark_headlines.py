"""The benchmarks in ``benchmarks/`` end with their one-line JSON
headline (keys ``benchmark, baseline, ours, ratio, goal, met``), on the smallest settings.
No figure is checked: tests do not time things."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
KEYS = ["benchmark", "baseline", "ours", "ratio", "goal", "met"]


def _headlines(script: str, *args: str) -> list[dict[str, object]]:
    """The JSON lines that end the script's output, last one last."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = []
    for line in reversed(proc.stdout.strip().splitlines()):
        if not line.startswith("{"):
            break
        found.insert(0, json.loads(line))
        assert list(found[0]) == KEYS, found[0]
    assert found, proc.stdout[-3000:]
    return found


def _headline(script: str, *args: str) -> dict[str, object]:
    return _headlines(script, *args)[-1]


def test_weight_sync_headline_is_the_verified_ipc_sync_over_the_warm_copy() -> None:
    got = _headline("weight_sync.py", "--models", "tiny", "--paths", "ipc", "--repeats", "2")
    assert "ipc push + verify" in str(got["ours"]) and "memcpy-warm" in str(got["baseline"])
    assert isinstance(got["ratio"], float) and got["met"] == (got["ratio"] <= 5)


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="the local sandbox needs bubblewrap")
def test_sandbox_headlines_swerex_then_the_hardening_cost() -> None:
    """Without SWE-ReX the first headline says what was not measured; the last line is the
    hardening cost, local (defaults) over local-unhardened."""
    swerex, hardening = _headlines(
        "sandbox.py",
        "--n",
        "2",
        "--creates",
        "2",
        "--sandboxes",
        "1",
        "--per-sandbox",
        "1",
        "--targets",
        "local,local-unhardened,pipe-shell",
    )
    assert swerex["ratio"] is None and swerex["met"] is None
    assert "not measured" in str(swerex["baseline"]) and "local (exec agent)" in str(swerex["ours"])
    assert "seccomp=False, disk_mb=0" in str(hardening["baseline"])
    assert "local (defaults: seccomp=True" in str(hardening["ours"])
    ratio = hardening["ratio"]
    assert isinstance(ratio, float) and hardening["met"] == (ratio <= 1.1)


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="the local sandbox needs bubblewrap")
def test_sandbox_hardening_headline_without_its_baseline_says_so() -> None:
    got = _headline(
        "sandbox.py",
        "--n",
        "2",
        "--creates",
        "1",
        "--sandboxes",
        "1",
        "--per-sandbox",
        "1",
        "--targets",
        "local",
    )
    assert got["ratio"] is None and got["met"] is None and got["baseline"] == "not measured"


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="the local sandbox needs bubblewrap")
def test_swe_headline_without_docker_says_what_was_not_measured() -> None:
    """Two concurrent trajectories reset, run commands, fix the bug and are graded (the
    script exits non-zero on an error or a leak); without docker there is no ratio."""
    got = _headline("swe.py", "--n", "2", "--concurrency", "2", "--no-docker")
    assert str(got["baseline"]).startswith("not measured") and got["ratio"] is None
    assert got["met"] is None and isinstance(got["ours"], float) and got["ours"] > 0


def test_gateway_headline_is_requests_per_s_over_the_servers_own_route() -> None:
    got = _headline("gateway.py", "--rounds", "1", "--agents", "2", "--turns", "2")
    assert got["benchmark"] == "gateway_requests_per_s" and got["goal"] == 0.9
    assert isinstance(got["ratio"], float) and got["met"] == (got["ratio"] >= 0.9)


@pytest.mark.slow  # an inference server, an env server and a model: ~20-70 s
def test_env_service_headline_samples_from_the_embedded_server() -> None:
    got = _headline(
        "env_service.py",
        "--samples",
        "4",
        "--reps",
        "1",
        "--sessions",
        "4",
        "--servers",
        "1",
        "--latency-steps",
        "10",
        "--new-tokens",
        "4",
    )
    assert "embedded server" in str(got["benchmark"]) and got["goal"] == 0.8
    assert isinstance(got["ratio"], float) and got["met"] == (got["ratio"] >= 0.8)


@pytest.mark.slow
def test_actor_start_headline_compares_the_runtime_env_with_inheritance() -> None:
    """Both variants start an actor that reports the multicast-off variables (the script
    exits non-zero if either lacks them), then the headline compares their medians."""
    head = _headline("actor_start.py", "--actors", "1")
    assert head["benchmark"] == "Ray actor start on the local instance, median of 1"
    assert "runtime_env on the job and every actor" in str(head["baseline"])
    assert isinstance(head["ours"], float) and head["ours"] > 0
    assert head["met"] == (isinstance(head["ratio"], float) and head["ratio"] >= 1.5)


@pytest.mark.slow  # a tiny model, the engine in-process, then a server: ~40 s on 2 cores
def test_server_overhead_headline_is_the_in_process_round_over_the_http_round(
    tmp_path: Path,
) -> None:
    head = _headline(
        "server_overhead.py",
        "--device",
        "cpu",
        "--rounds",
        "1",
        "--warmup",
        "1",
        "--model",
        str(tmp_path / "model"),
    )
    assert str(head["baseline"]).startswith("in-process StaticRunner")
    assert isinstance(head["ours"], float) and head["ours"] > 0
    assert isinstance(head["ratio"], float) and head["met"] == (head["ratio"] >= 0.5)


def test_logprob_chunks_headline_is_the_old_chunk_over_the_device_chunk() -> None:
    got = _headline(
        "logprob_chunks.py", "--device", "cpu", "--groups", "1", "--group-size", "2",
        "--repeats", "1",
    )  # fmt: skip
    assert "chunk 1024" in str(got["baseline"]) and "by device (1024)" in str(got["ours"])
    assert got["goal"] == 0.9 and got["met"] == (float(got["ratio"]) >= 0.9)  # type: ignore[arg-type]
