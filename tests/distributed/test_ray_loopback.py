"""Every server of a Ray started by ``init_ray_local`` listens on loopback only.

The test runs this file as a script in a fresh Python: it imports ray first (as most modules
do), starts Ray through ``init_ray_local``, runs one task so a worker exists, then reads
/proc/net/tcp{,6}, maps each listening socket's inode to the processes holding it (itself and
its descendants: gcs_server, raylet, agents, monitor, workers) and prints them as JSON. A fresh
process keeps the check independent of the Ray instance other tests share, and of the
servers they leave behind.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not Path("/proc/net/tcp").exists(),
    reason="reads listening sockets from Linux /proc/net/tcp and /proc/<pid>/fd",
)

_TCP_LISTEN = "0A"


def _decode(hex_addr: str) -> tuple[str, int]:
    """``0100007F:1F90`` -> ``("127.0.0.1", 8080)``; words are u32 in host byte order."""
    ip_hex, port_hex = hex_addr.split(":")
    raw = b"".join(struct.pack("=I", int(ip_hex[i : i + 8], 16)) for i in range(0, len(ip_hex), 8))
    family = socket.AF_INET if len(raw) == 4 else socket.AF_INET6
    return socket.inet_ntop(family, raw), int(port_hex, 16)


def listening_sockets() -> dict[int, tuple[str, int]]:
    """Socket inode -> (address, port) for every listening TCP socket on this host."""
    found: dict[int, tuple[str, int]] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not Path(table).exists():
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == _TCP_LISTEN:
                found[int(fields[9])] = _decode(fields[1])
    return found


def process_tree(root: int) -> dict[int, str]:
    """pid -> short name for ``root`` and all its descendants."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    names: dict[int, str] = {}
    todo = [root]
    while todo:
        pid = todo.pop()
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [w.decode(errors="replace") for w in argv if w]
        script = next((w for w in words[1:] if w.endswith(".py")), None)
        head = words[0].split()[0] if words else "?"
        names[pid] = os.path.basename(script) if script else os.path.basename(head)
        todo.extend(children.get(pid, []))
    return names


def listeners_of(pids: dict[int, str]) -> list[dict[str, object]]:
    """One row per (process, listening socket) held by ``pids``."""
    table = listening_sockets()
    rows: list[dict[str, object]] = []
    for pid, name in pids.items():
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:[") and int(target[8:-1]) in table:
                addr, port = table[int(target[8:-1])]
                rows.append({"pid": pid, "process": name, "address": addr, "port": port})
    return rows


def is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped  # ::ffff:127.0.0.1, a dual-stack socket bound to 127.0.0.1
    return ip.is_loopback


def _probe() -> None:
    """Start Ray the project's way, wait until its core servers listen, print what listens."""
    import ray
    from ray._private import ray_constants

    from agentrl.distributed import init_ray_local

    init_ray_local(num_cpus=1)
    try:
        worker_pid = ray.get(ray.remote(num_cpus=1)(lambda: os.getpid()).remote())
        rows: list[dict[str, object]] = []
        for _ in range(100):  # the servers start one after another; wait for the last ones
            rows = listeners_of(process_tree(os.getpid()))
            seen = {r["process"] for r in rows} | {r["pid"] for r in rows}
            if {"gcs_server", "raylet", worker_pid} <= seen:
                break
            time.sleep(0.2)
        report = {
            "rows": rows,
            "worker_pid": worker_pid,
            "node_ip": ray.util.get_node_ip_address(),
            "env_after": os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"),
            "flag_after": ray_constants.ENABLE_RAY_CLUSTER,
        }
    finally:
        ray.shutdown()
    print("PROBE " + json.dumps(report))


def test_every_ray_server_listens_on_loopback_only() -> None:
    # a fresh instance of our own: neither an address to join nor the switch preset
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    env.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None)
    proc = subprocess.run(
        [sys.executable, __file__], env=env, capture_output=True, text=True, timeout=180
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("PROBE ")]
    assert proc.returncode == 0 and lines, f"probe failed:\n{proc.stdout}\n{proc.stderr}"
    report = json.loads(lines[-1][len("PROBE ") :])
    rows = report["rows"]

    # the scan saw Ray's own servers and a worker, so an empty result cannot pass
    processes = {r["process"] for r in rows}
    assert {"gcs_server", "raylet"} <= processes, rows
    assert report["worker_pid"] in {r["pid"] for r in rows}, rows

    exposed = [r for r in rows if not is_loopback(str(r["address"]))]
    table = "\n".join(
        f"  {r['process']} (pid {r['pid']}) {r['address']}:{r['port']}" for r in exposed
    )
    assert not exposed, f"Ray servers listening beyond loopback:\n{table}"
    assert report["node_ip"] == "127.0.0.1"
    # the single-machine switch is scoped to ray.init: nothing leaks into later processes
    assert report["env_after"] is None
    assert report["flag_after"] is True
    # token auth stays on, without Ray's notice about it on every start
    assert "Token authentication is enabled" not in proc.stderr, proc.stderr[-2000:]


def test_listening_sockets_reads_a_real_listener() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        rows = listeners_of({os.getpid(): "pytest"})
    assert {"pid": os.getpid(), "process": "pytest", "address": "127.0.0.1", "port": port} in rows
    assert is_loopback("::ffff:127.0.0.1") and is_loopback("::1")
    assert not is_loopback("0.0.0.0") and not is_loopback("::") and not is_loopback("192.0.2.2")


if __name__ == "__main__":
    _probe()
