"""Where registrations come from: plugins, imported once, the first time a registry is read.

    installed package      pyproject: [project.entry-points."agentrl.plugins"] mine = "mypkg.plugin"
    this checkout          agentrl_builtins.py (the envs, loops, tools, sandbox backends and
                           training commands that ship with agentrl), also an entry point
    your own code          --module / `modules:` in a recipe (``agentrl.registry.import_modules``)

A plugin is a module whose import registers things (``register_env``, ``register_agent``,
``register_tool``, ``SANDBOXES.register``, ``register_command``). The kernel never names the
implementation packages; it only imports plugins. ``agentrl_builtins`` is also tried by module
name, so a checkout on PYTHONPATH that was never pip-installed (no entry points) still finds
the built-ins.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging

from agentrl.errors import ConfigError

logger = logging.getLogger(__name__)

GROUP = "agentrl.plugins"
CHECKOUT_PLUGIN = "agentrl_builtins"
"""The built-ins' plugin module, found on the path when no entry point names it."""

COMMANDS: dict[str, str] = {}
"""``agentrl <name>`` -> ``"module:attr"`` of a typer command (or a ``typer.Typer`` group of
subcommands, e.g. ``agentrl swe prepare``), added by plugins."""

_loaded = False


def register_command(name: str, entry_point: str) -> None:
    """Add ``agentrl <name>``: a typer command function, or a ``typer.Typer`` whose commands
    become ``agentrl <name> <command>``, named by a lazy ``module:attr``."""
    old = COMMANDS.get(name)
    if old is not None and old != entry_point:
        raise ConfigError(f"agentrl command {name!r} is registered twice: {old} and {entry_point}")
    COMMANDS[name] = entry_point


def load_plugins() -> None:
    """Import every plugin once: the entry points of ``agentrl.plugins``, then the built-ins."""
    global _loaded
    if _loaded:
        return
    _loaded = True  # before importing: a plugin's registrations may read a registry
    modules = [ep.value for ep in importlib.metadata.entry_points(group=GROUP)]
    if CHECKOUT_PLUGIN not in modules:
        modules.append(CHECKOUT_PLUGIN)
    for name in modules:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            if name == CHECKOUT_PLUGIN and e.name == CHECKOUT_PLUGIN:
                logger.debug("no %s on the path; built-ins come from entry points only", name)
                continue
            raise ConfigError(f"agentrl plugin {name!r} failed to import: {e}") from e
