"""The internal gRPC servers' one shape: the NameServer's and navigation's on grpc.aio, the broker's
on our HTTP/2 server (proto/h2rpc.py).

`internal_server(...)` is a `grpc.aio` server that checks the cluster token (proto/token.py), serves
at most `max_concurrent_rpcs` calls at once (further ones are refused with RESOURCE_EXHAUSTED, not
queued), bounds a message both ways, and does not share its port (SO_REUSEPORT off): a second
server on a taken port must fail, since two brokers would split clients between two stores and
two registries would serve two pictures. `bind(...)` binds it, `bind_socket(...)` a socket for our
server, or raises a ConfigError that names the config table's keys.

A proxy pings each broker's server (ours, common/http2/server.py) every second without traffic, so
that a broker cut off from the network fails the calls in flight to it within seconds instead of
leaving them waiting for their deadlines (issue 43); that server counts no PING sent after a request
against its flood bucket, and one a second without requests stays far within it.
"""

from __future__ import annotations

import socket

import grpc

from common.config import ConfigError
from proto import token


def internal_server(*, max_concurrent_rpcs: int, max_message_bytes: int) -> grpc.aio.Server:
    return grpc.aio.server(
        interceptors=token.server_interceptors(),
        maximum_concurrent_rpcs=max_concurrent_rpcs,
        options=[
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.so_reuseport", 0),
        ],
    )


def host_port(host: str, port: int) -> str:
    """`host:port`, an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


def bind(server: grpc.aio.Server, table: str, host: str, port: int) -> int:
    """Bind `server` to `host:port` (0: a free port); the bound port. ConfigError naming `[table]`
    (host, port) if the address cannot be bound (in use, not a local address)."""
    wanted = host_port(host, port)
    try:
        bound = int(server.add_insecure_port(wanted))
    except RuntimeError as exc:
        raise ConfigError(f"[{table}] cannot listen on {wanted} (host, port): {exc}") from None
    if bound == 0:  # some grpc versions report a failed bind this way instead of raising
        raise ConfigError(f"[{table}] cannot listen on {wanted} (host, port): bind failed")
    return bound


def bind_socket(table: str, host: str, port: int) -> socket.socket:
    """A TCP socket bound to `host:port` (0: a free port), not yet listening, not shared
    (SO_REUSEPORT off; SO_REUSEADDR on, so a restarted server rebinds at once). ConfigError naming
    `[table]` (host, port) if the address cannot be bound."""
    wanted = host_port(host, port)
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise ConfigError(f"[{table}] cannot listen on {wanted} (host, port): {exc}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise ConfigError(f"[{table}] cannot listen on {wanted} (host, port): {exc}") from None
    sock.setblocking(False)
    return sock
