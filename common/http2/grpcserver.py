"""gRPC over our HTTP/2 server connection (the gRPC "PROTOCOL-HTTP2" wire format).

A `GrpcServer` maps paths (`/package.Service/Method`) to handlers of raw bytes; parsing them is the
caller's (the proxy parses and admits requests itself, proxy/grpc/edge.py). Three kinds:

- unary: `async (request bytes, call) -> response bytes`; the answer leaves as one write
  (headers, the message, trailers), and a handler that raises `GrpcError` ends the call with its
  status in a trailers-only answer;
- server streaming: `(request bytes, call) -> async iterator of response bytes`;
- bidirectional: `(async iterator of request bytes, call) -> async iterator of response bytes`;
  request messages are taken from the stream as the handler reads them, and the client's window is
  given back only then (a client cannot queue more than its window).

Per call: the length-prefixed messages (a compressed one is refused with UNIMPLEMENTED: we
announce `grpc-accept-encoding: identity`), at most `max_message_bytes` (RESOURCE_EXHAUSTED, told
when the 5-byte prefix arrives, before the rest is read), `grpc-timeout` (the handler is cancelled
at the deadline, DEADLINE_EXCEEDED), the client's RST_STREAM (the handler is cancelled), request
metadata (`Call.header`, `Call.invocation_metadata`, `-bin` values base64-decoded) and response
metadata (`Call.initial_metadata`, `GrpcError.trailing`), trailers with `grpc-status`,
`grpc-message` (percent-encoded) and `grpc-status-details-bin` when given. Unknown methods answer
UNIMPLEMENTED, anything but POST 405, a content type other than application/grpc 415, as the gRPC
specification asks. Calls in flight over every connection are bounded by `max_concurrent_calls`
(beyond it RESOURCE_EXHAUSTED).

`shutdown(grace_s)`: GOAWAY on every connection (streams already opened are served, new ones are
refused with REFUSED_STREAM, which clients retry elsewhere), then waits for the calls in flight
that end by themselves (unary and server streaming) for up to `grace_s`; what is left then
(bidirectional streams, which end only with their client) is ended with UNAVAILABLE.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import re
import ssl
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from enum import Enum, IntEnum

from common.http2.frames import ErrorCode
from common.http2.hpackcodec import literal
from common.http2.limits import Http2Limits
from common.http2.request import Request
from common.http2.server import Application, ServerConnection, Stream

log = logging.getLogger("sluice.grpc")

_PREFIX = struct.Struct(">BI")
PREFIX_BYTES = 5
MAX_QUEUED_MESSAGES = 64  # bidirectional: messages taken from the stream, not yet read by the handler


class StatusCode(IntEnum):
    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    RESOURCE_EXHAUSTED = 8
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14


class GrpcError(Exception):
    """Ends a call with `code` and `message` (and `details`, sent as grpc-status-details-bin)."""

    def __init__(self, code: StatusCode, message: str, *, details: bytes = b"",
                 trailing: tuple[tuple[str, str], ...] = ()) -> None:  # fmt: skip
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details
        self.trailing = trailing


class Kind(Enum):
    UNARY = "unary"
    SERVER_STREAMING = "server streaming"
    BIDI = "bidirectional"


UnaryHandler = Callable[[bytes, "Call"], Awaitable[bytes]]
StreamingHandler = Callable[[bytes, "Call"], AsyncIterator[bytes]]
BidiHandler = Callable[[AsyncIterator[bytes], "Call"], AsyncIterator[bytes]]
Handler = UnaryHandler | StreamingHandler | BidiHandler


@dataclass(frozen=True)
class GrpcLimits:
    max_message_bytes: int = 8 * 1024 * 1024
    max_concurrent_calls: int = 10_000


_TIMEOUT = re.compile(r"(\d{1,8})([HMSmun])\Z")
_UNIT_S = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}
_STATUS_200 = b"\x88"  # :status 200, static table index 8
_RESPONSE_HEADERS = (_STATUS_200 + literal("content-type", "application/grpc")
                     + literal("grpc-accept-encoding", "identity"))  # fmt: skip
_OK_TRAILERS = literal("grpc-status", "0")
_UNSAFE = re.compile(r"[^\x20-\x24\x26-\x7e]")


def parse_timeout(value: str) -> float | None:
    """The seconds of a grpc-timeout header (`<up to 8 digits><unit>`), None when malformed."""
    m = _TIMEOUT.match(value)
    return None if m is None else int(m.group(1)) * _UNIT_S[m.group(2)]


def _percent(message: str) -> str:
    """grpc-message's encoding: UTF-8, every byte outside printable ASCII (and '%') as %XX."""
    if not _UNSAFE.search(message):
        return message
    return "".join(chr(b) if 0x20 <= b <= 0x7E and b != 0x25 else f"%{b:02X}" for b in message.encode())


