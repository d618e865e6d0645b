#!/usr/bin/env bash
# recipes/swe_gpu.yaml in one command on one GPU machine, prepare included (< 10 minutes):
#   export PYTHONPATH=/tmp/site:$PWD   # where the python packages come from, if not installed
#   bash recipes/swe_gpu.sh [key=value overrides for agentrl train]
# 1. checks what the local sandbox backend needs: bwrap (bubblewrap), git, /usr/bin/python3 (the
#    repositories' test envs are venvs of it), and that a sandbox really starts;
# 2. `agentrl swe prepare` (the sdists from PyPI, or, when the machine is offline, from
#    $SWE_SDISTS, default runs/swe-sdists: a folder holding the seven .tar.gz that
#    `agentrl swe prepare` keeps in <out>/_downloads);
# 3. `agentrl train recipes/swe_gpu.yaml`;
# 4. prints the step-time breakdown (mean seconds per RL step by phase) and the eval figures.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
repos=${SWE_REPOS:-/var/tmp/agentrl-swe}
sdists=${SWE_SDISTS:-runs/swe-sdists}
py=${PYTHON:-python}

missing=()
for b in bwrap git; do command -v "$b" >/dev/null 2>&1 || missing+=("$b"); done
[ -x /usr/bin/python3 ] || missing+=("/usr/bin/python3")
"$py" -c 'import pytest, torch' 2>/dev/null || missing+=("python packages pytest/torch for $py")
if ((${#missing[@]})); then
  echo "swe_gpu: MISSING: ${missing[*]}." \
    "The recipe's sandboxes use the local backend, which runs commands under bubblewrap" \
    "(bwrap); the tasks' repositories are git repos, tested with venvs of /usr/bin/python3" \
    "holding pytest copied from $py. Install them (Debian/Ubuntu: apt-get install" \
    "bubblewrap git python3, or scripts/install-sandbox-deps.sh) and run again." >&2
  exit 2
fi
echo "swe_gpu: bwrap $(command -v bwrap), git $(git --version | cut -d' ' -f3), $(/usr/bin/python3 -V)"

agentrl() { "$py" -c 'from agentrl.cli import main; main()' "$@"; }

if ls "$sdists"/*.tar.gz >/dev/null 2>&1; then
  mkdir -p "$repos/_downloads" && cp -n "$sdists"/*.tar.gz "$repos/_downloads/"
fi
agentrl swe prepare --out "$repos" --tasks data/swe/tasks.jsonl --tasks data/swe/negate.jsonl | tail -n 1

"$py" - <<'PY'
import asyncio

import sandboxes  # noqa: F401  (registers the local backend)

from agentrl.sandbox import make_sandbox


async def main() -> None:
    async with await make_sandbox("local", name="agentrl-swe-gpu-check") as sb:
        r = await sb.exec("echo sandbox-ok")
        if "sandbox-ok" not in r.stdout:
            raise SystemExit(f"swe_gpu: a local sandbox does not run commands: {r.output[-500:]}")


asyncio.run(main())
print("swe_gpu: a local sandbox runs")
PY
prepared=$(date +%s)

agentrl train recipes/swe_gpu.yaml "$@"
end=$(date +%s)

"$py" - "$((prepared - start))" "$((end - prepared))" "$@" <<'PY'
import json
import sys
from pathlib import Path

from trainers.config import load_run_config

prep_s, train_s, overrides = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3:]
run = load_run_config("recipes/swe_gpu.yaml", overrides).run_dir
rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line]
steps = [r for r in rows if "timing/step_s" in r]
print(f"swe_gpu: prepare + checks {prep_s:.0f} s, agentrl train {train_s:.0f} s, {len(steps)} RL steps")
if steps:
    keys = sorted({k for r in steps for k in r if k.startswith("timing/")})
    for k in keys:
        vals = [r[k] for r in steps if k in r]
        print(f"  {k:32} mean {sum(vals) / len(vals):8.2f} s   total {sum(vals):8.1f} s")
for r in rows:
    shown = {k: v for k, v in r.items() if k.startswith("eval/") and "success" in k or k == "eval/reward_mean"}
    if shown:
        print("  step", r.get("step"), json.dumps(shown))
PY
