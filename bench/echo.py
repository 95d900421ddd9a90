"""An echo server that answers SendMessage-shaped calls: the ceiling a proxy can reach.

It serves one unary method, `/sluice.bench.Echo/SendMessage`, whose request and response types
are the protocol's `SendMessageRequest` and `SendMessageResponse`: the request is parsed in full
and the response carries one OK `SendResultEntry` (message id, offset) per message, like the
proxy's. It runs on the proxy's own HTTP/2 gRPC server (common/http2/grpcserver.py) with the same
event loop (uvloop) and limits, so a call here costs what a SendMessage costs in gRPC, HTTP/2 and
protobuf — everything but the proxy's own work and storage.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable
from typing import cast

from common.codes import Code
from common.errors import Unavailable
from common.http2.grpcserver import Call, GrpcLimits, GrpcServer, Kind
from common.http2.limits import Http2Limits
from proto.apache.rocketmq.v2 import definition_pb2 as pb
from proto.apache.rocketmq.v2 import service_pb2 as spb

SERVICE_NAME = "sluice.bench.Echo"
ECHO_SEND_PATH = f"/{SERVICE_NAME}/SendMessage"
MAX_MESSAGE_BYTES = 130 * 1024 * 1024
MAX_CONCURRENT_RPCS = 10_000
SHUTDOWN_GRACE_S = 3.0

_OK = pb.Status(code=cast(pb.Code, int(Code.OK)), message="OK")

log = logging.getLogger("sluice.bench.echo")


class EchoServicer:
    def __init__(self) -> None:
        self._offsets = itertools.count()
        self.calls = 0

    async def send_message(self, raw: bytes, call: Call) -> bytes:
        self.calls += 1
        request = spb.SendMessageRequest.FromString(raw)
        entries = [
            spb.SendResultEntry(status=_OK, message_id=m.system_properties.message_id, offset=next(self._offsets))
            for m in request.messages
        ]
        return spb.SendMessageResponse(status=_OK, entries=entries).SerializeToString()


async def serve_echo(
    host: str, port: int, stop: asyncio.Event, *, on_ready: Callable[[str], None] | None = None
) -> None:
    """Serve until `stop` is set; `port` 0 picks a free port (reported through `on_ready`)."""
    servicer = EchoServicer()
    server = GrpcServer(GrpcLimits(MAX_MESSAGE_BYTES, MAX_CONCURRENT_RPCS), Http2Limits())
    server.add(ECHO_SEND_PATH, Kind.UNARY, servicer.send_message)
    try:
        bound = await server.listen(host, port)
    except OSError as exc:
        raise Unavailable(f"echo server cannot listen on {host}:{port} ({exc}; is the port in use?)") from None
    address = f"{host}:{bound}"
    if on_ready is not None:
        on_ready(address)
    try:
        await stop.wait()
    finally:
        await server.shutdown(SHUTDOWN_GRACE_S)
        log.info("echo server stopped after %d calls", servicer.calls)
