"""The bottom of the proxy's gRPC edge: MessagingService registered on our HTTP/2 gRPC server
(common/http2/grpcserver.py) with raw bytes in, so that what arrives is admitted by size and parsed
here, under our control, before any servicer method.

A parser below us would answer bytes that are not a valid protobuf with a gRPC error and, as
grpc.aio's did, an ERROR line with a traceback, before authentication or any limit has run — a log
flood any unauthenticated client can cause. Here:

1. **Size admission.** Every unary and server-streaming call is charged the size of its request
   bytes against the proxy's and its client's in-flight byte limits (`[proxy.flow]
   max_in_flight_bytes`, `max_client_in_flight_bytes`; proxy/core/inflight.py) until it is
   answered; beyond either it gets TOO_MANY_REQUESTS in its response status, unparsed. (The server
   itself refuses a request over `max_message_bytes` with RESOURCE_EXHAUSTED before reading it.)
2. **Parsing.** Undecodable bytes get BAD_REQUEST in the response status (the official clients
   read a Status, not a gRPC error), are counted in `sluice_proxy_undecodable_requests_total`
   and in the RPC counter, and cause at most one WARNING per `WARN_EVERY_S` with the number
   suppressed meanwhile. An undecodable Telemetry command gets a BAD_REQUEST status frame on its
   stream, which stays open.
3. The parsed request goes to the servicer method (`proxy/grpc/servicer.py`); its answer is
   serialized here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any

from google.protobuf.message import DecodeError, Message

from common import metrics
from common.errors import BadRequest, SluiceError
from common.http2.grpcserver import Call, GrpcServer, Kind
from common.logs import kv
from proto.apache.rocketmq.v2 import service_pb2 as spb
from proxy.app import ProxyApp
from proxy.grpc.servicer import MessagingServicer
from proxy.grpc.status import H_CLIENT_ID, code_name, status_of

log = logging.getLogger("sluice.proxy.edge")

SERVICE = "apache.rocketmq.v2.MessagingService"
WARN_EVERY_S = 10.0


class _Throttled:
    """One WARNING per `every_s` at most, telling how many were suppressed since the last one."""

    def __init__(self, every_s: float) -> None:
        self._every_s = every_s
        self._last = -every_s
        self._suppressed = 0

    def warn(self, message: str, **fields: object) -> None:
        now = time.monotonic()
        if now - self._last < self._every_s:
            self._suppressed += 1
            return
        self._last = now
        log.warning(message, extra=kv(**fields, suppressed=self._suppressed))
        self._suppressed = 0


class Edge:
    """Registers MessagingService, over a servicer, on a gRPC server."""

    def __init__(self, app: ProxyApp, servicer: MessagingServicer) -> None:
        self.app = app
        self.servicer = servicer
        self._warn = _Throttled(WARN_EVERY_S)

    def register(self, server: GrpcServer) -> None:
        for method in spb.DESCRIPTOR.services_by_name["MessagingService"].methods:
            request_type = getattr(spb, method.input_type.name)
            response_type = getattr(spb, method.output_type.name)
            impl = getattr(self.servicer, method.name)
            path = f"/{SERVICE}/{method.name}"
            if method.client_streaming:
                server.add(path, Kind.BIDI, self._bidi(method.name, request_type, impl))
            elif method.server_streaming:
                server.add(path, Kind.SERVER_STREAMING, self._streaming(method.name, request_type, response_type, impl))
            else:
                server.add(path, Kind.UNARY, self._unary(method.name, request_type, response_type, impl))

    def _refusal(self, rpc: str, raw: bytes, client_id: str) -> SluiceError | None:
        """Why a request must not go on (too long a client id, no room for its bytes), else None.
        When None is returned the request's bytes are charged; the caller releases them."""
        limit = self.app.config.input.max_client_id_bytes
        if len(client_id) > limit:
            return BadRequest(f"the x-mq-client-id header is {len(client_id)} characters long; at most {limit} "
                              "are accepted")  # fmt: skip
        try:
            self.app.in_flight_bytes.acquire(client_id, len(raw))
        except SluiceError as exc:
            return exc
        return None

    def _parse(self, rpc: str, request_type: type[Message], raw: bytes, call: Call) -> Any:
        """The parsed request, or a BadRequest saying it could not be parsed (counted, throttled warning)."""
        try:
            return request_type.FromString(raw)
        except (DecodeError, ValueError, RecursionError) as exc:  # upb: DecodeError; nesting too deep
            metrics.count_undecodable(rpc)
            self._warn.warn("undecodable request", rpc=rpc, bytes=len(raw), peer=call.peer_address,
                            error=str(exc) or type(exc).__name__)  # fmt: skip
            return BadRequest(f"the request is not a valid {request_type.DESCRIPTOR.full_name} "
                              f"({len(raw)} bytes could not be parsed)")  # fmt: skip

    def _unary(
        self, rpc: str, request_type: type[Message], response_type: Callable[..., Any],
        impl: Callable[[Any, Call], Any],
    ) -> Callable[[bytes, Call], Awaitable[bytes]]:  # fmt: skip
        async def unary(raw: bytes, call: Call) -> bytes:
            started = time.perf_counter()
            client_id = call.headers.get(H_CLIENT_ID, "")
            refused = self._refusal(rpc, raw, client_id)
            if refused is not None:
                return _answer(rpc, response_type(status=status_of(refused, rpc)), started).SerializeToString()
            try:
                request = self._parse(rpc, request_type, raw, call)
                if isinstance(request, SluiceError):
                    return _answer(rpc, response_type(status=status_of(request, rpc)), started).SerializeToString()
                response = await impl(request, call)
                return response.SerializeToString()
            finally:
                self.app.in_flight_bytes.release(client_id, len(raw))

        return unary

    def _streaming(
        self, rpc: str, request_type: type[Message], response_type: Callable[..., Any],
        impl: Callable[[Any, Call], AsyncGenerator[Any, None]],
    ) -> Callable[[bytes, Call], AsyncIterator[bytes]]:  # fmt: skip
        async def streaming(raw: bytes, call: Call) -> AsyncIterator[bytes]:
            started = time.perf_counter()
            client_id = call.headers.get(H_CLIENT_ID, "")
            refused = self._refusal(rpc, raw, client_id)
            if refused is not None:
                yield _answer(rpc, response_type(status=status_of(refused, rpc)), started).SerializeToString()
                return
            try:
                request = self._parse(rpc, request_type, raw, call)
                if isinstance(request, SluiceError):
                    yield _answer(rpc, response_type(status=status_of(request, rpc)), started).SerializeToString()
                    return
                frames = impl(request, call)
                try:
                    async for frame in frames:
                        yield frame.SerializeToString()
                finally:
                    await frames.aclose()  # now, not at garbage collection: its own `finally` counts
            finally:
                self.app.in_flight_bytes.release(client_id, len(raw))

        return streaming

    def _bidi(
        self, rpc: str, request_type: type[Message],
        impl: Callable[[AsyncIterator[Any], Call], AsyncGenerator[Any, None]],
    ) -> Callable[[AsyncIterator[bytes], Call], AsyncIterator[bytes]]:  # fmt: skip
        """Telemetry: each command is parsed as it comes; an undecodable one reaches the servicer as
        a BadRequest (answered with a status frame), and the stream goes on."""

        async def bidi(requests: AsyncIterator[bytes], call: Call) -> AsyncIterator[bytes]:
            async def parsed() -> AsyncIterator[Any]:
                async for raw in requests:
                    yield self._parse(rpc, request_type, raw, call)

            replies = impl(parsed(), call)
            try:
                async for reply in replies:
                    yield reply.SerializeToString()
            finally:
                await replies.aclose()

        return bidi


def _answer(rpc: str, response: Any, started: float) -> Any:
    """A response the edge gives itself (the servicer counts the others)."""
    metrics.observe_rpc(rpc, code_name(response.status.code), time.perf_counter() - started)
    return response
