"""tests/conftest.py: a selected engine marker, or CI=true for bubblewrap, turns skips into failures."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import selected_engines

pytest_plugins = ["pytester"]

TESTS = """
import pytest

@pytest.mark.docker
def test_needs_docker():
    pytest.skip("no Docker engine")

@pytest.mark.docker
def test_docker_ok():
    pass

pytestmark_like = pytest.mark.skipif(True, reason="no Docker engine at collection")

@pytest.mark.docker
@pytestmark_like
def test_needs_docker_skipif():
    pass

def test_needs_bwrap():
    pytest.skip("bubblewrap is not installed; run scripts/install-sandbox-deps.sh")

def test_other_skip():
    pytest.skip("not on this platform")
"""


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest((Path(__file__).parent / "conftest.py").read_text())
    pytester.makeini(
        "[pytest]\nasyncio_default_fixture_loop_scope = function\nmarkers =\n    docker: x\n"
    )
    pytester.makepyfile(test_suite=TESTS)
    return pytester


def test_selected_engine_marker_fails_instead_of_skipping(
    suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CI", raising=False)
    result = suite.runpytest("-m", "docker")
    result.assert_outcomes(passed=1, failed=1, errors=1, deselected=2)  # setup: an error
    result.stdout.fnmatch_lines(
        ["*selected this docker test, but it would skip: no Docker engine*"]
    )


def test_default_run_still_skips(suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    suite.runpytest("-m", "not docker").assert_outcomes(skipped=2)


def test_ci_fails_when_bubblewrap_is_missing(
    suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CI", "true")
    result = suite.runpytest("-m", "not docker")
    result.assert_outcomes(failed=1, skipped=1)
    result.stdout.fnmatch_lines(["*CI=true promises the sandbox dependencies*bubblewrap*"])


def test_selected_engines_reads_the_mark_expression() -> None:
    assert selected_engines("docker") == {"docker"}
    assert selected_engines("vllm and not slow") == {"vllm"}
    assert selected_engines("not gpu and not docker and not browser") == set()
    assert selected_engines("") == set()
