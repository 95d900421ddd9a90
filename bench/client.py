"""A minimal RocketMQ 5 gRPC client for the load generator, over our HTTP/2 gRPC client
(common/http2/client.py, shared with the proxy's broker client) or grpc.aio.

It sends what the official clients send (their request headers; QueryRoute, SendMessage,
ReceiveMessage and AckMessage requests) and nothing more: no telemetry stream, no heartbeats (the
proxy needs neither to serve data-plane calls). Differences from the official clients, on purpose:

- SendMessage may carry N messages per call (the official clients send exactly one);
- AckMessage carries every entry of a received batch in one call (the official clients ack one
  message per call);
- requests go to the endpoint given on the command line, not to the route's broker endpoints.

Every call has a deadline. A failed call raises `CallError` with a short code name: the
protocol's `Code` name for a non-OK response status (`TOPIC_NOT_FOUND`), or `grpc.<STATUS>` for
a transport failure (`grpc.UNAVAILABLE`).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import socket
import time
import uuid
from collections.abc import Sequence

import grpc
from google.protobuf.duration_pb2 import Duration

from bench.errors import CallError
from common.codes import Code
from common.http2.client import Channel, Method, RpcError
from proto.apache.rocketmq.v2 import definition_pb2 as pb
from proto.apache.rocketmq.v2 import service_pb2 as spb
from proxy.core.auth import sign

Metadata = tuple[tuple[str, str], ...]

SERVICE = "/apache.rocketmq.v2.MessagingService"
SEND_PATH = f"{SERVICE}/SendMessage"
ROUTE_PATH = f"{SERVICE}/QueryRoute"
RECEIVE_PATH = f"{SERVICE}/ReceiveMessage"
ACK_PATH = f"{SERVICE}/AckMessage"
CLIENT_LANGUAGE = "PYTHON"
CLIENT_PROTOCOL = "GRPC_V2"
CLIENT_VERSION = "sluice-bench/0.1"
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", -1),
    ("grpc.max_send_message_length", -1),
    ("grpc.enable_retries", 0),
    # One connection per channel, as the Python client (no sharing between channels to the same target).
    ("grpc.use_local_subchannel_pool", 1),
]
_OK = int(Code.OK)
MAX_MESSAGE_BYTES = 130 * 1024 * 1024  # what the proxy accepts and may answer
# A ReceiveMessageResponse frame holding a message is the tag of `message = 2` (length-delimited)
# and the Message's length and bytes; with the tag of SendMessageRequest's `repeated Message
# messages = 1` instead, the frames of one receive concatenate into one SendMessageRequest that
# protobuf parses in one call (instead of one parse and one wrapper per frame).
_MESSAGE_TAG = b"\x12"
_MESSAGES_TAG = b"\x0a"
_NOT_FOUND = int(Code.MESSAGE_NOT_FOUND)
_instances = itertools.count()


def code_name(code: int) -> str:
    try:
        return Code(code).name
    except ValueError:
        return f"CODE_{code}"


def _client_id() -> str:
    """hostname@pid@index@base36(time_ns), the Python client's format."""
    n, digits = time.time_ns(), ""
    while n:
        n, r = divmod(n, 36)
        digits = "0123456789abcdefghijklmnopqrstuvwxyz"[r] + digits
    return f"{socket.gethostname()}@{os.getpid()}@{next(_instances)}@{digits}"


def _duration(seconds: float) -> Duration:
    d = Duration()
    d.FromNanoseconds(int(seconds * 1e9))
    return d


def signed_headers(access_key: str, secret: str, second: int) -> tuple[tuple[str, str], ...]:
    """The `x-mq-date-time` and `authorization` headers of every request sent during `second`.

    Signed as the official clients do: HMAC-SHA1 of the date-time with the
    secret. The Python client (rocketmq/v5/util/signature.py, `Signature.metadata`) stamps
    `datetime.now().strftime("%Y%m%dT%H%M%SZ")` on every request and signs only that value, so all
    its requests within one second carry byte-for-byte the same two headers; a generator that signs
    once per second and reuses the pair sends exactly what the official client sends, without
    spending its own CPU (shared with the server under test) on an HMAC per request. We stamp UTC,
    as the header's `Z` says; the proxy does not compare it with its clock (docs/security.md).
    """
    date_time = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(second))
    signature = sign(secret, date_time)
    authorization = f"MQv2-HMAC-SHA1 Credential={access_key}, SignedHeaders=x-mq-date-time, Signature={signature}"
    return (("x-mq-date-time", date_time), ("authorization", authorization))


