"""The examples in docs/guides/distributed.md run as written, on the shared local Ray."""

import re
from pathlib import Path

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "distributed.md"


def test_distributed_guide_examples_run(ray_local: None) -> None:
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), re.S)
    assert len(blocks) >= 5
    # a module name Ray's workers cannot import, so the guide's Worker is pickled by value
    namespace: dict[str, object] = {"__name__": "distributed_guide"}
    try:
        for i, block in enumerate(blocks):
            exec(compile(block, f"{GUIDE.name}[block {i}]", "exec"), namespace)
    finally:
        for name in ("group", "actor", "ref"):
            wg = namespace.get(name)
            if wg is not None:
                wg.shutdown()  # type: ignore[attr-defined]
