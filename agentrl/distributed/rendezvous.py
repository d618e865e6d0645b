"""Join torch.distributed with rank 0's store listening on the master address, not on ``::``.

torch's ``env://`` rendezvous starts rank 0's ``TCPStore`` on every interface (``:::PORT``),
whatever ``MASTER_ADDR`` says. Here rank 0 opens the listening socket itself, bound to the
master address, and hands it to the store; the other ranks connect as plain clients; every
rank then joins through ``init_process_group(store=...)``:

    rank 0:  reserve_port("127.0.0.1") -> port P, socket listening on 127.0.0.1:P (held)
             ... P travels to the other ranks (WorkerGroup: HostInfo.port -> WorkerContext) ...
             init_process_group_bound(master_addr, P, rank=0)
               -> TCPStore(master_addr, P, is_master=True, master_listen_fd=<held socket>)
    rank r:  init_process_group_bound(master_addr, P, rank=r) -> TCPStore client
    all:     MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE set -> dist.init_process_group(store=...)

Because rank 0 keeps the socket it picked the port with, no other process can take the port
in between. ``master_port=0`` on rank 0 of a world of one binds any free port and publishes it
in ``MASTER_PORT``. Under torchrun (``TORCHELASTIC_USE_AGENT_STORE=True``) the launcher's
agent already serves the store, so every rank, rank 0 included, connects as a client.

With a loopback master the transports' own listeners stay on loopback too: gloo (unless
``GLOO_SOCKET_IFNAME`` is set) and NCCL's bootstrap (unless ``NCCL_SOCKET_IFNAME`` is set)
use the loopback interface, where by default they pick the host name's or a routable one.
"""

from __future__ import annotations

import datetime
import ipaddress
import logging
import os
import socket
import threading

from agentrl.errors import ConfigError
from agentrl.sockets import listen_socket

logger = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
AGENT_STORE_ENV = "TORCHELASTIC_USE_AGENT_STORE"

_reserved: dict[tuple[str, int], socket.socket] = {}
_lock = threading.Lock()


def reserve_port(host: str = LOOPBACK) -> int:
    """Listen on ``host`` at a port the OS picks; rank 0's store later serves on this socket.

    The socket stays open (so the port stays ours) until ``init_process_group_bound`` on this
    process joins as rank 0 with the same ``host`` and port; a rank 0 that never joins keeps
    it, idle, on ``host``, until the process exits.
    """
    sock = _listen(host, 0)
    port = int(sock.getsockname()[1])
    with _lock:
        _reserved[(host, port)] = sock
    return port


def init_process_group_bound(
    *,
    backend: str,
    master_addr: str,
    master_port: int,
    rank: int,
    world_size: int,
    timeout_s: float | None = None,
) -> None:
    """``dist.init_process_group`` with rank 0's store listening on ``master_addr`` only.

    Sets MASTER_ADDR, MASTER_PORT (the real port when 0 was asked), RANK and WORLD_SIZE in the
    environment, as ``env://`` callers expect. ``timeout_s=None`` keeps torch's defaults.
    """
    import torch.distributed as dist
    from torch.distributed import TCPStore
    from torch.distributed.constants import default_pg_timeout

    timeout = datetime.timedelta(seconds=timeout_s) if timeout_s is not None else None
    store_timeout = timeout or default_pg_timeout
    if rank == 0 and os.environ.get(AGENT_STORE_ENV) != str(True):
        sock = _take_reserved(master_addr, master_port) or _listen(master_addr, master_port)
        master_port = int(sock.getsockname()[1])
        store = TCPStore(
            master_addr,
            master_port,
            world_size,
            is_master=True,
            timeout=store_timeout,
            master_listen_fd=sock.detach(),
        )
    else:
        if master_port == 0:
            raise ConfigError(
                f"rank {rank} was given master port 0; only rank 0 may pick its port. Pass "
                "rank 0's real port (MASTER_PORT) to the other ranks."
            )
        store = TCPStore(
            master_addr, master_port, world_size, is_master=False, timeout=store_timeout
        )
    os.environ.update(
        MASTER_ADDR=master_addr,
        MASTER_PORT=str(master_port),
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
    )
    if _is_loopback(master_addr):
        _keep_transports_on_loopback(backend)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
    logger.debug(
        "rank %d/%d joined %s at %s:%d", rank, world_size, backend, master_addr, master_port
    )


def init_process_group_from_env(backend: str, timeout_s: float | None = None) -> None:
    """``init_process_group_bound`` with MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE from the
    environment (what a launcher such as torchrun, or a WorkerGroup, sets)."""
    names = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")
    missing = [n for n in names if n not in os.environ]
    if missing:
        raise ConfigError(
            f"joining torch.distributed from the environment needs {', '.join(names)}; "
            f"{', '.join(missing)} not set. Start the ranks with a launcher (torchrun, a "
            "WorkerGroup) or set them."
        )
    init_process_group_bound(
        backend=backend,
        master_addr=os.environ["MASTER_ADDR"],
        master_port=int(os.environ["MASTER_PORT"]),
        rank=int(os.environ["RANK"]),
        world_size=int(os.environ["WORLD_SIZE"]),
        timeout_s=timeout_s,
    )


def _listen(host: str, port: int) -> socket.socket:
    purpose = "the torch.distributed rendezvous store (pass a free MASTER_PORT, or 0 on rank 0)"
    return listen_socket(host, port, purpose=purpose)


def _take_reserved(host: str, port: int) -> socket.socket | None:
    """The socket ``reserve_port`` holds for ``host:port``; another host's reservation of that
    port is closed (the store listens on the master address instead)."""
    with _lock:
        sock = _reserved.pop((host, port), None)
        stale = [key for key in _reserved if key[1] == port]
        for key in stale:
            _reserved.pop(key).close()
    return sock


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return address == "localhost"


def _keep_transports_on_loopback(backend: str) -> None:
    lo = _loopback_interface()
    if lo is None:
        return
    if "gloo" in backend:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", lo)
    if "nccl" in backend:
        os.environ.setdefault("NCCL_SOCKET_IFNAME", lo)


def _loopback_interface() -> str | None:
    """The loopback interface's name (``lo`` on Linux, ``lo0`` on macOS), or None."""
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return None
    return next((n for n in ("lo", "lo0") if n in names), None)
