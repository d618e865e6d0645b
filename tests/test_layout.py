"""The kernel (agentrl/) never imports the implementation folders; those import the kernel."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMPLEMENTATIONS = {"envs", "agents", "tools", "sandboxes", "trainers"}


def _imported_top_levels(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_kernel_does_not_import_implementations() -> None:
    offenders = []
    for path in sorted((ROOT / "agentrl").rglob("*.py")):
        bad = _imported_top_levels(path) & IMPLEMENTATIONS
        if bad:
            offenders.append(f"{path.relative_to(ROOT)} imports {sorted(bad)}")
    # The env registry names the built-in env module by string (lazy), which is allowed.
    assert offenders == [], "kernel -> implementation imports:\n" + "\n".join(offenders)


def test_importing_agentrl_is_cheap() -> None:
    """`import agentrl` must not pull in torch, ray or the server (nothing at import time)."""
    code = "import sys, agentrl; print(','.join(m for m in ('torch', 'ray', 'fastapi', 'transformers') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_every_package_is_typed() -> None:
    for pkg in ("agentrl", *sorted(IMPLEMENTATIONS)):
        assert (ROOT / pkg / "py.typed").is_file(), f"{pkg}/py.typed is missing"
