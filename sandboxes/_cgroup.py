"""Per-sandbox cgroups: memory and pids limits, and a reliable way to kill a process tree.

    cg = SandboxCgroup.create("agentrl-run1-ab12", memory_bytes=2 << 30, pids_max=256)
    leaf = cg.new_leaf()            # one leaf per command: join it, then exec the command
    ... "echo 0 > {procs}" for procs in leaf.procs_files ...
    await cg.kill(leaf); cg.remove_leaf(leaf); await cg.destroy()

Layout: ``<mount>/<parent>/<sandbox>/<leaf>``. Limits sit on the sandbox group and cover all of
its leaves. cgroup v1 (separate ``memory`` and ``pids`` hierarchies) and v2 (one unified
hierarchy) are both handled; ``available()`` says which one works here, or None.
Killing reads ``cgroup.procs`` until it is empty (v2: ``cgroup.kill``), so processes that left
their process group or session still die.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path

logger = logging.getLogger(__name__)

ROOT = Path("/sys/fs/cgroup")
V1_CONTROLLERS = ("memory", "pids")


def version() -> int | None:
    """2 for a unified hierarchy, 1 when v1 memory and pids hierarchies are mounted, else None."""
    if (ROOT / "cgroup.controllers").exists():
        return 2
    if all((ROOT / c / "cgroup.procs").exists() for c in V1_CONTROLLERS):
        return 1
    return None


def _bases(parent: str) -> list[Path]:
    v = version()
    if v == 2:
        return [ROOT / parent]
    if v == 1:
        return [ROOT / c / parent for c in V1_CONTROLLERS]
    return []


def available(parent: str) -> str | None:
    """None when per-sandbox cgroups can be made under ``parent``, else the reason they cannot."""
    v = version()
    if v is None:
        return f"no cgroup v2 hierarchy and no v1 memory+pids hierarchies under {ROOT}"
    try:
        for base in _bases(parent):
            base.mkdir(parents=True, exist_ok=True)
        if v == 2:
            _enable_v2_controllers(ROOT)
            _enable_v2_controllers(ROOT / parent)
    except OSError as e:
        return f"cannot create cgroups under {parent!r} ({e})"
    return None


def _enable_v2_controllers(path: Path) -> None:
    (path / "cgroup.subtree_control").write_text("+memory +pids")


def _write(path: Path, value: str) -> None:
    try:
        path.write_text(value)
    except OSError as e:
        logger.warning("could not write %r to %s: %s", value, path, e)


@dataclass(slots=True)
class Leaf:
    dirs: list[Path]

    @property
    def procs_files(self) -> list[str]:
        return [str(d / "cgroup.procs") for d in self.dirs]


@dataclass(slots=True)
class SandboxCgroup:
    dirs: list[Path]  # one per hierarchy (v1: memory, pids; v2: the unified one)
    v2: bool
    _next_leaf: int = 0
    _leaves: list[Leaf] = field(default_factory=list)

    @classmethod
    def create(cls, name: str, *, parent: str, memory_bytes: int, pids_max: int) -> SandboxCgroup:
        v2 = version() == 2
        dirs = [b / name for b in _bases(parent)]
        for d in dirs:
            d.mkdir(exist_ok=False)
        cg = cls(dirs=dirs, v2=v2)
        if v2:
            _enable_v2_controllers(dirs[0])
            _write(dirs[0] / "memory.max", str(memory_bytes))
            _write(dirs[0] / "memory.swap.max", "0")
            _write(dirs[0] / "pids.max", str(pids_max))
        else:
            mem, pids = dirs
            _write(mem / "memory.limit_in_bytes", str(memory_bytes))
            with contextlib.suppress(OSError):  # only present with swap accounting
                (mem / "memory.memsw.limit_in_bytes").write_text(str(memory_bytes))
            _write(pids / "pids.max", str(pids_max))
        return cg

    def pids(self) -> tuple[int, int] | None:
        """(pids.current, pids.max) of the sandbox group; None if unreadable or unlimited."""
        return read_pids(self.dirs[0] if self.v2 else self.dirs[1])

    def new_leaf(self) -> Leaf:
        self._next_leaf += 1
        leaf = Leaf([d / f"p{self._next_leaf}" for d in self.dirs])
        for d in leaf.dirs:
            d.mkdir()
        self._leaves.append(leaf)
        return leaf

    def oom_kills(self, leaf: Leaf | None = None) -> int:
        """How many processes of ``leaf`` (or the sandbox) the memory limit has killed."""
        d = leaf.dirs[0] if leaf else self.dirs[0]
        path = d / ("memory.events" if self.v2 else "memory.oom_control")
        try:
            for line in path.read_text().splitlines():
                key, _, val = line.partition(" ")
                if key == "oom_kill":
                    return int(val)
        except OSError:
            pass
        return 0

    async def kill(self, leaf: Leaf | None = None) -> int:
        """SIGKILL every process in ``leaf`` (or the whole sandbox) until none is left."""
        return await kill_tree(leaf.dirs if leaf else self.dirs, v2=self.v2)

    async def remove_leaf(self, leaf: Leaf) -> None:
        await self.kill(leaf)
        for d in leaf.dirs:
            await _rmdir(d)
        with contextlib.suppress(ValueError):
            self._leaves.remove(leaf)

    async def destroy(self) -> None:
        await self.kill()
        for d in self.dirs:
            await remove_tree(d)


def read_pids(d: Path) -> tuple[int, int] | None:
    """(pids.current, pids.max) of cgroup dir ``d``; None if unreadable or unlimited."""
    try:
        cur, limit = (d / "pids.current").read_text().strip(), (d / "pids.max").read_text().strip()
        return (int(cur), int(limit)) if limit.isdigit() else None
    except (OSError, ValueError):
        return None


def tree(d: Path) -> list[Path]:
    """``d`` and every cgroup under it (parents first). Cgroups come and go while we walk (a
    sandbox's exec agent may remove its leaf on another event loop): one that vanished
    mid-walk is skipped, never an error (``Path.rglob`` raised FileNotFoundError)."""
    return [Path(root) for root, _, _ in os.walk(d)]  # os.walk ignores unreadable directories


def pids_in(dirs: list[Path]) -> set[int]:
    pids: set[int] = set()
    for d in dirs:
        for sub in tree(d):
            with contextlib.suppress(OSError, ValueError):
                pids.update(int(x) for x in (sub / "cgroup.procs").read_text().split())
    return pids


async def kill_tree(dirs: list[Path], *, v2: bool, timeout_s: float = 10.0) -> int:
    """Kill every process in the cgroups under ``dirs``; returns how many were signalled."""
    killed: set[int] = set()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        if v2:
            for d in dirs:
                with contextlib.suppress(OSError):
                    (d / "cgroup.kill").write_text("1")
        pids = pids_in(dirs)
        if not pids:
            return len(killed)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        killed |= pids
        if loop.time() > deadline:
            logger.warning("processes %s survived SIGKILL for %.0fs", sorted(pids)[:10], timeout_s)
            return len(killed)
        await asyncio.sleep(0.01)


async def _rmdir(d: Path) -> bool:
    for _ in range(200):
        try:
            d.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError:  # EBUSY while the last tasks finish exiting
            await asyncio.sleep(0.01)
    logger.warning("could not remove cgroup %s", d)
    return False


async def remove_tree(d: Path) -> bool:
    """rmdir a cgroup and its children, deepest first."""
    if not d.exists():
        return True
    subdirs = sorted(tree(d)[1:], key=lambda p: -len(p.parts))
    for sub in subdirs:
        await _rmdir(sub)
    return await _rmdir(d)


async def sweep(parent: str, prefix: str) -> tuple[int, int]:
    """Kill processes in, and remove, every sandbox cgroup named ``prefix*``; (processes, groups)."""
    v2 = version() == 2
    procs = groups = 0
    for base in _bases(parent):
        if not base.is_dir():
            continue
        for d in base.iterdir():
            if d.is_dir() and d.name.startswith(prefix):
                procs += await kill_tree([d], v2=v2)
                groups += int(await remove_tree(d))
    return procs, groups