def trailers_block(code: StatusCode, message: str = "", details: bytes = b"",
                   trailing: tuple[tuple[str, str], ...] = ()) -> bytes:  # fmt: skip
    if code == StatusCode.OK and not message and not details and not trailing:
        return _OK_TRAILERS
    block = literal("grpc-status", str(int(code)))
    if message:
        block += literal("grpc-message", _percent(message))
    if details:
        block += literal("grpc-status-details-bin", base64.b64encode(details).rstrip(b"="))
    for name, value in trailing:
        block += literal(name, value)
    return block


def _metadata_block(pairs: list[tuple[str, str | bytes]]) -> bytes:
    out = b""
    for name, value in pairs:
        if name.endswith("-bin"):
            raw = value if isinstance(value, bytes) else value.encode()
            out += literal(name, base64.b64encode(raw).rstrip(b"="))
        else:
            out += literal(name, value)
    return out


class Call:
    """One gRPC call on one stream: its request metadata, deadline and peer, for the handler."""

    __slots__ = ("_buf", "_conn", "_deadline", "_expired", "_headers_sent", "_queue", "_server",
                 "_stream", "_task", "_timer", "headers", "initial_metadata", "method", "peer_address")  # fmt: skip

    def __init__(self, server: GrpcServer, conn: ServerConnection, stream: Stream, method: _Method,
                 headers: dict[str, str]) -> None:  # fmt: skip
        self._server = server
        self._conn = conn
        self._stream = stream
        self.method = method
        self.headers = headers  # request headers (the last of a repeated name wins), -bin values as sent
        self.peer_address = conn.peer
        self.initial_metadata: list[tuple[str, str | bytes]] = []  # sent with the first response message
        self._buf = bytearray()
        self._deadline: float | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._expired = False
        self._task: asyncio.Task[None] | None = None
        self._headers_sent = False
        # bidirectional: (message, window to give back when the handler takes it)
        self._queue: asyncio.Queue[tuple[bytes, int] | None] | None = None

    # -- what handlers read (grpc.aio's ServicerContext names) --

    def peer(self) -> str:
        return self.peer_address

    def time_remaining(self) -> float | None:
        if self._deadline is None:
            return None
        return max(0.0, self._deadline - self._conn_loop().time())

    def header(self, name: str) -> str:
        return self.headers.get(name, "")

    def invocation_metadata(self) -> list[tuple[str, str | bytes]]:
        """Every custom request header (`-bin` ones decoded), without HTTP/2 and gRPC's own."""
        out: list[tuple[str, str | bytes]] = []
        for name, value in self.headers.items():
            if name in _RESERVED or name.startswith("grpc-"):
                continue
            out.append((name, _unbase64(value) if name.endswith("-bin") else value))
        return out

    def _conn_loop(self) -> asyncio.AbstractEventLoop:
        return self._server.loop

    # -- stream events (common.http2.server.StreamEvents) --

    def on_data(self, data: bytes, end_stream: bool) -> None:
        kind = self.method.kind
        if kind is Kind.BIDI:
            self._take(data, end_stream)
            return
        if self._task is not None:  # a second message or data after the request (unary, server streaming)
            if data:
                self._refuse(StatusCode.INTERNAL, f"{kind.value} call with more than one request message")
            return
        if not self._buf and end_stream and len(data) >= PREFIX_BYTES:  # the whole request in one frame
            compressed, length = _PREFIX.unpack_from(data)
            if length == len(data) - PREFIX_BYTES and not compressed:
                if length > self._server.limits.max_message_bytes:
                    self._too_large(length)
                    return
                self._start(data[PREFIX_BYTES:])
                return
        self._buf += data
        if len(self._buf) >= PREFIX_BYTES and not self._check_prefix():
            return
        if end_stream:
            self._end_of_request()

    def on_reset(self, code: int) -> None:
        self._cancel_timer()
        if self._task is not None:
            self._task.cancel()
        elif self._queue is None:
            self._finish_released()
        if self._queue is not None:
            self._queue.put_nowait(None)

    # -- requests --

    def _check_prefix(self) -> bool:
        """The declared length of the message at the head of the buffer is acceptable (and the
        window for it granted); False when the call was refused."""
        compressed, length = _PREFIX.unpack_from(self._buf)
        if compressed:
            encoding = self.headers.get("grpc-encoding", "")
            self._refuse(StatusCode.UNIMPLEMENTED, f"compressed messages are not supported (grpc-encoding "
                                                   f"{encoding or 'unset'}); send them uncompressed")  # fmt: skip
            return False
        if length > self._server.limits.max_message_bytes:
            self._too_large(length)
            return False
        need = PREFIX_BYTES + length - len(self._buf) - self._stream.recv_window
        if need > 0 and self._stream.granted == 0 and not self._conn.grant(self._stream, need):
            self._refuse(StatusCode.RESOURCE_EXHAUSTED, "this connection is receiving too many large messages at "
                                                        "once; retry")  # fmt: skip
            return False
        return True

    def _end_of_request(self) -> None:
        buf = self._buf
        if len(buf) < PREFIX_BYTES:
            self._refuse(StatusCode.INTERNAL, f"the {self.method.kind.value} request has no message")
            return
        _, length = _PREFIX.unpack_from(buf)
        if len(buf) != PREFIX_BYTES + length:
            what = "ends inside its message" if len(buf) < PREFIX_BYTES + length else "holds more than one message"
            self._refuse(StatusCode.INTERNAL, f"the request {what}")
            return
        self._conn.return_grant(self._stream)
        self._buf = bytearray()
        self._start(bytes(buf[PREFIX_BYTES:]))

    def _too_large(self, length: int) -> None:
        limit = self._server.limits.max_message_bytes
        self._refuse(StatusCode.RESOURCE_EXHAUSTED, f"a request message of {length} bytes exceeds the limit of "
                                                    f"{limit} bytes")  # fmt: skip

    def _take(self, data: bytes, end_stream: bool) -> None:
        """Bidirectional: queue every complete message for the handler."""
        assert self._queue is not None
        if data:
            self._buf += data
        while len(self._buf) >= PREFIX_BYTES:
            if not self._check_prefix():
                return
            _, length = _PREFIX.unpack_from(self._buf)
            end = PREFIX_BYTES + length
            if len(self._buf) < end:
                break
            message = bytes(self._buf[PREFIX_BYTES:end])
            del self._buf[:end]
            refill = max(0, end - self._stream.granted)  # the granted part is not given back
            self._conn.return_grant(self._stream)
            if self._queue.qsize() >= MAX_QUEUED_MESSAGES:
                self._refuse(StatusCode.RESOURCE_EXHAUSTED, "too many request messages not yet read")
                return
            self._queue.put_nowait((message, refill))
        if end_stream:
            if self._buf:
                self._refuse(StatusCode.INTERNAL, "the request stream ends inside a message")
                return
            self._queue.put_nowait(None)

    async def _requests(self) -> AsyncIterator[bytes]:
        assert self._queue is not None
        while (item := await self._queue.get()) is not None:
            message, refill = item
            self._conn.refill(self._stream, refill)
            yield message

    # -- running --

    def _begin(self, timeout: str) -> bool:
        """Arm the deadline; False when the call was refused (a malformed timeout)."""
        if timeout:
            seconds = parse_timeout(timeout)
            if seconds is None:
                self._refuse(StatusCode.INTERNAL, f"malformed grpc-timeout {timeout!r}")
                return False
            loop = self._server.loop
            self._deadline = loop.time() + seconds
            self._timer = loop.call_at(self._deadline, self._expire)
        if self.method.kind is Kind.BIDI:
            self._queue = asyncio.Queue()  # bounded by MAX_QUEUED_MESSAGES in _take
            self._task = self._server.loop.create_task(self._run_bidi())
        return True

    def _start(self, request: bytes) -> None:
        kind = self.method.kind
        run = self._run_unary(request) if kind is Kind.UNARY else self._run_streaming(request)
        self._task = self._server.loop.create_task(run)

    def _expire(self) -> None:
        self._timer = None
        self._expired = True
        if self._task is not None:
            self._task.cancel()
        else:
            self._refuse(StatusCode.DEADLINE_EXCEEDED, "the deadline passed before the request arrived")

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def _run_unary(self, request: bytes) -> None:
        handler: UnaryHandler = self.method.handler  # type: ignore[assignment]
        try:
            reply = await handler(request, self)
        except asyncio.CancelledError:
            self._cancelled()
        except GrpcError as exc:
            self._end(exc.code, exc.message, exc.details, exc.trailing)
        except Exception:
            log.exception("unexpected error in %s", self.method.path)
            self._end(StatusCode.UNKNOWN, "the server failed to answer; see its log")
        else:
            self._cancel_timer()
            if self.initial_metadata:
                self._send(reply)
                self._end(StatusCode.OK)
            else:
                self._conn.send_response(self._stream, _RESPONSE_HEADERS, _PREFIX.pack(0, len(reply)) + reply,
                                         _OK_TRAILERS)  # fmt: skip
                self._finish_released()

    async def _run_streaming(self, request: bytes) -> None:
        handler: StreamingHandler = self.method.handler  # type: ignore[assignment]
        await self._stream_out(handler(request, self))

    async def _run_bidi(self) -> None:
        handler: BidiHandler = self.method.handler  # type: ignore[assignment]
        await self._stream_out(handler(self._requests(), self))

    async def _stream_out(self, replies: AsyncIterator[bytes]) -> None:
        try:
            async for reply in replies:
                self._send(reply)
                if self._stream.pending:
                    await self._conn.writable(self._stream)
        except asyncio.CancelledError:
            self._cancelled()
        except GrpcError as exc:
            self._end(exc.code, exc.message, exc.details, exc.trailing)
        except Exception:
            log.exception("unexpected error in %s", self.method.path)
            self._end(StatusCode.UNKNOWN, "the server failed to answer; see its log")
        else:
            self._end(StatusCode.OK)
        finally:
            aclose = getattr(replies, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()

    def _send(self, message: bytes) -> None:
        if not self._headers_sent:
            self._headers_sent = True
            block = _RESPONSE_HEADERS
            if self.initial_metadata:
                block += _metadata_block(self.initial_metadata)
            self._conn.send_headers(self._stream, block)
        self._conn.send_data(self._stream, _PREFIX.pack(0, len(message)) + message)

    def _cancelled(self) -> None:
        """The handler was cancelled: by the deadline, by shutdown, or because the stream is gone."""
        if self._expired:
            self._end(StatusCode.DEADLINE_EXCEEDED, "deadline exceeded")
        elif self._server.stopping:
            self._end(StatusCode.UNAVAILABLE, "the server is shutting down; retry")
        else:
            self._end(StatusCode.CANCELLED, "cancelled")

    def _end(self, code: StatusCode, message: str = "", details: bytes = b"",
             trailing: tuple[tuple[str, str], ...] = ()) -> None:  # fmt: skip
        """Trailers (after headers, or a trailers-only answer), then release the stream."""
        self._cancel_timer()
        block = trailers_block(code, message, details, trailing)
        if not self._headers_sent:
            self._headers_sent = True
            block = _RESPONSE_HEADERS + block
        self._conn.send_headers(self._stream, block, end_stream=True)
        self._finish_released()

    def _refuse(self, code: StatusCode, message: str) -> None:
        """End the call before (or instead of) its handler."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
        self._task = None
        self._end(code, message)

    def _finish_released(self) -> None:
        self._cancel_timer()
        self._server.call_ended(self)
        self._conn.release(self._stream)


_RESERVED = frozenset(("te", "content-type", "user-agent", "content-length"))


def _unbase64(value: str) -> bytes:
    try:
        return base64.b64decode(value + "=" * (-len(value) % 4))
    except ValueError:
        return b""


@dataclass(frozen=True)
class _Method:
    path: str
    kind: Kind
    handler: Handler


class GrpcServer(Application):
    def __init__(self, limits: GrpcLimits, http2: Http2Limits) -> None:
        self.limits = limits
        self.http2 = http2
        self.loop = asyncio.get_running_loop()
        self._methods: dict[str, _Method] = {}
        self._connections: set[ServerConnection] = set()
        self._calls: set[Call] = set()
        self.stopping = False
        self._idle = asyncio.Event()
        self._idle.set()
        self._servers: list[asyncio.Server] = []

    def add(self, path: str, kind: Kind, handler: Handler) -> None:
        self._methods[path] = _Method(path, kind, handler)

    # -- serving --

    async def listen(self, host: str, port: int, *, ssl_context: ssl.SSLContext | None = None,
                     reuse_port: bool = False) -> int:  # fmt: skip
        """Listen on host:port (0: a free port); the port bound. OSError when it cannot."""
        server = await self.loop.create_server(self._connection, host, port, ssl=ssl_context,
                                               reuse_port=reuse_port or None, backlog=1024)  # fmt: skip
        self._servers.append(server)
        return int(server.sockets[0].getsockname()[1])

    def _connection(self) -> ServerConnection:
        conn = ServerConnection(self, self.http2, self._connection_closed)
        self._connections.add(conn)
        return conn

    def _connection_closed(self, conn: ServerConnection) -> None:
        self._connections.discard(conn)

    @property
    def connections(self) -> int:
        return len(self._connections)

    async def shutdown(self, grace_s: float) -> None:
        """Stop accepting, GOAWAY every connection, let finite calls end within `grace_s`, end the rest."""
        self.stopping = True
        for server in self._servers:
            server.close()
        for conn in list(self._connections):
            conn.shutdown()
        finite = [c for c in self._calls if c.method.kind is not Kind.BIDI]
        if finite:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(grace_s):
                    while any(c in self._calls for c in finite):
                        self._idle.clear()
                        await self._idle.wait()
        for call in list(self._calls):
            call._refuse(StatusCode.UNAVAILABLE, "the server is shutting down; retry")
        await asyncio.sleep(0)  # the trailers are written at the end of this iteration
        for conn in list(self._connections):
            conn.abort()
        for server in self._servers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), grace_s)

    # -- common.http2.server.Application --

    def open_stream(self, conn: ServerConnection, stream: Stream, request: Request, end_stream: bool) -> Call:
        headers = dict(request.fields)
        method = self._methods.get(request.path)
        call = Call(self, conn, stream, method or _UNKNOWN, headers)
        self._calls.add(call)
        if request.method != "POST":
            self._http_error(call, literal(":status", "405"))
        elif not headers.get("content-type", "").startswith("application/grpc"):
            self._http_error(call, literal(":status", "415"))
        elif method is None:
            call._refuse(StatusCode.UNIMPLEMENTED, f"unknown method {request.path}")
        elif len(self._calls) > self.limits.max_concurrent_calls:
            call._refuse(StatusCode.RESOURCE_EXHAUSTED, f"the server is answering {self.limits.max_concurrent_calls} "
                                                        "calls; retry")  # fmt: skip
        elif call._begin(headers.get("grpc-timeout", "")) and end_stream:
            call.on_data(b"", True)  # no request message at all
        return call

    def refuse_stream(self, conn: ServerConnection, stream: Stream, reason: str) -> None:
        call = Call(self, conn, stream, _UNKNOWN, {})
        self._calls.add(call)
        call._refuse(StatusCode.RESOURCE_EXHAUSTED, reason)

    def _http_error(self, call: Call, status: bytes) -> None:
        call._headers_sent = True
        call._conn.send_headers(call._stream, status, end_stream=True)
        call._finish_released()

    def call_ended(self, call: Call) -> None:
        self._calls.discard(call)
        if self.stopping:
            self._idle.set()


async def _unknown(request: bytes, call: Call) -> bytes:
    raise GrpcError(StatusCode.UNIMPLEMENTED, "unknown method")


_UNKNOWN = _Method("", Kind.UNARY, _unknown)


def server_ssl_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    """TLS 1.2 or later with ALPN `h2` (gRPC clients offer it and require it), from PEM files."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_alpn_protocols(["h2"])
    ctx.load_cert_chain(cert_file, key_file)
    return ctx


__all__ = ["Call", "ErrorCode", "GrpcError", "GrpcLimits", "GrpcServer", "Kind", "StatusCode", "parse_timeout"]
