"""Start the embedded inference server as a child process and wait until it answers.

    ServerProcess(model_path).start() -> python -m agentrl.inference.server --port <free port>
        -> poll GET /health until 200 (bounded) -> .url
    .stop(): SIGTERM, then SIGKILL after a grace period; .kill(): SIGKILL now (tests, crashes)
    .restart(): kill what is left, start the same command on the same port, wait until healthy
        (a supervisor's job; refused once ``stop()`` was called)

Logs go to a file (``log_path``, or a temp file) so a failed start can quote them.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import httpx2

from agentrl.errors import InferenceError
from agentrl.gpu_env import server_env
from agentrl.inference.protocol import DEFAULT_MAX_BATCH_SIZE

logger = logging.getLogger(__name__)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class ServerProcess:
    """One embedded server in a subprocess on loopback. Use as a context manager::

    with ServerProcess(ServerProcess.Config(model="/path/to/model")) as server:
        client = InferenceClient([server.url])
    """

    @dataclass(kw_only=True)
    class Config:
        model: str
        """Local Hugging Face model directory."""
        host: str = "127.0.0.1"
        port: int = 0
        """0 picks a free port."""
        dtype: str = "float32"
        max_batch_size: int = DEFAULT_MAX_BATCH_SIZE
        seed: int = 0
        num_threads: int = 0
        startup_timeout_s: float = 120.0
        stop_timeout_s: float = 10.0
        log_path: str | None = None
        """Where stdout/stderr go; a temp file when None."""
        extra_args: list[str] = field(default_factory=list)

    def __init__(self, cfg: ServerProcess.Config) -> None:
        self.cfg = cfg
        self.port = cfg.port or free_port(cfg.host)
        self.url = f"http://{cfg.host}:{self.port}"
        if cfg.log_path:
            self.log_path = Path(cfg.log_path)
        else:
            fd, name = tempfile.mkstemp(prefix=f"agentrl-server-{self.port}-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()  # spawn vs stop from different threads
        self._stopped = False

    def command(self) -> list[str]:
        c = self.cfg
        return [
            sys.executable,
            "-m",
            "agentrl.inference.server",
            "--model",
            c.model,
            "--host",
            c.host,
            "--port",
            str(self.port),
            "--dtype",
            c.dtype,
            "--max-batch-size",
            str(c.max_batch_size),
            "--seed",
            str(c.seed),
            "--num-threads",
            str(c.num_threads),
            "--log-level",
            "warning",
            "--exit-with-parent",
            str(os.getpid()),
            *c.extra_args,
        ]

    def start(self) -> ServerProcess:
        """Spawn and wait until healthy."""
        self.spawn()
        self.wait_ready()
        return self

    def spawn(self) -> None:
        """Start the process without waiting (start several, then ``wait_ready`` each)."""
        with self._lock:
            self._stopped = False
            self._popen()

    def _popen(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env=self.environment(),
            )

    def restart(self) -> None:
        """Kill what is left of the server, start it again with the same command on the same
        port, and wait until it answers. InferenceError if ``stop()`` was called meanwhile, or
        if the new process exits or stays silent past ``startup_timeout_s``."""
        self.kill()
        with self._lock:
            if self._stopped:
                raise InferenceError(f"server {self.url} was stopped; not restarting it")
            old = self.pid
            self._popen()
        logger.warning("restarting inference server %s (pid %s -> %s)", self.url, old, self.pid)
        self.wait_ready()

    def environment(self) -> dict[str, str]:
        """The child's environment: ours with NVLink multicast off (``gpu_env``); backends
        add their own variables with ``server_env(theirs)``."""
        return server_env()

    def wait_ready(self) -> None:
        """Poll GET /health until 200; InferenceError (with the log tail) on exit or timeout."""
        deadline = time.monotonic() + self.cfg.startup_timeout_s
        while time.monotonic() < deadline:
            if self._stopped:
                raise InferenceError(f"server {self.url} was stopped while starting")
            if self._proc is not None and self._proc.poll() is not None:
                raise InferenceError(
                    f"inference server exited with code {self._proc.returncode} during startup; "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            try:
                if (
                    httpx2.get(self.url + "/health", timeout=1.0, trust_env=False).status_code
                    == 200
                ):
                    logger.info("embedded server pid %s ready at %s", self.pid, self.url)
                    return
            except httpx2.HTTPError:
                pass
            time.sleep(0.1)
        self.kill()
        raise InferenceError(
            f"inference server did not answer {self.url}/health within {self.cfg.startup_timeout_s:.0f} s; "
            f"log {self.log_path}:\n{self.log_tail()}"
        )

    def log_tail(self, n_chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n_chars:]
        except OSError:
            return ""

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def returncode(self) -> int | None:
        """The exit code once the process has ended (negative: killed by that signal)."""
        return self._proc.poll() if self._proc is not None else None

    def stop(self) -> None:
        """SIGTERM, wait ``stop_timeout_s``, then SIGKILL. A later ``restart()`` is refused."""
        with self._lock:
            self._stopped = True
            proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(self.cfg.stop_timeout_s)
        except subprocess.TimeoutExpired:
            logger.warning("server pid %d ignored SIGTERM; killing it", proc.pid)
            self.kill()

    def kill(self) -> None:
        """SIGKILL now (simulates a crash)."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(10)

    def __enter__(self) -> ServerProcess:
        return self.start() if self._proc is None else self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
