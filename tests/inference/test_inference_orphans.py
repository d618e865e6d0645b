"""A server started by ServerProcess does not outlive a SIGKILLed launcher."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil

from agentrl.tiny import make_tiny_model

LAUNCHER = """
import sys, time
from agentrl.inference.launch import ServerProcess
srv = ServerProcess(ServerProcess.Config(model=sys.argv[1], num_threads=1)).start()
print(srv._proc.pid, flush=True)
time.sleep(600)
"""


def test_server_exits_when_its_launcher_is_killed(tmp_path) -> None:
    model = make_tiny_model(tmp_path / "model")
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, str(model)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert launcher.stdout is not None
        server_pid = int(launcher.stdout.readline())
        assert psutil.pid_exists(server_pid)
    finally:
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if psutil.Process(server_pid).status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.NoSuchProcess:
            break
        time.sleep(0.2)
    else:
        os.kill(server_pid, signal.SIGKILL)
        raise AssertionError("the server outlived its killed launcher by 60 s")
