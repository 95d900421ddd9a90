"""The internal gRPC servers' one shape: the broker's, the NameServer's and navigation's.

`internal_server(...)` is a `grpc.aio` server that checks the cluster token (proto/token.py), serves
at most `max_concurrent_rpcs` calls at once (further ones are refused with RESOURCE_EXHAUSTED, not
queued), bounds a message both ways, and does not share its port (SO_REUSEPORT off): a second
server on a taken port must fail, since two brokers would split clients between two stores and
two registries would serve two pictures. `bind(...)` binds it, or raises a ConfigError that names
the config table's keys.

Its clients may ping it as often as they like (`keepalive_options`: a proxy pings each broker every
second, so that a broker cut off from the network fails the calls in flight to it within seconds
instead of leaving them waiting for their deadlines, issue 43): the server never refuses pings.
"""

from __future__ import annotations

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
            # Clients' keepalive pings are welcome at any rate, with or without calls in flight.
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_ping_strikes", 0),
            ("grpc.http2.min_ping_interval_without_data_ms", 0),
        ],
    )


def keepalive_options(interval_s: float, timeout_s: float) -> list[tuple[str, int]]:
    """Channel options of a client that pings its server every `interval_s` and takes the connection
    as lost (failing its calls in flight with UNAVAILABLE) when a ping is not answered in `timeout_s`:
    a peer whose host dropped off the network sends no reset, and without pings calls to it wait for
    their deadlines and new calls queue behind them."""
    return [
        ("grpc.keepalive_time_ms", int(interval_s * 1000)),
        ("grpc.keepalive_timeout_ms", int(timeout_s * 1000)),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
    ]


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
