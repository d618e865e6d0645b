"""Sandboxes: where a tool's side effects happen, and a pool that hands them out.

    async with SandboxPool("local", config=SandboxPool.Config(max_active=8)) as pool:
        async with pool.acquire() as sb:               # warm, health-checked, closed on exit
            r = await sb.exec("python3 -c 'print(6*7)'", timeout_s=10)
            assert r.stdout == "42\\n"

A ``Sandbox`` runs commands and moves files; a backend (``sandboxes/``: local bubblewrap,
Docker, ...) decides *where*. Tools call ``exec``/``read_file``/``write_file``; envs create a
sandbox per episode (directly with ``make_sandbox`` or through a ``SandboxPool``) and close it.

Data path: tool -> Sandbox.exec(cmd) -> backend process -> ExecResult (capped output, exit
code, timeout flag). Paths inside a sandbox are sandbox paths; relative ones are relative to
``Sandbox.workdir``. Every sandbox has a name starting with a run prefix, so ``sweep(prefix)``
can remove what a killed run left behind (processes, cgroups, directories).

The pool (``SandboxPool``, ``from agentrl.sandbox_pool import SandboxPool``) bounds
the number of live sandboxes by ``max_active``, keeps ``min_idle`` warm, limits the creation
rate, health-checks before hand-out, closes sandboxes older than ``ttl_s`` and never reuses a
sandbox after a rollout.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import uuid
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import ClassVar, Self

from agentrl.errors import ConfigError, SandboxError
from agentrl.registry import Registry

logger = logging.getLogger(__name__)

SANDBOXES: Registry[Sandbox] = Registry(
    "sandbox backend", hint="Register one with SANDBOXES.register(kind, 'pkg.mod:Class')."
)
"""Backends by kind; the built-ins (local, docker, remote) register from ``sandboxes/``."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ExecResult:
    """What a command did. Output is decoded UTF-8 (invalid bytes replaced) and capped."""

    exit_code: int  # -N or 128+N when killed by signal N; -1 when it timed out
    stdout: str
    stderr: str
    timed_out: bool = False
    duration_s: float = 0.0
    truncated: bool = False  # stdout or stderr lost bytes to the output cap
    oom_killed: bool = False  # the memory limit killed a process of this command

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    @property
    def output(self) -> str:
        """stdout followed by stderr, as a terminal would show them (roughly)."""
        if self.stdout and self.stderr and not self.stdout.endswith("\n"):
            return self.stdout + "\n" + self.stderr
        return self.stdout + self.stderr


@dataclass(frozen=True, kw_only=True, slots=True)
class SweepReport:
    """What ``sweep`` removed."""

    processes: int = 0
    cgroups: int = 0
    dirs: int = 0
    containers: int = 0


class OutputCap:
    """Keep the head and the tail of a byte stream, count what falls in between."""

    def __init__(self, limit: int) -> None:
        self.limit = max(limit, 64)
        self._tail_limit = self.limit // 4
        self._head = bytearray()
        self._tail = bytearray()
        self.total = 0

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        room = self.limit - self._tail_limit - len(self._head)
        if room > 0:
            self._head += data[:room]
            data = data[room:]
        if data:
            self._tail += data
            if len(self._tail) > 2 * self._tail_limit:
                del self._tail[: len(self._tail) - self._tail_limit]

    @property
    def truncated(self) -> bool:
        return self.total > len(self._head) + min(len(self._tail), self._tail_limit)

    def text(self) -> str:
        tail = bytes(self._tail[-self._tail_limit :]) if self._tail_limit else b""
        if not self.truncated:
            return (bytes(self._head) + bytes(self._tail)).decode("utf-8", "replace")
        omitted = self.total - len(self._head) - len(tail)
        marker = f"\n[... {omitted} bytes truncated ...]\n"
        return (
            bytes(self._head).decode("utf-8", "replace") + marker + tail.decode("utf-8", "replace")
        )


class SandboxProcess(ABC):
    """A long-lived process inside a sandbox with piped stdin and stdout (stderr merged).

    Used by tools that keep state between calls, e.g. a persistent bash session.
    """

    @abstractmethod
    async def write(self, data: bytes) -> None: ...

    @abstractmethod
    async def read(self, n: int = 65536) -> bytes:
        """Up to ``n`` bytes as soon as any arrive; ``b""`` at end of stream."""

    @abstractmethod
    async def interrupt(self) -> None:
        """Kill everything the process started, but keep the process itself."""

    @abstractmethod
    async def kill(self) -> None:
        """Kill the process and everything it started (idempotent)."""

    @property
    @abstractmethod
    def alive(self) -> bool: ...


