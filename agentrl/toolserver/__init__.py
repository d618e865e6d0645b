"""Tools over the network: the tool server, its client and the shared HTTP plumbing.

    agentrl tools serve tools.swe:swe_toolset --sandbox local --token "$T"   # server.py, cli.py
    env.tools = RemoteToolSet(RemoteToolSet.Config(url=..., token=...))      # client.py

A ``RemoteToolSet`` is a ``ToolSet`` whose calls run in a server session (one sandbox per
trajectory). MCP in and out lives in ``agentrl/mcp.py``; the sandbox server that backs
``RemoteSandbox`` in ``sandboxes/server.py`` reuses ``http.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentrl.toolserver.client import RemoteToolSession, RemoteToolSet, SchemaTool
    from agentrl.toolserver.server import ToolServer

__all__ = ["RemoteToolSession", "RemoteToolSet", "SchemaTool", "ToolServer"]

_WHERE = {
    "RemoteToolSession": "client",
    "RemoteToolSet": "client",
    "SchemaTool": "client",
    "ToolServer": "server",
}


def __getattr__(name: str) -> object:
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(f"agentrl.toolserver.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'agentrl.toolserver' has no attribute {name!r}")
