"""The viewer's index (byte offsets, paging, filters, live follow) and its JSON API.

The API runs in-process through FastAPI's TestClient (httpx); the page itself is tested in
real Chromium by test_viewer_browser.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from agentrl.env import ENVS, Env, register_env
from agentrl.errors import ConfigError
from agentrl.rollout.io import load_trajectories, save_groups
from agentrl.tool import ToolSet
from agentrl.types import Message, TrajectoryGroup
from agentrl.viewer import Filters, Source, TrajectoryIndex, create_app
from agentrl.viewer.tokens import find_tokenizer, load_template, token_view
from tests.viewer.runs import PAYLOAD, calculator, make_run, record, template, trajectory


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run directory the tests only read (test_follows_a_growing_run writes its own)."""
    path = tmp_path_factory.mktemp("runs") / "demo"
    make_run(path, broken=(1,))
    return path


@pytest.fixture(scope="module")
def client(run: Path) -> TestClient:
    index = TrajectoryIndex([Source(run)], min_refresh_s=0.0)
    return TestClient(create_app(index, load_template(find_tokenizer(run))))


def test_index_reads_records_back_from_byte_offsets(run: Path) -> None:
    index = TrajectoryIndex([Source(run)])
    es = index.entries()
    assert len(es) == 8 and [e.step for e in es] == [1] * 4 + [2] * 4
    lines = (run / "trajectories" / "step_000002.jsonl").read_text().splitlines()
    e = es[5]
    assert index.record(e) == json.loads(lines[1])
    assert e.group == "demo:2:0" and e.length > 0 and e.turns == 2
    # the files still load as plain trajectories
    assert len(load_trajectories(run / "trajectories" / "step_000001.jsonl")) == 4


def test_filters_and_pages(run: Path) -> None:
    index = TrajectoryIndex([Source(run)])
    assert index.query(Filters(step="2"))[0] == 4
    assert index.query(Filters(step="1-2", env="Guess"))[0] == 4
    assert index.query(Filters(reward_min=0.5))[0] == 4
    assert index.query(Filters(group="demo:1:1"))[0] == 2
    assert index.query(Filters(status="completed,error_env"))[0] == 8
    assert index.query(Filters(status="aborted"))[0] == 0
    n = index.entries()[0].length
    assert index.query(Filters(length_min=n + 100))[0] == 0
    total, page = index.query(Filters(), offset=6, limit=5)
    assert total == 8 and len(page) == 2
    with pytest.raises(ConfigError, match="step filter"):
        Filters(step="x").steps()


def test_follows_a_growing_run(tmp_path: Path) -> None:
    run = tmp_path / "demo"
    make_run(run)
    index = TrajectoryIndex([Source(run)], min_refresh_s=0.0)
    step3 = run / "trajectories" / "step_000003.jsonl"
    t = trajectory(answer="84", reward=1.0, env="arith/Calculator-v0", uid="u3", version=2)
    line = json.dumps(record(t, step=3, group=0, advantage=0.5)) + "\n"
    with step3.open("w") as f:  # half a line: not indexed until it is complete
        f.write(line[:100])
        f.flush()
        assert len(index.entries()) == 8
        f.write(line[100:] + line)
    assert len(index.entries()) == 10
    (run / "trajectories" / "step_000001.jsonl").unlink()  # the training disk cap
    assert [e.step for e in index.entries()] == [2] * 4 + [3] * 2


def test_group_files_from_agentrl_rollout(tmp_path: Path) -> None:
    ts = [
        trajectory(answer="84", reward=float(k), env="e/E-v0", uid="g", version=0) for k in (0, 1)
    ]
    path = save_groups(tmp_path / "groups.jsonl", [TrajectoryGroup(uid="g", trajectories=ts)])
    index = TrajectoryIndex([Source(path)])
    es = index.entries()
    assert [e.reward for e in es] == [0.0, 1.0] and {e.group for e in es} == {"g"}
    assert index.record(es[1])["id"] == ts[1].id


def test_api_list_detail_group_compare_metrics(client: TestClient) -> None:
    info = client.get("/api/info").json()
    assert info["count"] == 8 and info["steps"] == [1, 2] and info["tokenizer"]
    page = client.get("/api/trajectories", params={"step": "1", "limit": 3}).json()
    assert page["total"] == 4 and len(page["items"]) == 3
    tid = page["items"][0]["id"]
    detail = client.get(f"/api/trajectories/{tid}").json()
    assert PAYLOAD in detail["record"]["messages"][1]["content"]
    assert "segments" not in detail["record"]
    group = client.get("/api/group", params={"key": "demo:1:0"}).json()
    assert len(group["members"]) == 2
    assert sorted(m["advantage"] for m in group["members"]) == [-0.5, 0.5]
    cmp = client.get("/api/compare", params={"a": "demo:1", "b": "demo:2"}).json()
    assert cmp["a"]["count"] == cmp["b"]["count"] == 4
    rows = client.get("/api/metrics").json()["runs"]["demo"]
    assert [r["step"] for r in rows] == [1, 2]
    assert client.get("/api/trajectories/nope").status_code == 404
    assert client.get("/api/trajectories", params={"step": "x"}).status_code == 400