class Sandbox(ABC):
    """An isolated place to run commands. Subclass, give it a ``Config`` and implement
    ``create``, ``exec``, ``read_file``, ``write_file`` and ``close``.

    Example::

        class Echo(Sandbox):
            @dataclass(kw_only=True)
            class Config:
                pass

            @classmethod
            async def create(cls, config, *, name=None):
                return cls(name or new_name())

            async def exec(self, cmd, *, timeout_s=None, cwd=None, env=None, stdin=None):
                return ExecResult(exit_code=0, stdout=str(cmd), stderr="")
            ...
    """

    kind: ClassVar[str] = "abstract"
    name: str
    workdir: str = "/workspace"  # the sandbox path relative paths resolve against

    @dataclass(kw_only=True)
    class Config:
        pass

    @classmethod
    @abstractmethod
    async def create(cls, config: object, *, name: str | None = None) -> Self:
        """Start a sandbox. ``name`` should begin with the run prefix (see ``sweep``)."""

    @abstractmethod
    async def exec(
        self,
        cmd: str | list[str],
        *,
        timeout_s: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | str | None = None,
    ) -> ExecResult:
        """Run ``cmd`` (a string goes through ``/bin/sh -c``) and wait for it.

        A timeout kills the command and everything it started; the result says
        ``timed_out=True``. Processes left running when the command returns are killed.
        """

    @abstractmethod
    async def read_file(self, path: str) -> bytes: ...

    @abstractmethod
    async def write_file(self, path: str, data: bytes | str, *, mode: int | None = None) -> None:
        """Create or replace ``path`` (parents are created)."""

    @abstractmethod
    async def close(self) -> None:
        """Kill every process, free every resource. Idempotent; never raises for cleanup."""

    async def upload(self, local_path: str | os.PathLike[str], remote_path: str) -> None:
        """Copy a host file into the sandbox (backends may also accept directories)."""
        with open(local_path, "rb") as f:
            await self.write_file(remote_path, f.read())

    async def download(self, remote_path: str, local_path: str | os.PathLike[str]) -> None:
        """Copy a sandbox file to the host (backends may also accept directories)."""
        data = await self.read_file(remote_path)
        with open(local_path, "wb") as f:
            f.write(data)

    async def is_alive(self) -> bool:
        """True when the sandbox can run a command now. Never raises."""
        try:
            return (await self.exec(["true"], timeout_s=10)).exit_code == 0
        except Exception:  # a health check reports; it does not fail
            return False

    async def pids_in_use(self) -> tuple[int, int] | None:
        """(processes and threads the sandbox holds now, its pids limit), or None when the
        backend cannot tell. The bash tool reads it to notice a session that left the sandbox
        unable to start processes (a fork bomb)."""
        return None

    async def snapshot(self) -> Sandbox:
        """A new sandbox whose workspace is a copy of this one's (copy-on-write if possible)."""
        raise SandboxError(f"the {self.kind!r} sandbox backend does not support snapshot()")

    async def start_process(
        self, argv: list[str], *, cwd: str | None = None, env: Mapping[str, str] | None = None
    ) -> SandboxProcess:
        """Start a long-lived process with piped stdin/stdout (stderr merged into stdout)."""
        raise SandboxError(
            f"the {self.kind!r} sandbox backend cannot start interactive processes; "
            "use exec() or a backend that implements start_process()"
        )

    @classmethod
    async def sweep(cls, prefix: str, config: object | None = None) -> SweepReport:
        """Remove leftovers (processes, cgroups, dirs) of sandboxes whose name starts with
        ``prefix``, e.g. those of a run that was killed before it could close them."""
        return SweepReport()

    def resolve(self, path: str) -> str:
        """A sandbox path: relative paths are taken relative to ``workdir``."""
        return path if path.startswith("/") else os.path.normpath(os.path.join(self.workdir, path))

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await asyncio.shield(self.close())


def new_name(prefix: str = "agentrl-") -> str:
    """A sandbox name: ``prefix`` + 10 random hex digits."""
    return f"{prefix}{uuid.uuid4().hex[:10]}"


def sandbox_class(kind: str) -> type[Sandbox]:
    cls = SANDBOXES.get(kind)
    if not (isinstance(cls, type) and issubclass(cls, Sandbox)):
        raise ConfigError(f"sandbox backend {kind!r} must be a Sandbox subclass, got {cls!r}")
    return cls


def build_config(
    cls: type[Sandbox], config: object | None, overrides: Mapping[str, object]
) -> object:
    """``cls.Config`` from a Config instance or None, with keyword overrides applied."""
    cfg_cls = cls.Config
    if config is None:
        config = cfg_cls()
    elif not isinstance(config, cfg_cls):
        raise ConfigError(
            f"{cls.__name__} expects a {cls.__name__}.Config, got {type(config).__name__}"
        )
    if not overrides:
        return config
    known = {f.name for f in dataclasses.fields(cfg_cls)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ConfigError(
            f"unknown {cls.__name__}.Config key(s) {unknown}; known keys: {sorted(known)}"
        )
    return dataclasses.replace(config, **overrides)  # type: ignore[type-var]


async def make_sandbox(
    kind: str = "local",
    config: object | None = None,
    *,
    name: str | None = None,
    **overrides: object,
) -> Sandbox:
    """Create a sandbox of a registered backend: ``await make_sandbox("local", memory_mb=512)``."""
    cls = sandbox_class(kind)
    return await cls.create(build_config(cls, config, overrides), name=name)


async def sweep(kind: str, prefix: str, config: object | None = None) -> SweepReport:
    """Remove what sandboxes named ``prefix*`` of backend ``kind`` left behind."""
    if len(prefix) < 4:
        raise ConfigError(f"sweep prefix {prefix!r} is too short to be a run prefix")
    return await sandbox_class(kind).sweep(prefix, config)


def __getattr__(name: str) -> object:
    """Deprecated: ``SandboxPool`` and ``PoolStats`` are imported from ``agentrl.sandbox_pool``.

    The pool module builds on this one, so this one does not import it; the old spelling
    still resolves for one release, with a DeprecationWarning.
    """
    if name in ("SandboxPool", "PoolStats"):
        import importlib
        import warnings

        warnings.warn(
            f"import {name} from agentrl.sandbox_pool, not agentrl.sandbox",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module("agentrl.sandbox_pool"), name)
    raise AttributeError(f"module 'agentrl.sandbox' has no attribute {name!r}")


__all__ = [
    "SANDBOXES",
    "ExecResult",
    "OutputCap",
    "Sandbox",
    "SandboxProcess",
    "SweepReport",
    "build_config",
    "make_sandbox",
    "new_name",
    "sandbox_class",
    "sweep",
]
