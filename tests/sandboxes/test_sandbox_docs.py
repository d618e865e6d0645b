"""The runnable example in docs/guides/sandboxes.md runs as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.sandboxes.conftest import local_ready

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "sandboxes.md"


@pytest.mark.skipif(local_ready() is not None, reason=str(local_ready()))
def test_guide_example_runs() -> None:
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), flags=re.S)
    runnable = [b for b in blocks if "asyncio.run(" in b]
    assert runnable, "the guide should open with a runnable example"
    for code in runnable:
        exec(compile(code, str(GUIDE), "exec"), {"__name__": "guide_example"})
