"""Serving the proxy: a grpc.aio server on uvloop in front of a `ProxyApp`.

`serve_proxy` runs until `stop` is set, then stops accepting calls, lets in-flight calls finish
within a short grace period, and returns. Long polls end early on shutdown (their grace is short
on purpose: a draining proxy answers empty receives and the clients move on).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import grpc

from common.errors import Unavailable
from common.logs import kv
from proto.apache.rocketmq.v2 import service_pb2_grpc
from proxy.app import ProxyApp
from proxy.grpc.servicer import MessagingServicer

log = logging.getLogger("sluice.proxy")

SHUTDOWN_GRACE_S = 3.0


def grpc_options(max_message_bytes: int, max_concurrent_rpcs: int) -> list[tuple[str, int]]:
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.so_reuseport", 0),
        # Clients send no keepalive pings and hold idle Telemetry streams open: do not police them.
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.keepalive_permit_without_calls", 1),
    ]


async def serve_proxy(app: ProxyApp, stop: asyncio.Event, *, on_ready: Callable[[str], None] | None = None) -> None:
    cfg = app.config
    server = grpc.aio.server(
        options=grpc_options(cfg.max_message_bytes, cfg.max_concurrent_rpcs),
        maximum_concurrent_rpcs=cfg.max_concurrent_rpcs,
    )
    service_pb2_grpc.add_MessagingServiceServicer_to_server(MessagingServicer(app), server)
    address = f"{cfg.host}:{cfg.port}"
    try:
        server.add_insecure_port(address)
    except RuntimeError as exc:
        raise Unavailable(f"proxy cannot listen on {address}: {exc} (is the port in use?)") from None
    await server.start()
    log.info("proxy listening", extra=kv(address=address, advertise=cfg.advertised_address))
    if on_ready is not None:
        on_ready(address)
    background = asyncio.create_task(app.run(stop), name="proxy-background")
    try:
        await stop.wait()
    finally:
        await server.stop(SHUTDOWN_GRACE_S)
        await background
        log.info("proxy stopped", extra=kv(address=address))
