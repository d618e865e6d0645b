"""scripts/redraw_demos.py: paths and line numbers are redrawn consistently, nothing else."""

from __future__ import annotations

import random
import re

from tests.script_module import load_script


def _demo() -> list[dict]:
    probe = "git grep -n 'not (' -- '*.py' ':!*test*' | cut -d: -f1,2"
    fix = "sed -i '66s/not (\\(.*\\))/\\1/' src/pkg/mod.py"
    call = lambda i, cmd: {  # noqa: E731
        "id": f"c{i}",
        "type": "function",
        "function": {"name": "bash", "arguments": {"command": cmd}},
    }
    return [
        {"role": "user", "content": "<issue>\nA bug\n</issue>"},
        {"role": "assistant", "content": "", "tool_calls": [call(0, probe)]},
        {"role": "tool", "content": "src/pkg/mod.py:66\nsrc/pkg/other.py:120\n"},
        {"role": "assistant", "content": "", "tool_calls": [call(1, fix)]},
    ]


def test_paths_and_line_numbers_are_redrawn_consistently() -> None:
    redraw = load_script("redraw_demos").redraw
    demo = _demo()
    seen = set()
    for seed in range(5):
        out = redraw(demo, random.Random(seed))
        listing = out[2]["content"]
        cmd = out[3]["tool_calls"][0]["function"]["arguments"]["command"]
        (first, line), (second, _) = (r.split(":") for r in listing.split())
        assert "src/pkg" not in listing and first != second
        assert re.fullmatch(rf"sed -i '{line}s/not \(\\\(\.\*\\\)\)/\\1/' {re.escape(first)}", cmd)
        # the rest is untouched: the issue, the probe command and its '*.py' pattern
        assert out[0] == demo[0] and out[1] == demo[1]
        seen.add(first)
    assert len(seen) == 5  # a new path each draw
    assert demo[2]["content"].startswith("src/pkg/mod.py:66")  # the input is not changed


def test_a_conversation_without_paths_is_returned_as_is() -> None:
    msgs = [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "4"}]
    assert load_script("redraw_demos").redraw(msgs, random.Random(0)) == msgs
