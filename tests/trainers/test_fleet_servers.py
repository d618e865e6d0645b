"""What a Fleet starts: the embedded server's command line carries ``inference.extra_args``
after the flags the Fleet sets (so a flag given there wins), and a real server accepts it."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from agentrl.errors import AgentRLError
from agentrl.tiny import make_tiny_model
from trainers.config import InferenceConfig
from trainers.serving import Fleet


def _fleet(tmp_path: Path, **kw: object) -> Fleet:
    cfg = InferenceConfig(**kw)  # type: ignore[arg-type]
    return Fleet(cfg, run_seed=3, dtype="float32", device="cpu", log_dir=tmp_path)


def test_embedded_servers_get_the_extra_args_last(tmp_path: Path) -> None:
    fleet = _fleet(tmp_path, extra_args=["--batch-wait-ms", "0", "--prefill-every", "4"])
    cmd = fleet._server(0, "/models/m").command()
    assert cmd[-4:] == ["--batch-wait-ms", "0", "--prefill-every", "4"]
    assert cmd.index("--prefill-every") < len(cmd) - 2  # the Fleet's own, overridden by ours
    assert cmd[cmd.index("--seed") + 1] == "3"
    assert _fleet(tmp_path)._server(0, "/m").command()[-2:] == ["--prefill-every", "1"]


def test_a_real_server_takes_the_extra_args_and_names_a_bad_one(tmp_path: Path) -> None:
    model = str(make_tiny_model(tmp_path / "tiny", hidden_size=32, num_layers=1))
    fleet = _fleet(tmp_path, extra_args=["--switch-interval", "0.0001", "--batch-wait-ms", "0"])
    with fleet._server(0, model) as server:
        assert httpx.get(server.url + "/health", timeout=10).status_code == 200
    bad = _fleet(tmp_path, extra_args=["--no-such-flag"])._server(1, model)
    with pytest.raises(AgentRLError, match="--no-such-flag"):
        bad.start()