class GrpcAioTransport:
    """Calls on a grpc.aio channel (`--generator grpc`): bytes in, bytes out."""

    name = "grpc.aio"

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self._channel = grpc.aio.insecure_channel(endpoint, options=CHANNEL_OPTIONS)
        self._unary: dict[str, grpc.aio.UnaryUnaryMultiCallable[bytes, bytes]] = {}
        self._stream: dict[str, grpc.aio.UnaryStreamMultiCallable[bytes, bytes]] = {}

    async def wait_ready(self, timeout_s: float) -> None:
        try:
            async with asyncio.timeout(timeout_s):
                await self._channel.channel_ready()
        except TimeoutError:
            raise CallError(
                "grpc.UNAVAILABLE", f"{self.endpoint} did not accept a connection in {timeout_s} s"
            ) from None

    async def unary(self, path: str, request: bytes, metadata: Metadata, timeout_s: float) -> bytes:
        call = self._unary.get(path)
        if call is None:
            call = self._unary[path] = self._channel.unary_unary(path)
        try:
            return await call(request, metadata=metadata, timeout=timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise CallError(f"grpc.{exc.code().name}", exc.details() or "") from None

    async def server_stream(self, path: str, request: bytes, metadata: Metadata, timeout_s: float) -> list[bytes]:
        call = self._stream.get(path)
        if call is None:
            call = self._stream[path] = self._channel.unary_stream(path)
        try:
            return [frame async for frame in call(request, metadata=metadata, timeout=timeout_s)]
        except grpc.aio.AioRpcError as exc:
            raise CallError(f"grpc.{exc.code().name}", exc.details() or "") from None

    async def close(self) -> None:
        await self._channel.close()


class Http2Transport:
    """Calls on our HTTP/2 gRPC client (`--generator http2`, common/http2/client.py): the least CPU
    per call. Why it matters here: on a small machine the generator shares the cores with the server
    it measures, and grpc.aio spends ~70-100 µs of CPU per consumed message (each of a receive's
    stream frames is its own read with its own event-loop wake-up); this parses every frame that
    arrived in one read and completes a call once, when its stream ends. A lost connection (a
    server that restarted, a GOAWAY) is replaced on the next call, as grpc.aio's channel does."""

    name = "http2"

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        # No backoff worth the name: a bench waits for a restarted server by calling again.
        self._channel = Channel(endpoint, max_message_bytes=MAX_MESSAGE_BYTES, backoff_initial_s=0.05,
                                backoff_max_s=0.5)  # fmt: skip
        self._methods: dict[tuple[str, Metadata], Method] = {}

    async def wait_ready(self, timeout_s: float) -> None:
        try:
            await self._channel.ready(timeout_s)
        except RpcError as exc:
            raise CallError(f"grpc.{exc.code.name}", exc.message) from None

    def _method(self, path: str, metadata: Metadata) -> tuple[Method, Metadata]:
        # Every header but the request id and the signature is the same on each call: encoded once.
        fixed = tuple(h for h in metadata if h[0] not in PER_CALL_HEADERS)
        method = self._methods.get((path, fixed))
        if method is None:
            method = self._methods[(path, fixed)] = self._channel.method(path, fixed)
        return method, tuple(h for h in metadata if h[0] in PER_CALL_HEADERS)

    async def unary(self, path: str, request: bytes, metadata: Metadata, timeout_s: float) -> bytes:
        method, per_call = self._method(path, metadata)
        try:
            return await self._channel.unary(method, request, timeout_s=timeout_s, metadata=per_call)
        except RpcError as exc:
            raise CallError(f"grpc.{exc.code.name}", exc.message) from None

    async def server_stream(self, path: str, request: bytes, metadata: Metadata, timeout_s: float) -> list[bytes]:
        method, per_call = self._method(path, metadata)
        try:
            return await self._channel.server_stream(method, request, timeout_s=timeout_s, metadata=per_call)
        except RpcError as exc:
            raise CallError(f"grpc.{exc.code.name}", exc.message) from None

    async def close(self) -> None:
        await self._channel.close()


TRANSPORTS = ("http2", "grpc")
PER_CALL_HEADERS = frozenset({"x-mq-request-id", "x-mq-date-time", "authorization"})


class BenchClient:
    """One connection to one endpoint; safe to share between tasks of one loop.

    `send_path` lets the same client drive the echo server (same request and response types at
    another method path). `transport` is who makes the calls: `http2` (common/http2/client.py, the
    least CPU per call) or `grpc` (grpc.aio).
    """

    def __init__(
        self, endpoint: str, *, namespace: str = "", timeout_s: float = 5.0, send_path: str = SEND_PATH,
        credentials: tuple[str, str] | None = None, transport: str = "http2",
    ) -> None:  # fmt: skip
        self.endpoint = endpoint
        self.namespace = namespace
        self.timeout_s = timeout_s
        self.client_id = _client_id()
        self._credentials = credentials
        self._signed_second = -1  # the second `_signed` was made for
        self._signed: tuple[tuple[str, str], ...] = ()
        self.calls = 0  # SendMessage, ReceiveMessage and AckMessage calls made, warm-up included
        self._send_path = send_path
        self._transport: GrpcAioTransport | Http2Transport = (
            Http2Transport(endpoint) if transport == "http2" else GrpcAioTransport(endpoint)
        )
        headers = [("x-mq-client-id", self.client_id), ("x-mq-language", CLIENT_LANGUAGE),
                   ("x-mq-protocol", CLIENT_PROTOCOL), ("x-mq-client-version", CLIENT_VERSION)]  # fmt: skip
        if namespace:
            headers.append(("x-mq-namespace", namespace))
        self._headers = tuple(headers)

    @property
    def transport(self) -> str:
        return self._transport.name

    def _metadata(self) -> Metadata:
        if self._credentials is None:
            return (*self._headers, ("x-mq-request-id", str(uuid.uuid4())))
        second = int(time.time())
        if second != self._signed_second:
            self._signed_second, self._signed = second, signed_headers(*self._credentials, second)
        return (*self._headers, ("x-mq-request-id", str(uuid.uuid4())), *self._signed)

    def resource(self, name: str) -> pb.Resource:
        return pb.Resource(name=name, resource_namespace=self.namespace)

    async def close(self) -> None:
        await self._transport.close()

    async def wait_ready(self, timeout_s: float) -> None:
        await self._transport.wait_ready(timeout_s)

    async def query_route(self, topic: str) -> list[pb.MessageQueue]:
        host, _, port = self.endpoint.rpartition(":")
        endpoints = pb.Endpoints(scheme=pb.IPv4, addresses=[pb.Address(host=host, port=int(port))])
        req = spb.QueryRouteRequest(topic=self.resource(topic), endpoints=endpoints)
        raw = await self._transport.unary(ROUTE_PATH, req.SerializeToString(), self._metadata(), self.timeout_s)
        resp = spb.QueryRouteResponse.FromString(raw)
        _check(resp.status)
        return list(resp.message_queues)

    async def send(self, request: bytes) -> list[str]:
        """Send pre-serialised SendMessageRequest bytes; returns the codes of the entries that failed."""
        self.calls += 1
        raw = await self._transport.unary(self._send_path, request, self._metadata(), self.timeout_s)
        resp = spb.SendMessageResponse.FromString(raw)
        return _failed(resp)

    async def receive(
        self, group: str, queue: pb.MessageQueue, *, batch: int, invisible_s: float, long_poll_s: float
    ) -> list[pb.Message]:
        """One ReceiveMessage: the messages (empty on MESSAGE_NOT_FOUND), after the stream ended."""
        req = spb.ReceiveMessageRequest(
            group=self.resource(group), message_queue=queue, batch_size=batch,
            filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"),
            invisible_duration=_duration(invisible_s), long_polling_timeout=_duration(long_poll_s),
        )  # fmt: skip
        messages: list[pb.Message] = []
        status: pb.Status | None = None
        self.calls += 1
        frames = await self._transport.server_stream(RECEIVE_PATH, req.SerializeToString(), self._metadata(),
                                                     self.timeout_s + long_poll_s)  # fmt: skip
        wrapped: list[bytes] = []
        for raw in frames:
            if raw[:1] == _MESSAGE_TAG:  # content = message: parsed below, all at once
                wrapped += (_MESSAGES_TAG, raw[1:])
                continue
            frame = spb.ReceiveMessageResponse.FromString(raw)
            if frame.WhichOneof("content") == "status":
                status = frame.status
        if wrapped:
            messages = list(spb.SendMessageRequest.FromString(b"".join(wrapped)).messages)
        if status is not None and status.code not in (_OK, _NOT_FOUND):
            _check(status)
        return messages

    async def ack(self, group: str, topic: str, messages: Sequence[pb.Message]) -> list[str]:
        """Ack every message in one AckMessage; returns the codes of the entries that failed."""
        entries = [spb.AckMessageEntry(message_id=sp.message_id, receipt_handle=sp.receipt_handle)
                   for sp in (m.system_properties for m in messages)]  # fmt: skip
        req = spb.AckMessageRequest(group=self.resource(group), topic=self.resource(topic), entries=entries)
        self.calls += 1
        raw = await self._transport.unary(ACK_PATH, req.SerializeToString(), self._metadata(), self.timeout_s)
        resp = spb.AckMessageResponse.FromString(raw)
        return _failed(resp)


def _failed(resp: spb.SendMessageResponse | spb.AckMessageResponse) -> list[str]:
    """The codes of a send's or an ack's entries that failed; a whole-call failure raises."""
    if resp.status.code == _OK:
        return []
    if not resp.entries:
        _check(resp.status)
    return [code_name(e.status.code) for e in resp.entries if e.status.code != _OK]


def _check(status: pb.Status) -> None:
    if status.code != _OK:
        raise CallError(code_name(status.code), status.message)
