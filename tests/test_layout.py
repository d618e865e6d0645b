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


def _implementation_strings(path: Path) -> list[str]:
    """String constants that name an implementation module (``"envs.x:Y"``, ``"trainers.cli"``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            head, dot, rest = node.value.partition(".")
            colon_head = node.value.partition(":")[0]
            if (head in IMPLEMENTATIONS and dot and rest[:1].isidentifier()) or (
                colon_head in IMPLEMENTATIONS and ":" in node.value
            ):
                found.append(node.value)
    return found


def test_kernel_names_no_implementation_module_even_by_string() -> None:
    """Built-ins register from the implementation side (agentrl_builtins, an agentrl.plugins
    entry point); the kernel must not name them in lazy strings either."""
    offenders = [
        f"{path.relative_to(ROOT)}: {s!r}"
        for path in sorted((ROOT / "agentrl").rglob("*.py"))
        for s in _implementation_strings(path)
    ]
    assert offenders == [], "kernel -> implementation strings:\n" + "\n".join(offenders)


def test_an_uninstalled_checkout_on_pythonpath_finds_the_builtins(tmp_path: Path) -> None:
    """No entry points at all (never pip-installed): the built-ins still resolve by module name."""
    code = (
        "import importlib.metadata as m\n"
        "m.entry_points = lambda **kw: []\n"
        "from agentrl.env import make_env\n"
        "from agentrl.agent import AGENTS\n"
        "from agentrl.tool import TOOLS\n"
        "from agentrl.sandbox import SANDBOXES\n"
        "from agentrl.plugins import COMMANDS\n"
        "print(type(make_env('arith/Calculator-v0')).__name__, AGENTS.spec('tool_calling').id,\n"
        "      TOOLS.spec('bash').id, SANDBOXES.spec('local').id, sorted(COMMANDS))\n"
    )
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        check=True,
    )
    assert out.stdout.split() == [
        "CalculatorEnv",
        "tool_calling",
        "bash",
        "local",
        "['eval',",
        "'sft',",
        "'swe',",
        "'train']",
    ]


def test_importing_agentrl_is_cheap() -> None:
    """`import agentrl` must not pull in torch, ray or the server (nothing at import time)."""
    code = "import sys, agentrl; print(','.join(m for m in ('torch', 'ray', 'fastapi', 'transformers') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_every_package_is_typed() -> None:
    for pkg in ("agentrl", *sorted(IMPLEMENTATIONS)):
        assert (ROOT / pkg / "py.typed").is_file(), f"{pkg}/py.typed is missing"


def test_test_module_basenames_are_unique() -> None:
    """The test folders have no ``__init__.py``, so pytest imports each test module by its
    basename: two ``test_pool.py`` in different folders make collection fail with "import file
    mismatch" on a clean clone (a cached ``__pycache__`` can hide it locally)."""
    seen: dict[str, list[str]] = {}
    for path in sorted((ROOT / "tests").rglob("*.py")):
        if path.name == "conftest.py" or "__pycache__" in path.parts:
            continue
        seen.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    clashes = {name: paths for name, paths in seen.items() if len(paths) > 1}
    assert clashes == {}, f"rename one of each clashing test module: {clashes}"
