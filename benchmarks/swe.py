"""SWE task start, grading and 64 concurrent trajectories, next to a fresh docker container per task.

    python benchmarks/swe.py [--n 20] [--concurrency 64] [--no-docker]
                             [--tasks FILE --repos-dir DIR]

Without ``--tasks`` it builds a small repository under /var/tmp (the one the tests use: a
buggy ``add``, hidden tests) and its test environment, and runs every figure on it.

1. **Warm task start** (``--n`` resets after one warm-up): ``SWEEnv.areset`` on the local
   backend, i.e. a new hardened sandbox holding the task's scrubbed workspace, made once per
   task and copied per trajectory. Baseline, same run: one fresh docker container per task
   (``DockerSandbox`` create with the same workspace; the image is built locally by
   ``scripts/install-sandbox-deps.sh --image``). Goal: local p50 <= 100 ms and >= 10x faster
   than docker. Without a reachable Docker engine the baseline is reported missing and the
   ratio goal is not met. Also printed, not in the goal: the time from each reset to its first
   command's result (a reset does not wait for the local sandbox's exec agent, which starts
   in its background; a command at once waits for the rest of that start).
2. **Concurrency** (``--concurrency``): that many trajectories at once, each reset -> three
   commands (read the file, run one test, apply the fix) -> grade. Reported: errors, wall
   time, grading p50, peak disk and memory per trajectory (summed over the sandboxes' homes and
   cgroups, sampled every 0.2 s), the share of a trajectory's time spent in sandboxes (reset,
   commands and grading: all of a scripted trajectory, since no model runs) and leaks after all
   closed: processes, cgroups, mounts and sandbox folders. Goal: 0 errors, 0 leaks.

Figures on a shared 2-core machine vary with load (printed); compare rows of one run only.
The last line is the JSON headline: ``{benchmark, baseline, ours, ratio, goal, met}``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agentrl.types import Message  # noqa: E402
from envs.swe.env import SWEEnv  # noqa: E402
from envs.swe.task import SWETask, load_tasks  # noqa: E402

GOAL_P50_S = 0.100
GOAL_RATIO = 10.0
PREFIX = f"agentrl-swebench{os.getpid()}-"
FIX = "sed -i '0,/return a - b/s//return a + b/' calc/ops.py"


def build_repo(root: Path) -> tuple[list[SWETask], dict[str, Any]]:
    """The tests' tiny repository and its test env, under ``root`` (kept between runs)."""
    from envs.swe.pyenv import build_test_env
    from tests.envs.swe_repo import make_calc_repo

    root.mkdir(parents=True, exist_ok=True)
    r, task = make_calc_repo(root)
    env = build_test_env(root / "env")
    repo_envs = {"calc": {"repo_dir": str(r), "python": env.python, "ro_paths": [env.prefix]}}
    return [task], repo_envs


def pct(xs: list[float], q: float) -> float:
    return sorted(xs)[min(len(xs) - 1, int(q * len(xs)))]


async def warm_starts(make_env: Any, n: int) -> tuple[list[float], list[float]]:
    """``n`` warm resets: (time each reset took, time to each reset's first command result).

    The second figure is what a trajectory waits for when its first command comes at once: the
    local sandbox's exec agent starts in the background of a reset, so a command right after
    it waits for the rest of that start (in a rollout the model's first reply comes first)."""
    env = make_env()
    try:
        await env.areset(seed=0)  # warm-up: the task's workspace, templates, spare disks
        resets, firsts = [], []
        for i in range(n):
            t0 = time.perf_counter()
            await env.areset(seed=i + 1)
            resets.append(time.perf_counter() - t0)
            r = await env.sandbox.exec("true", timeout_s=60)
            firsts.append(time.perf_counter() - t0)
            assert r.exit_code == 0, r
        return resets, firsts
    finally:
        await env.aclose()


