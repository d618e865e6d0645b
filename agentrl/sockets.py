"""Listening sockets bound to one address (loopback by default), for stores and servers.

torch's ``TCPStore`` listens on every interface when it opens its own socket; the project's
rendezvous stores (``agentrl.distributed.rendezvous``, the weight-update broadcast group in
``agentrl.inference.server_collective``) open the socket here, on the address they were given,
and hand its descriptor over (``master_listen_fd``).
"""

from __future__ import annotations

import socket

from agentrl.errors import ConfigError


def listen_socket(address: str, port: int, *, purpose: str = "a store") -> socket.socket:
    """A socket listening on ``address:port`` (0 = a port the OS picks).

    Raises ConfigError naming the address, the port and ``purpose`` when it cannot bind.
    """
    family, kind, _, _, addr = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
        sock.listen(1024)
    except OSError as exc:
        sock.close()
        raise ConfigError(
            f"cannot listen on {address}:{port} for {purpose} ({exc}); pick a free port."
        ) from exc
    return sock
