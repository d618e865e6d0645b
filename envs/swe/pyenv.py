"""A Python environment for a repository's tests, built offline, shown read-only to sandboxes.

    env = build_test_env("/data/swe/envs/calc")           # a venv of /usr/bin/python3 + pytest
    RepoEnv(repo_dir=..., python=env.python, ro_paths=(env.prefix,))

The venv's interpreter is a symlink to a system Python under ``/usr`` (which every local
sandbox shows), so the venv works inside a sandbox that shows its folder read-only. pytest and
its requirements are copied from the running interpreter's own installation (pure-Python
distributions, file by file from their RECORD), so building needs no network and no index:
the grader's pytest is the one this project was tested with. The copies are byte-compiled
once, so runs that may not write bytecode (read-only envs) do not recompile pytest each time.
"""

from __future__ import annotations

import importlib.metadata as md
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from agentrl.errors import ConfigError

TEST_DISTRIBUTIONS = ("pytest", "pluggy", "iniconfig", "packaging", "pygments")
"""pytest and what it imports (the ``exceptiongroup``/``tomli`` backports are for < 3.11)."""


@dataclass(frozen=True, slots=True)
class TestEnv:
    __test__ = False  # not a pytest test class

    prefix: str
    python: str


def build_test_env(
    prefix: str | Path,
    *,
    base_python: str = "/usr/bin/python3",
    distributions: tuple[str, ...] = TEST_DISTRIBUTIONS,
) -> TestEnv:
    """Make (or reuse) a venv at ``prefix`` with ``distributions`` copied in; see module doc."""
    p = Path(prefix)
    py = p / "bin" / "python"
    if not Path(base_python).exists():
        raise ConfigError(
            f"base_python {base_python!r} does not exist; give a system Python under /usr "
            "(sandboxes show /usr read-only, not a pyenv or a home directory)"
        )
    if not py.exists():
        subprocess.run(
            [base_python, "-m", "venv", "--without-pip", str(p)], check=True, capture_output=True
        )
    site = _site_packages(py)
    minor = f"{sys.version_info.major}.{sys.version_info.minor}"
    if f"python{minor}" not in str(site):
        raise ConfigError(
            f"{base_python} is not Python {minor} (the one copying its pytest); the copied "
            f"packages would not match: {site}"
        )
    for name in distributions:
        _copy_distribution(name, site)
    # Byte-compile now: sandboxes see the env read-only and tests run with
    # PYTHONDONTWRITEBYTECODE, so without this every run compiles pytest again (~0.5 s of CPU).
    subprocess.run([str(py), "-m", "compileall", "-q", str(site)], check=False, capture_output=True)
    subprocess.run(["chmod", "-R", "a+rX", str(p)], check=True)
    return TestEnv(prefix=str(p), python=str(py))


def _site_packages(py: Path) -> Path:
    out = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(out.stdout.strip())


def _copy_distribution(name: str, site: Path) -> None:
    try:
        dist = md.distribution(name)
    except md.PackageNotFoundError:
        raise ConfigError(
            f"{name} is not installed here, so it cannot be copied into the test env; "
            f"pip install {name}"
        ) from None
    root = Path(str(dist.locate_file("")))
    for f in dist.files or ():
        src = root / f
        if f.parts[0].startswith("..") or not src.is_file() or re.search(r"\.pyc$", f.name):
            continue  # scripts outside site-packages, caches
        dst = site / f
        dst.parent.mkdir(parents=True, exist_ok=True)
        if not dst.exists():
            shutil.copy2(src, dst)
