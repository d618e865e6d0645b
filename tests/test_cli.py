"""The `agentrl` CLI through a real subprocess: commands exist, errors are clear, rollout works."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.rollout.io import load_groups
from agentrl.tiny import make_tiny_model
from agentrl.types import RolloutStatus


def _cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agentrl.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_help_lists_the_commands() -> None:
    out = _cli("--help")
    assert out.returncode == 0
    for cmd in ("serve", "rollout", "envs", "train", "model"):
        assert cmd in out.stdout


def test_unknown_env_gets_a_suggestion_and_exit_code_2(tmp_path) -> None:
    out = _cli(
        "rollout",
        "--env",
        "games/GuesNumber-v0",
        "--server",
        "http://127.0.0.1:9",
        "--tokenizer",
        str(tmp_path),
        "--out",
        str(tmp_path / "t.jsonl"),
    )
    assert out.returncode == 2
    assert "Did you mean 'games/GuessNumber-v0'" in out.stderr


def test_bad_output_suffix_is_rejected(tmp_path) -> None:
    out = _cli(
        "rollout",
        "--env",
        "games/GuessNumber-v0",
        "--model",
        str(tmp_path),
        "--out",
        str(tmp_path / "t.csv"),
    )
    assert out.returncode == 2 and ".jsonl or .parquet" in out.stderr


@pytest.mark.parametrize("suffix", [".parquet"])
def test_rollout_with_an_embedded_server_writes_loadable_groups(tmp_path, suffix) -> None:
    model = make_tiny_model(tmp_path / "model")
    path = tmp_path / f"traj{suffix}"
    out = _cli(
        "rollout",
        "--env",
        "games/GuessNumber-v0",
        "--model",
        str(model),
        "--n",
        "3",
        "--out",
        str(path),
        "rollout.group_size=2",
        "rollout.max_new_tokens=4",
        "rollout.agent=env_driver",
        "rollout.max_turns=2",
    )
    assert out.returncode == 0, out.stderr[-2000:]
    groups = load_groups(path)
    assert len(groups) == 3 and all(len(g.trajectories) == 2 for g in groups)
    for g in groups:
        assert len({t.sample.uid for t in g.trajectories}) == 1
        for t in g.trajectories:
            assert t.status is not RolloutStatus.ERROR_INFERENCE
            assert t.turns and t.segments[0].num_generated > 0


def test_envs_list_and_check() -> None:
    listed = _cli("envs", "list")
    assert listed.returncode == 0 and "games/GuessNumber-v0" in listed.stdout
    checked = _cli("envs", "check", "games/GuessNumber-v0")
    assert checked.returncode == 0 and "passed" in checked.stdout and "gymnasium" in checked.stdout
    typo = _cli("envs", "check", "games/GesNumber-v0")
    assert typo.returncode == 2 and "Did you mean 'games/GuessNumber-v0'" in typo.stderr


def test_envs_check_a_user_module_registered_env(tmp_path, monkeypatch) -> None:
    (tmp_path / "my_envs.py").write_text(
        "from agentrl.env import Env, register_env\n"
        "from agentrl.types import user\n"
        "class Bad(Env):\n"
        "    async def areset(self, *, seed=None, options=None):\n"
        "        await super().areset(seed=seed)\n"
        "        return 'not a list of messages', {}\n"
        "    async def astep(self, action):\n"
        "        return [], 1.0, True, False, {}\n"
        "register_env('mine/Bad-v0', entry_point='my_envs:Bad')\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    out = _cli("envs", "check", "mine/Bad-v0", "--module", "my_envs")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "FAIL" in out.stdout.upper() and "reset" in out.stdout


def _agentrl(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """The installed console script, as a user runs it (no `python -m`: cwd is not on sys.path)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [str(Path(sys.executable).parent / "agentrl"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=env,
    )


LONG_ID = "a-rather-long-namespace/AnEnvironmentWithAVeryLongNameThatNeedsRoom-v0"


def test_module_in_the_current_directory_for_envs_and_tools(tmp_path: Path) -> None:
    (tmp_path / "my_reg.py").write_text(
        "from agentrl.env import register_env\n"
        "from agentrl.tool import register_tool, tool\n"
        f"register_env({LONG_ID!r}, 'envs.guess:GuessNumberEnv', description='x' * 90)\n"
        "@tool\n"
        "def shout(text: str) -> str:\n"
        "    '''Upper-case text.'''\n"
        "    return text.upper()\n"
        "register_tool(shout)\n"
    )
    listed = _agentrl("envs", "list", "--module", "my_reg", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert any(line.startswith(LONG_ID + " ") for line in listed.stdout.splitlines())
    tools = _agentrl("tools", "list", "--module", "my_reg.py", cwd=tmp_path)
    assert tools.returncode == 0, tools.stderr
    assert "shout" in tools.stdout and "tools.bash:bash" in tools.stdout
    missing = _agentrl("envs", "check", LONG_ID, "--module", "my_regs", cwd=tmp_path)
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert "no module 'my_regs' in the current directory" in missing.stderr
    unknown = _agentrl("envs", "check", "mine/Nope-v0", cwd=tmp_path)
    assert unknown.returncode == 2 and "--module" in unknown.stderr


def test_rollout_fails_when_every_trajectory_failed_in_the_machinery(tmp_path: Path) -> None:
    model = make_tiny_model(tmp_path / "model")
    out = _cli(
        "rollout",
        "--env",
        "games/GuessNumber-v0",
        "--server",
        "http://127.0.0.1:9",
        "--tokenizer",
        str(model),
        "--n",
        "2",
        "--out",
        str(tmp_path / "t.jsonl"),
        "rollout.group_size=2",
        "rollout.agent=env_driver",
    )
    assert out.returncode == 1, out.stdout + out.stderr
    assert "statuses: error_inference=4" in out.stderr
    assert "no trajectory got past the machinery" in out.stderr
    assert len(load_groups(tmp_path / "t.jsonl")) == 2  # the failures are still written


def test_model_tiny_writes_a_vision_language_model_and_refuses_unknown_archs(tmp_path) -> None:
    out = _cli("model", "tiny", str(tmp_path / "vlm"), "--arch", "qwen2_vl", "--hidden-size", "32")
    assert out.returncode == 0, out.stderr
    from agentrl.chat import ChatTemplate

    template = ChatTemplate.from_pretrained(tmp_path / "vlm")
    assert template.vision is not None and (tmp_path / "vlm" / "preprocessor_config.json").is_file()
    bad = _cli("model", "tiny", str(tmp_path / "x"), "--arch", "gpt9")
    assert bad.returncode != 0 and "qwen2_vl" in bad.stderr


def test_model_tiny_learns_merges_from_a_corpus_file(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    text = tmp_path / "corpus.txt"
    text.write_text('[4] checkbox "wooden bicycle" unchecked\n' * 8)
    out = _cli("model", "tiny", str(tmp_path / "m"), "--hidden-size", "32", "--corpus", str(text))
    assert out.returncode == 0, out.stderr
    tok = AutoTokenizer.from_pretrained(tmp_path / "m")
    assert tok.tokenize(" bicycle") == ["\u0120bicycle"]
    missing = _cli("model", "tiny", str(tmp_path / "x"), "--corpus", str(tmp_path / "nope.txt"))
    assert missing.returncode != 0 and "no such file" in missing.stderr


def test_serve_passes_engine_flags_after_the_double_dash(tmp_path: Path) -> None:
    """`agentrl serve MODEL -- --engine dynamic` reaches the embedded server's own flags; an
    unknown one is refused by name (exit 2) before any model is loaded."""
    import socket
    import time

    import httpx2

    bad = _cli("serve", str(tmp_path), "--", "--no-such-flag")
    assert bad.returncode == 2 and "unrecognized arguments: --no-such-flag" in bad.stderr
    model = make_tiny_model(tmp_path / "tiny")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "agentrl.cli", "serve", str(model), "--port", str(port)]
    log = tmp_path / "serve.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [*cmd, "--", "--engine", "dynamic", "--max-seq-len", "64"],
            stdout=subprocess.DEVNULL,
            stderr=out,
        )
    try:
        info = None
        for _ in range(240):  # bounded: ~60 s for the server to load the tiny model
            if proc.poll() is not None:
                break
            try:
                info = httpx2.get(f"http://127.0.0.1:{port}/get_server_info", timeout=2).json()
                break
            except httpx2.TransportError:
                time.sleep(0.25)
        assert info is not None, log.read_text()
        assert info["engine"]["engine"] == "dynamic"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
