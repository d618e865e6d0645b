"""Find and launch Debian's chromium for Playwright, with chromium's own sandbox on.

    exe = chromium_executable(workdir)   # chromium, or (as root) a wrapper running it as nobody
    browser = await playwright.chromium.launch(executable_path=exe, chromium_sandbox=True)

Playwright's own browser download cannot work offline, so the browser is Debian's ``chromium``
(``scripts/install-sandbox-deps.sh --browser``). Chromium refuses to start its sandbox as root,
and ``--no-sandbox`` is not an option here: as root the executable handed to Playwright is a
small shell wrapper that drops to the unprivileged user ``nobody`` with ``setpriv`` and hands
it the profile directory Playwright created. Used by the trajectory viewer's browser tests and
by the GUI envs (``envs/gui``).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from agentrl.errors import ConfigError

NOBODY = 65534

_WRAPPER = """#!/bin/sh
# Debian's chromium as the user nobody, sandbox on (root would need --no-sandbox).
for a in "$@"; do
  case "$a" in --user-data-dir=*) chown -R {uid}:{uid} "${{a#--user-data-dir=}}" ;; esac
done
exec setpriv --reuid={uid} --regid={uid} --clear-groups env HOME={home} {chromium} "$@"
"""


def chromium_path() -> str | None:
    """Debian's chromium, or None when it is not installed."""
    found = shutil.which("chromium")
    if found is not None:
        return found
    return "/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None


def chromium_executable(workdir: Path) -> str:
    """The executable to launch: chromium itself, or (as root) a wrapper starting it as nobody.

    ``workdir`` holds the wrapper and the user's home; it must outlive the browser. Raises
    ``ConfigError`` naming the fix when chromium (or, as root, ``setpriv``) is missing.
    """
    chromium = chromium_path()
    if chromium is None:
        raise ConfigError(
            "no chromium found; install Debian's with `scripts/install-sandbox-deps.sh --browser`"
        )
    if os.geteuid() != 0:
        return chromium
    if shutil.which("setpriv") is None:
        raise ConfigError(
            "running as root needs setpriv (util-linux) to start chromium as the user nobody "
            "with its sandbox on; install it with `scripts/install-sandbox-deps.sh --browser`"
        )
    workdir.mkdir(parents=True, exist_ok=True)
    home = workdir / "home"
    home.mkdir(exist_ok=True)
    os.chown(home, NOBODY, NOBODY)
    wrapper = workdir / "chromium-as-nobody"
    wrapper.write_text(_WRAPPER.format(uid=NOBODY, home=home, chromium=chromium))
    wrapper.chmod(0o755)
    return str(wrapper)
