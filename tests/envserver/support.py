"""Envs and helpers of the env service tests (imported by conftest.py and the tests, so the
envs register once, whichever conftest.py pytest imported first)."""

from __future__ import annotations

import base64
import io
import struct
import zlib
from typing import Any

from agentrl.env import SyncEnv, register_env
from agentrl.envserver.server import EnvServer
from agentrl.http import ServerThread
from agentrl.plugins import load_plugins
from agentrl.types import Message

load_plugins()


def png(width: int, height: int, seed: int) -> bytes:
    """A real (incompressible-ish) RGB PNG of width x height, written with zlib."""
    rows = io.BytesIO()
    x = seed * 2654435761 % 2**32
    for _ in range(height):
        rows.write(b"\x00")
        for _ in range(width * 3):
            x = (1103515245 * x + 12345) % 2**31
            rows.write(bytes([x >> 23]))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(rows.getvalue()))
        + chunk(b"IEND", b"")
    )


class ScreenEnv(SyncEnv):
    """Observations are a screenshot (a PNG data URL) and text; 'done' ends the episode."""

    def __init__(self, size: int = 96) -> None:
        self.size = size
        self.t = 0

    def _obs(self) -> list[Message]:
        data = base64.b64encode(png(self.size, self.size, self.t)).decode()
        parts: list[dict[str, Any]] = [
            {"type": "text", "text": f"screen {self.t}"},
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{data}"}},
        ]
        return [Message(role="user", content=parts)]

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        super().reset(seed=seed)
        self.t = int(self.np_random.integers(0, 1000))
        return self._obs(), {"t": self.t}

    def step(self, action: Message) -> Any:
        self.t += 1
        done = "done" in action.text
        return self._obs(), float(done), done, False, {}


class ClockEnv(SyncEnv):
    """Declared nondeterministic: the prompt holds a random token not drawn from the seed."""

    nondeterministic = True

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        super().reset(seed=seed)
        import secrets

        return [Message(role="user", content=f"token {secrets.token_hex(4)}")], {}

    def step(self, action: Message) -> Any:
        return [], 1.0, True, False, {}


class BrokenEnv(SyncEnv):
    """Raises in step: the client must see the env's own failure (EnvError)."""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        super().reset(seed=seed)
        return [Message(role="user", content="go")], {}

    def step(self, action: Message) -> Any:
        raise RuntimeError("the env broke")


class OracleEnv(SyncEnv):
    """Its oracle is async only (it must act to know what the env shows, as SWE's does) and
    counts its calls: a remote reset must not run it, a remote SFT must."""

    oracle_calls = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        super().reset(seed=seed)
        self.secret = int(self.np_random.integers(0, 100))
        return [Message(role="user", content="say the secret")], {}

    def step(self, action: Message) -> Any:
        return [], float(action.text == str(self.secret)), True, False, {}

    async def ademonstration(self) -> list[Message] | None:
        type(self).oracle_calls += 1
        return [Message(role="assistant", content=str(self.secret))]


register_env("test-envserver/Screen-v0", ScreenEnv)
register_env("test-envserver/Oracle-v0", OracleEnv)
register_env("test-envserver/Clock-v0", ClockEnv)
register_env("test-envserver/Broken-v0", BrokenEnv)


def serve(config: EnvServer.Config | None = None) -> tuple[EnvServer, ServerThread, str]:
    server = EnvServer(config or EnvServer.Config())
    thread = ServerThread(server.app())
    return server, thread, thread.start()