def docker_ready() -> str | None:
    try:
        import docker

        client = docker.from_env()
        client.ping()
    except Exception as e:
        return f"no Docker engine ({type(e).__name__}: {e})"
    from sandboxes.docker import DockerSandbox

    image = DockerSandbox.Config().image
    try:
        client.images.get(image)
    except Exception:
        return f"no {image} image; run scripts/install-sandbox-deps.sh --image"
    return None


async def trajectory(make_env: Any, seed: int) -> dict[str, float]:
    env = make_env()
    t0 = time.perf_counter()
    try:
        await env.areset(seed=seed)
        for cmd in ("cat calc/ops.py", "python -m pytest -q -x tests/test_ops.py", FIX):
            await env.astep(Message(role="assistant", content=f"```bash\n{cmd}\n```"))
        t1 = time.perf_counter()
        _, reward, done, _, info = await env.astep(
            Message(role="assistant", content="```bash\nsubmit\n```")
        )
        t2 = time.perf_counter()
        assert done and reward == 1.0, info["report"]
        return {"wall_s": t2 - t0, "grade_s": t2 - t1}
    finally:
        await env.aclose()


def _glob(root: Path, pattern: str) -> list[Path]:
    """``root.glob(pattern)``, tolerating folders that vanish while it walks (cgroups do)."""
    for _ in range(5):
        try:
            return list(root.glob(pattern))
        except FileNotFoundError:
            continue
    return []


def usage(root: Path) -> tuple[int, int, int]:
    """(homes, bytes on disk, bytes of memory) of the live sandboxes under ``root``."""
    disk = mem = homes = 0
    for home in _glob(root, "*"):
        if not home.is_dir():
            continue
        homes += 1
        for dirpath, _, files in os.walk(home):
            for f in files:
                with contextlib.suppress(OSError):
                    disk += os.lstat(os.path.join(dirpath, f)).st_blocks * 512
    cg = Path("/sys/fs/cgroup")
    for f in [
        *_glob(cg, "memory/agentrl*/**/memory.usage_in_bytes"),
        *_glob(cg, "agentrl*/**/memory.current"),
    ]:
        if PREFIX in str(f) and f.parent.name.startswith(PREFIX):
            with contextlib.suppress(OSError, ValueError):
                mem += int(f.read_text())
    return homes, disk, mem


def leaks(root: Path) -> dict[str, int]:
    """What the benchmark's sandboxes (named ``PREFIX...``) left behind."""
    import psutil

    from sandboxes._host import MARKER

    procs = 0
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            if p.environ().get(MARKER, "").startswith(PREFIX):
                procs += 1
    cg = Path("/sys/fs/cgroup")
    cgroups = len(_glob(cg, f"*/agentrl*/{PREFIX}*") + _glob(cg, f"agentrl*/{PREFIX}*"))
    mounts = Path("/proc/mounts").read_text().count(str(root))
    dirs = sum(1 for _ in root.glob(f"{PREFIX}*"))
    return {"processes": procs, "cgroups": cgroups, "mounts": mounts, "dirs": dirs}


