"""Several seeds of one recipe trained at once, each in a process of its own.

    agentrl train recipes/gui_gpu.yaml --seeds 0,1 --jobs 2
        -> python -m trainers.cli train RECIPE ... name=<name>-s0 seed=0 train.num_cpus=8
           python -m trainers.cli train RECIPE ... name=<name>-s1 seed=1 train.num_cpus=8
        -> each run's summary.json, read back for the mean +/- standard error

A small model leaves a large GPU mostly idle (kernel launches and the host's Python set the
pace), so two or more runs on it at once take little longer than one. Every run is a process
of its own (its own Ray, inference server and CUDA context): nothing is shared but the
devices. Each run's output goes to ``<log_dir>/seed<N>.log`` and, line by line with a
``[seed N]`` prefix, to this process's stderr. A run that fails does not stop the others;
once all have ended, the failures are raised together, each with its log's last lines, and
the runs that finished keep their results on disk.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

from agentrl.errors import AgentRLError

TAIL_LINES = 20


class _Job:
    """One seed's training process, its output copied to a log file and to stderr."""

    def __init__(self, seed: int, argv: list[str], log: Path) -> None:
        self.seed, self.log = seed, log
        self.started, self.started_at = time.monotonic(), time.time()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "trainers.cli", "train", *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
        )
        self._copier = threading.Thread(target=self._copy, name=f"seed{seed}-log", daemon=True)
        self._copier.start()

    def _copy(self) -> None:
        out: IO[str] | None = self.proc.stdout
        assert out is not None
        with self.log.open("w") as f:
            for line in out:
                f.write(line)
                f.flush()
                sys.stderr.write(f"[seed {self.seed}] {line}")

    def wait(self, timeout: float | None = None) -> int | None:
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        self._copier.join()
        return rc


def run_seed_jobs(
    argv: dict[int, list[str]], run_dirs: dict[int, Path], *, jobs: int, log_dir: Path
) -> list[dict[str, Any]]:
    """Run ``trainers.cli train`` once per seed with ``argv[seed]``, ``jobs`` at a time; return
    each run's ``summary.json`` (read from ``run_dirs[seed]``) in the order of ``argv``.

    Raises AgentRLError naming every seed that failed, after all have ended. On Ctrl-C the
    runs get it too (same process group) and are waited for, so each writes its checkpoint.
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    waiting = list(argv)
    started: dict[int, _Job] = {}
    running: list[_Job] = []
    done: dict[int, int] = {}
    try:
        while waiting or running:
            while waiting and len(running) < jobs:
                seed = waiting.pop(0)
                started[seed] = _Job(seed, argv[seed], log_dir / f"seed{seed}.log")
                running.append(started[seed])
            for job in list(running):
                rc = job.wait(timeout=0.5)
                if rc is not None:
                    running.remove(job)
                    done[job.seed] = rc
                    mins = (time.monotonic() - job.started) / 60
                    sys.stderr.write(f"[seed {job.seed}] ended with code {rc} ({mins:.1f} min)\n")
    finally:
        for job in running:  # Ctrl-C or an error here: let every run end before returning
            job.wait()
    failed = {s: rc for s, rc in done.items() if rc != 0}

    def wrote_summary(s: int) -> bool:  # this time: a resumed run's old one does not count
        f = run_dirs[s] / "summary.json"
        return f.exists() and f.stat().st_mtime >= started[s].started_at

    missing = [s for s in argv if s not in failed and not wrote_summary(s)]
    if failed or missing:
        lines = []
        for s in argv:
            if s in failed or s in missing:
                why = f"exit code {failed[s]}" if s in failed else "no summary.json written"
                tail = (log_dir / f"seed{s}.log").read_text().splitlines()[-TAIL_LINES:]
                lines.append(f"seed {s}: {why}; log {log_dir / f'seed{s}.log'}, last lines:")
                lines += [f"    {t}" for t in tail]
        ok = [s for s in argv if s not in failed and s not in missing]
        raise AgentRLError(
            f"{len(failed) + len(missing)} of {len(argv)} seed runs failed"
            + (f" (seeds {ok} finished; their results are in their run dirs)" if ok else "")
            + ":\n"
            + "\n".join(lines)
        )
    return [json.loads((run_dirs[s] / "summary.json").read_text()) for s in argv]
