"""torch.distributed rendezvous keeps rank 0's store (and gloo) on the master address.

torch's ``env://`` rendezvous starts rank 0's TCPStore on every interface (``:::PORT``). The
WorkerGroup test starts a real 2-rank gloo group on the shared local Ray, and while it is up
maps the listening sockets of both rank processes (/proc/net/tcp, helpers shared with
test_ray_loopback) and checks that each one is on loopback, the store's among them. The
world-of-one test runs this file as a script in a fresh Python (a process group cannot be
torn down cleanly inside pytest's own process).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest
from distributed_workers import EchoWorker
from test_ray_loopback import is_loopback, listeners_of, pytestmark  # noqa: F401

from agentrl.distributed import ResourcePool, WorkerGroup, rendezvous
from agentrl.errors import ConfigError


def _exposed(rows: list[dict[str, object]]) -> str:
    bad = [r for r in rows if not is_loopback(str(r["address"]))]
    return "\n".join(f"  {r['process']} (pid {r['pid']}) {r['address']}:{r['port']}" for r in bad)


@pytest.fixture(scope="module")
def group(ray_local: None) -> Iterator[WorkerGroup[EchoWorker]]:
    pool = ResourcePool(ResourcePool.Config(bundles_per_node=2, cpus_per_bundle=0.5))
    wg = WorkerGroup(pool, EchoWorker)
    yield wg
    wg.shutdown()


def test_worker_group_rendezvous_listens_on_loopback_only(
    group: WorkerGroup[EchoWorker],
) -> None:
    info = group.whoami()
    port = int(str(info[0]["master_port"]))
    pids = {int(str(i["pid"])): f"rank{i['rank']}" for i in info}
    rows = listeners_of(pids)

    # the scan found the store rank 0 serves, so an empty or partial scan cannot pass
    store = [r for r in rows if r["port"] == port]
    assert store and {r["process"] for r in store} == {"rank0"}, rows
    exposed = _exposed(rows)
    assert not exposed, f"rank processes listening beyond loopback:\n{exposed}"
    # the group the store set up works: rank r adds 1 + r, 1 + 2 = 3 on every rank
    assert group.all_reduce_sum(1.0) == [3.0, 3.0]


def test_world_of_one_binds_port_zero_and_publishes_it() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "MASTER_PORT")}
    proc = subprocess.run(
        [sys.executable, __file__], env=env, capture_output=True, text=True, timeout=120
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("PROBE ")]
    assert proc.returncode == 0 and lines, f"probe failed:\n{proc.stdout}\n{proc.stderr}"
    report = json.loads(lines[-1][len("PROBE ") :])
    port = int(report["env"]["MASTER_PORT"])
    assert port > 0
    assert report["env"] | {"MASTER_PORT": "*"} == {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "*",
        "RANK": "0",
        "WORLD_SIZE": "1",
    }
    assert port in {r["port"] for r in report["rows"]}, report["rows"]
    exposed = _exposed(report["rows"])
    assert not exposed, f"listening beyond loopback:\n{exposed}"
    assert report["sum"] == 5.0


def test_reserved_port_is_held_until_rank0_joins() -> None:
    port = rendezvous.reserve_port()
    try:
        with socket.socket() as other, pytest.raises(OSError):
            other.bind(("127.0.0.1", port))
        assert {"pid": os.getpid(), "address": "127.0.0.1", "port": port} in [
            {k: r[k] for k in ("pid", "address", "port")}
            for r in listeners_of({os.getpid(): "pytest"})
        ]
    finally:
        held = rendezvous._take_reserved("127.0.0.1", port)
        assert held is not None
        held.close()


def test_only_rank0_may_ask_for_port_zero() -> None:
    with pytest.raises(ConfigError, match="only rank 0 may pick its port"):
        rendezvous.init_process_group_bound(
            backend="gloo", master_addr="127.0.0.1", master_port=0, rank=1, world_size=2
        )


def test_from_env_names_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ConfigError, match="MASTER_ADDR, MASTER_PORT, WORLD_SIZE not set"):
        rendezvous.init_process_group_from_env("gloo")


def _probe() -> None:
    """Rank 0 of a world of one on port 0, as the Megatron engine joins without a launcher."""
    import torch
    import torch.distributed as dist

    rendezvous.init_process_group_bound(
        backend="gloo", master_addr="127.0.0.1", master_port=0, rank=0, world_size=1
    )
    t = torch.tensor([5.0])
    dist.all_reduce(t)
    names = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")
    report = {
        "rows": listeners_of({os.getpid(): "probe"}),
        "env": {n: os.environ[n] for n in names},
        "sum": float(t.item()),
    }
    dist.destroy_process_group()
    print("PROBE " + json.dumps(report))


if __name__ == "__main__":
    _probe()