async def concurrent(make_env: Any, k: int, root: Path) -> dict[str, Any]:
    peak = {"homes": 0, "disk": 0, "mem": 0}
    stop = asyncio.Event()

    async def sample() -> None:
        while not stop.is_set():
            homes, disk, mem = await asyncio.to_thread(usage, root)
            if homes:
                peak["homes"] = max(peak["homes"], homes)
                peak["disk"] = max(peak["disk"], disk)
                peak["mem"] = max(peak["mem"], mem)
            await asyncio.sleep(0.2)

    sampler = asyncio.create_task(sample())
    t0 = time.perf_counter()
    results = await asyncio.gather(
        *(trajectory(make_env, i) for i in range(k)), return_exceptions=True
    )
    wall = time.perf_counter() - t0
    stop.set()
    await sampler
    errors = [r for r in results if isinstance(r, BaseException)]
    ok = [r for r in results if not isinstance(r, BaseException)]
    await asyncio.sleep(0.5)
    homes = max(peak["homes"], 1)
    return {
        "trajectories": k,
        "errors": len(errors),
        "first_error": repr(errors[0])[:300] if errors else None,
        "wall_s": round(wall, 2),
        "grade_p50_s": round(statistics.median(r["grade_s"] for r in ok), 3) if ok else None,
        "trajectory_p50_s": round(statistics.median(r["wall_s"] for r in ok), 3) if ok else None,
        "peak_sandboxes": peak["homes"],
        "disk_per_sandbox_mb": round(peak["disk"] / homes / 2**20, 2),
        "memory_per_sandbox_mb": round(peak["mem"] / homes / 2**20, 2),
        "sandbox_share_of_trajectory": 1.0,  # scripted: no model time, all of it is sandbox
        "leaks": leaks(root),
    }


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=20, help="warm resets measured per backend")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--no-docker", action="store_true", help="skip the docker baseline")
    ap.add_argument("--tasks", default="", help="SWE task file (default: a built-in tiny repo)")
    ap.add_argument("--repos-dir", default="", help="with --tasks: `agentrl swe prepare --out`")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="agentrl-swebench-", dir="/var/tmp"))
    os.chmod(work, 0o755)
    try:
        if args.tasks:
            tasks, repo_envs, repos_dir = load_tasks(args.tasks), None, args.repos_dir
        else:
            tasks, repo_envs = build_repo(Path("/var/tmp/agentrl-swebench-repo"))
            repos_dir = ""
        sb_root = work / "sandboxes"
        sb_root.mkdir()
        os.chmod(sb_root, 0o711)

        def make(kind: str = "local", **extra: Any) -> Any:
            def f() -> SWEEnv:
                return SWEEnv(
                    tasks,
                    repos_dir=repos_dir,
                    repo_envs=repo_envs,
                    mode="bash",
                    sandbox_kind=kind,
                    sandbox_options={"root_dir": str(sb_root), **extra},
                    workspace_cache=str(work / "workspaces"),
                    sandbox_prefix=PREFIX,
                )

            return f

        load0 = os.getloadavg()[0]
        local, local_first = await warm_starts(make(), args.n)
        print(
            f"local warm start: p50 {pct(local, 0.5) * 1000:.0f} ms, p99 {pct(local, 0.99) * 1000:.0f} ms (n={len(local)}); "
            f"to the first command's result: p50 {pct(local_first, 0.5) * 1000:.0f} ms"
        )
        docker_p50 = None
        why = "skipped (--no-docker)" if args.no_docker else docker_ready()
        if why is None:
            d, d_first = await warm_starts(make("docker"), max(5, args.n // 4))
            docker_p50 = pct(d, 0.5)
            print(
                f"docker fresh container per task: p50 {docker_p50 * 1000:.0f} ms (n={len(d)}); "
                f"to the first command's result: p50 {pct(d_first, 0.5) * 1000:.0f} ms"
            )
        else:
            print(f"docker baseline: {why}")
        conc = await concurrent(make(), args.concurrency, sb_root)
        print("concurrency:", json.dumps(conc))
        ours = pct(local, 0.5)
        ratio = (docker_p50 / ours) if docker_p50 else None
        clean = conc["errors"] == 0 and not any(conc["leaks"].values())
        met = None if ratio is None else (ours <= GOAL_P50_S and ratio >= GOAL_RATIO and clean)
        print(f"load average {load0:.1f} -> {os.getloadavg()[0]:.1f}")
        print(
            json.dumps(
                {
                    "benchmark": "swe warm task start p50 (s), local vs a fresh docker container "
                    f"per task; {args.concurrency} concurrent trajectories without errors or leaks",
                    "baseline": round(docker_p50, 4) if docker_p50 else f"not measured: {why}",
                    "ours": round(ours, 4),
                    "ratio": round(ratio, 2) if ratio else None,
                    "goal": f"ours <= {GOAL_P50_S} s and ratio >= {GOAL_RATIO}; 0 errors, 0 leaks",
                    "met": met,
                }
            )
        )
        if not clean:
            sys.exit(f"errors or leaks in the concurrent run: {conc}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