def test_token_view_marks_and_ledger_check(client: TestClient) -> None:
    items = client.get("/api/trajectories", params={"step": "1"}).json()["items"]
    good = client.get(f"/api/trajectories/{items[0]['id']}/tokens").json()
    seg = good["segments"][0]
    assert seg["check"] == {"done": True, "ok": True}
    masks = [t["mask"] for t in seg["tokens"]]
    assert 0 in masks and 1 in masks
    gen = [t for t in seg["tokens"] if t["mask"]]
    assert all(t["tlp"] == pytest.approx(t["lp"] - 0.01) and t["version"] == 0 for t in gen)
    assert {t["adv"] for t in gen} == {seg["advantage"]} and seg["advantage"] in (-0.5, 0.5)
    assert {t["adv"] for t in seg["tokens"] if not t["mask"]} == {None}
    bad = client.get(f"/api/trajectories/{items[1]['id']}/tokens").json()["segments"][0]
    assert bad["check"]["ok"] is False
    mask = [t["mask"] for t in bad["tokens"]]
    assert bad["check"]["token_index"] == mask.index(0, mask.index(1)) + 4


def test_page_and_security_headers(client: TestClient) -> None:
    r = client.get("/")
    assert r.status_code == 200 and "app.js" in r.text
    assert "script-src 'self'" in r.headers["content-security-policy"]
    js = client.get("/static/app.js").text
    assert not re.search(r"\.(inner|outer)HTML\s*=|insertAdjacentHTML|document\.write", js)
    assert client.get("/static/../index.py").status_code == 404


def test_bad_paths(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        Source(tmp_path / "missing")
    (tmp_path / "x.txt").write_text("")
    with pytest.raises(ConfigError, match="jsonl"):
        Source(tmp_path / "x.txt")


def test_view_command_serves_the_run_with_its_tokenizer(
    run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import uvicorn
    from typer.testing import CliRunner

    from agentrl.cli import app

    served: dict[str, object] = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: served.update(app=app, **kw))
    result = CliRunner().invoke(app, ["view", str(run), "--port", "8699"])
    assert result.exit_code == 0, result.output
    assert "8 trajectories" in result.output and "base_model" in result.output
    assert (served["host"], served["port"]) == ("127.0.0.1", 8699)
    info = TestClient(served["app"]).get("/api/info").json()  # type: ignore[arg-type]
    assert info["count"] == 8 and info["tokenizer"]


def test_two_runs_of_one_name_are_told_apart_and_compared(tmp_path: Path) -> None:
    make_run(tmp_path / "a" / "demo", steps=1)
    make_run(tmp_path / "b" / "demo", steps=2, groups=1)
    index = TrajectoryIndex([Source(tmp_path / "a" / "demo"), Source(tmp_path / "b" / "demo")])
    client = TestClient(create_app(index))
    assert client.get("/api/info").json()["runs"] == ["demo#1", "demo#2"]
    assert client.get("/api/trajectories", params={"run": "demo#2"}).json()["total"] == 4
    cmp = client.get("/api/compare", params={"a": "demo#1:1", "b": "demo#2:2"}).json()
    assert (cmp["a"]["count"], cmp["b"]["count"]) == (4, 2)
    assert set(client.get("/api/metrics").json()["runs"]) == {"demo#1", "demo#2"}
    tokens = client.get(f"/api/trajectories/{cmp['b']['items'][0]['id']}/tokens").json()
    assert not tokens["tokenizer"] and tokens["segments"][0]["tokens"][0]["text"].startswith("<")


class _ToolEnv(Env):
    """An env whose class shows a tool, so the model's system prompt lists its schema."""

    tools = ToolSet([calculator])

    async def areset(self, *, seed: int | None = None, options: Any = None) -> Any:
        return [], {}

    async def astep(self, action: Message) -> Any:
        return [], 0.0, True, False, {}


def test_ledger_check_renders_with_the_env_class_tools() -> None:
    register_env("test-viewer/Tools-v0", _ToolEnv)
    try:
        schemas = _ToolEnv.tools.schemas()
        tpl = template()
        shown = trajectory(
            answer="84", reward=1.0, env="test-viewer/Tools-v0", uid="u", version=0, tools=schemas
        )
        assert token_view(shown.to_dict(), tpl)["segments"][0]["check"]["ok"] is True
        other = trajectory(
            answer="84", reward=1.0, env="test-viewer/None-v0", uid="u", version=0, tools=schemas
        )
        check = token_view(other.to_dict(), tpl)["segments"][0]["check"]
        assert check["ok"] is False and "per instance" in check["note"]
    finally:
        ENVS.unregister("test-viewer/Tools-v0")
