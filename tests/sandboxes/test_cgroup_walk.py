"""Walking a sandbox's cgroups while they change (``sandboxes._cgroup``): a cgroup removed
mid-walk (an exec agent's leaf, removed on another event loop) is skipped, never an error."""

from __future__ import annotations

import threading
from pathlib import Path

from sandboxes._cgroup import pids_in, tree


def test_pids_are_read_while_leaves_come_and_go(tmp_path: Path) -> None:
    root = tmp_path / "sandbox"
    root.mkdir()
    (root / "cgroup.procs").write_text("11\n12\n")
    stop = threading.Event()

    def churn() -> None:  # leaves made and removed as fast as possible
        i = 0
        while not stop.is_set():
            leaf = root / f"p{i % 8}" / "deep"
            leaf.mkdir(parents=True, exist_ok=True)
            (leaf / "cgroup.procs").write_text("13\n")
            (leaf / "cgroup.procs").unlink()
            leaf.rmdir()
            leaf.parent.rmdir()
            i += 1

    t = threading.Thread(target=churn)
    t.start()
    try:
        for _ in range(3000):
            assert {11, 12} <= pids_in([root]) <= {11, 12, 13}
    finally:
        stop.set()
        t.join()
    assert tree(root) == [root] and pids_in([root]) == {11, 12}
    assert tree(tmp_path / "gone") == [] and pids_in([tmp_path / "gone"]) == set()
