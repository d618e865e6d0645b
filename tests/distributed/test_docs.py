"""The examples in docs/guides/distributed.md run as written, on the shared local Ray."""

from tests import docblocks


def test_distributed_guide_examples_run(ray_local: None) -> None:
    blocks = docblocks.runnable("docs/guides/distributed.md", "python")
    assert len(blocks) >= 5
    # a module name Ray's workers cannot import, so the guide's Worker is pickled by value
    namespace: dict[str, object] = {"__name__": "distributed_guide"}
    try:
        docblocks.exec_blocks(blocks, namespace)
    finally:
        for name in ("group", "actor", "ref"):
            wg = namespace.get(name)
            if wg is not None:
                wg.shutdown()  # type: ignore[attr-defined]
