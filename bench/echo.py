"""A bare grpc.aio server that answers SendMessage-shaped calls: the ceiling a proxy can reach.

It serves one unary method, `/sluice.bench.Echo/SendMessage`, whose request and response types
are the protocol's `SendMessageRequest` and `SendMessageResponse`: the request is parsed in full
and the response carries one OK `SendResultEntry` (message id, offset) per message, like the
proxy's. So a call here costs what a SendMessage costs in gRPC, HTTP/2 and protobuf — everything
but the proxy's own work and storage. Same event loop (uvloop) and server options as the proxy.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable
from typing import Any, cast

import grpc

from common.codes import Code
from common.errors import Unavailable
from proto.apache.rocketmq.v2 import definition_pb2 as pb
from proto.apache.rocketmq.v2 import service_pb2 as spb
from proxy.server import SHUTDOWN_GRACE_S, grpc_options

SERVICE_NAME = "sluice.bench.Echo"
ECHO_SEND_PATH = f"/{SERVICE_NAME}/SendMessage"
MAX_MESSAGE_BYTES = 130 * 1024 * 1024
MAX_CONCURRENT_RPCS = 10_000

_OK = pb.Status(code=cast(pb.Code, int(Code.OK)), message="OK")

log = logging.getLogger("sluice.bench.echo")


class EchoServicer:
    def __init__(self) -> None:
        self._offsets = itertools.count()
        self.calls = 0

    async def send_message(self, request: spb.SendMessageRequest, context: grpc.aio.ServicerContext) -> Any:
        self.calls += 1
        entries = [
            spb.SendResultEntry(status=_OK, message_id=m.system_properties.message_id, offset=next(self._offsets))
            for m in request.messages
        ]
        return spb.SendMessageResponse(status=_OK, entries=entries)


async def serve_echo(
    host: str, port: int, stop: asyncio.Event, *, on_ready: Callable[[str], None] | None = None
) -> None:
    """Serve until `stop` is set; `port` 0 picks a free port (reported through `on_ready`)."""
    servicer = EchoServicer()
    server = grpc.aio.server(options=grpc_options(MAX_MESSAGE_BYTES, reuse_port=False),
                             maximum_concurrent_rpcs=MAX_CONCURRENT_RPCS)  # fmt: skip
    handler = grpc.method_handlers_generic_handler(SERVICE_NAME, {
        "SendMessage": grpc.unary_unary_rpc_method_handler(
            servicer.send_message, request_deserializer=spb.SendMessageRequest.FromString,
            response_serializer=spb.SendMessageResponse.SerializeToString),
    })  # fmt: skip
    server.add_generic_rpc_handlers((handler,))
    try:
        bound = server.add_insecure_port(f"{host}:{port}")
    except RuntimeError:
        bound = 0
    if not bound:
        raise Unavailable(f"echo server cannot listen on {host}:{port} (is the port in use?)")
    await server.start()
    address = f"{host}:{bound}"
    if on_ready is not None:
        on_ready(address)
    try:
        await stop.wait()
    finally:
        await server.stop(SHUTDOWN_GRACE_S)
        log.info("echo server stopped after %d calls", servicer.calls)
