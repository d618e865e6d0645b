"""Fixtures of the env tests."""

from tests.envs.swe_repo import env, repo, repo_test_env  # noqa: F401 (SWE fixtures)
