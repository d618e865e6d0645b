"""Envs as a service: any registered env behind HTTP, and a remote env that is just an Env.

    agentrl envs serve games/GuessNumber-v0 --port 8780 --token "$T"    # server.py, cli.py
    env = make_env("remote:http://127.0.0.1:8780/games/GuessNumber-v0")  # client.py

``EnvServer`` keeps one env per session (sessions: ``agentrl.http.sessions``, shared with the
tool server); ``RemoteEnv`` is an ``Env`` whose reset/step/tool calls run in such a session,
spread over many servers by ``EnvServerPool``. Observations travel as frames (``wire.py``:
JSON with images as raw bytes); ``api.py`` holds the protocol version and request bodies both
sides share, ``asgi.py`` the server's raw-ASGI hot routes. See docs/guides/env-service.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentrl.envserver.client import EnvServerPool, RemoteConfig, RemoteEnv
    from agentrl.envserver.server import EnvServer

__all__ = ["EnvServer", "EnvServerPool", "RemoteConfig", "RemoteEnv"]

_WHERE = {
    "EnvServer": "server",
    "EnvServerPool": "client",
    "RemoteConfig": "client",
    "RemoteEnv": "client",
}


def __getattr__(name: str) -> object:
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(f"agentrl.envserver.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'agentrl.envserver' has no attribute {name!r}")
