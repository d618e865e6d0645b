"""The process's shared browser pool (no browser is started here)."""

from __future__ import annotations

import logging

import pytest

pytest.importorskip("playwright")

from envs.gui.session import BrowserPool


def test_a_second_cap_for_the_shared_pool_is_ignored_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    pool = BrowserPool.shared()
    with caplog.at_level(logging.WARNING, logger="envs.gui.session"):
        assert BrowserPool.shared(pool.max_contexts) is pool
        assert not caplog.records
        assert BrowserPool.shared(pool.max_contexts + 8) is pool
    [record] = caplog.records
    assert f"max_contexts={pool.max_contexts}" in record.getMessage()
    assert f"request for {pool.max_contexts + 8} is ignored" in record.getMessage()


def test_bad_caps_are_config_errors() -> None:
    from agentrl.errors import ConfigError

    with pytest.raises(ConfigError, match="max_busy must be >= 1, got 0"):
        BrowserPool(max_busy=0)
    with pytest.raises(ConfigError, match="max_contexts must be >= 1"):
        BrowserPool(max_contexts=0)
