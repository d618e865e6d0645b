"""Browser tests of the GUI envs skip (and, under ``-m browser``, fail) without chromium."""

from __future__ import annotations

import importlib.util

import pytest

from agentrl.browser import chromium_path


@pytest.fixture()
def chromium() -> None:
    if chromium_path() is None:
        pytest.skip("no chromium: scripts/install-sandbox-deps.sh --browser installs it")
    if importlib.util.find_spec("playwright") is None:
        pytest.skip("no playwright: pip install -e '.[gui]'")
