"""The client side of gRPC over HTTP/2, ours: what `RemoteBroker` (broker/client/remote.py) calls the
brokers' internal service with, and what the load generator (bench/client.py) calls the proxies with.

Why ours: a grpc.aio call costs each side ~150-260 µs of CPU and each stream frame ~23 µs more
(docs/broker-service.md), more than storing a message. Here, as in our server (server.py), a
connection is an `asyncio.Protocol`: everything written while the event loop runs one iteration
leaves in one `transport.write` (the calls several requests make to one broker travel together),
one `data_received` parses every frame that arrived, and a call completes once, when its stream
ends, with no task of its own.

`Channel(target)` is what callers hold: one connection to one server, opened on the first call.
- Calls: unary (`unary`) and server streaming (`server_stream`: the messages returned together
  when the stream ends); requests are written whole. Metadata goes out as headers (`Method` holds
  the ones every call of a method carries, encoded once); the trailers come back in `RpcError`.
- Deadlines: each call sends `grpc-timeout`, and at its deadline its stream is reset (CANCEL) and
  it fails with DEADLINE_EXCEEDED. A caller that is cancelled resets its stream (CANCEL).
- Flow control both ways: a request is sent within the server's connection and stream windows and
  frame size (what does not fit waits for WINDOW_UPDATE, in order); we announce a stream window
  of `STREAM_WINDOW` and a connection window of `CONNECTION_WINDOW` and give them back as DATA
  arrives. A response larger than `max_message_bytes` resets its stream (RESOURCE_EXHAUSTED).
- SETTINGS: the server's MAX_CONCURRENT_STREAMS is honoured (calls beyond it wait for a stream, in
  order), INITIAL_WINDOW_SIZE and MAX_FRAME_SIZE too; we announce a header table of 0 (the
  server's blocks then carry no decoding state, and a block seen before is not decoded again) and
  no push. PING is answered.
- Failures are `RpcError`s with a gRPC status code. A call the server never saw (its stream was
  refused, was above a GOAWAY's last stream, or found no connection) is `sent=False`, and is tried
  once more on a new connection if its deadline allows, as gRPC's transparent retry does; a call
  the server may have seen is never retried here.
- Reconnecting: a connection that was lost, got GOAWAY or used up its stream ids takes no new
  calls (those in flight finish) and the next call opens a new one. A failed connect puts the
  channel in backoff: calls fail at once with UNAVAILABLE until it has passed (`backoff_initial_s`,
  then x1.6 per failure up to `backoff_max_s`, jittered by a fifth), as a gRPC channel in
  TRANSIENT_FAILURE does.
- Bounds: at most `max_pending_calls` calls at once (RESOURCE_EXHAUSTED beyond), each response at
  most `max_message_bytes`, a header block at most `MAX_HEADER_BLOCK_BYTES`.
- TLS (ALPN `h2`) when given an `ssl.SSLContext`; cleartext HTTP/2 with prior knowledge otherwise.
- Keepalive (`keepalive_s`, `keepalive_timeout_s`; off when None): a connection on which nothing
  arrived for `keepalive_s` is sent a PING, and so is one with calls in flight on which nothing
  arrived for a quarter of it (`BUSY_PING_SHARE`); one on which nothing arrives within
  `keepalive_timeout_s` after a PING is taken as lost: cut, its calls failed with UNAVAILABLE, the
  next call on a new connection. A server whose host dropped off the network answers nothing and
  resets nothing; without pings the calls in flight to it would wait for their deadlines and new
  calls join them. A proxy pings each broker (1 s, 1 s): a cut broker with calls in flight is
  found within ~1.5 s, before the official clients' 3 s send timeout, so their retry goes to another
  broker (issue 43). The timer looks every `TICK_SHARE` of the shorter setting.

It does not do client or bidirectional streaming, or compression.
"""

from __future__ import annotations

import asyncio
import logging
import random
import ssl
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import cast

from common.http2 import frames as f
from common.http2.frames import ConnectionError_, ErrorCode
from common.http2.grpcwire import (
    HTTP_TO_GRPC,
    PREFIX,
    PREFIX_BYTES,
    StatusCode,
    format_timeout,
    percent_decode,
    status_code,
)
from common.http2.hpackcodec import Decoder, HpackError, integer, literal
from common.logs import kv

log = logging.getLogger("sluice.http2.client")
Silent = Callable[[str], None]  # told why a connection was taken as lost for silence

STREAM_WINDOW = 4 * 1024 * 1024  # announced per stream; given back once half is used
CONNECTION_WINDOW = 64 * 1024 * 1024  # announced for the connection; given back once half is used
MAX_FRAME = 64 * 1024  # announced: the most bytes of a partial frame we hold between reads
MAX_HEADER_BLOCK_BYTES = 1024 * 1024
MAX_STREAM_ID = f.MAX_WINDOW  # 2^31-1: past it the connection takes no new calls
DECODED_MAX = 256  # distinct header blocks remembered per connection
DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024
DEFAULT_MAX_PENDING_CALLS = 10_000
DEFAULT_CONNECT_TIMEOUT_S = 20.0
DEFAULT_KEEPALIVE_TIMEOUT_S = 20.0  # gRPC's default
BUSY_PING_SHARE = 0.25  # with calls in flight, a PING after this share of `keepalive_s` of silence
TICK_SHARE = 0.25  # the keepalive timer looks every this share of min(keepalive_s, keepalive_timeout_s)
BACKOFF_MULTIPLIER = 1.6
BACKOFF_JITTER = 0.2
_UNLIMITED = 1 << 31
# What a stream reset by the server means to the call (gRPC's mapping of RST_STREAM codes).
_RESET_STATUS = {ErrorCode.REFUSED_STREAM: StatusCode.UNAVAILABLE, ErrorCode.CANCEL: StatusCode.CANCELLED,
                 ErrorCode.ENHANCE_YOUR_CALM: StatusCode.RESOURCE_EXHAUSTED,
                 ErrorCode.INADEQUATE_SECURITY: StatusCode.PERMISSION_DENIED}  # fmt: skip


class RpcError(Exception):
    """A failed call: its gRPC status code, message and trailers. `sent` is False when the server
    never saw the call (it may be made again without doing anything twice)."""

    def __init__(self, code: StatusCode, message: str, trailers: dict[str, str] | None = None, *,
                 sent: bool = True) -> None:  # fmt: skip
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message
        self.trailers = trailers or {}
        self.sent = sent


@dataclass(frozen=True, slots=True)
class Method:
    """A method's path and the header block every call of it starts with (`Channel.method`)."""

    path: str
    block: bytes


class _Call:
    """One call on one stream (`id` 0 until it has one)."""

    __slots__ = ("block", "body", "data", "done", "ends_stream", "hblock", "headers", "id", "limit", "recv_left",
                 "send_window", "sent", "timer")  # fmt: skip

    def __init__(self, block: bytes, body: bytes, limit: int, done: asyncio.Future[list[bytes]]) -> None:
        self.id = 0
        self.block = block
        self.body: bytes | memoryview = body  # what is still to be sent of the request
        self.sent = False  # the request's last byte was written
        self.limit = limit
        self.done = done
        self.send_window = 0
        self.recv_left = STREAM_WINDOW
        self.data = bytearray()
        self.headers: dict[str, str] | None = None  # the response headers, once received
        self.hblock = bytearray()  # a header block being received
        self.ends_stream = False  # the header block being received ends the stream
        self.timer: asyncio.TimerHandle | None = None


class Connection(asyncio.Protocol):
    """One HTTP/2 connection to a gRPC server; the calls of a `Channel` run on it, one stream each."""

    def __init__(
        self, authority: str, keepalive: tuple[float, float] | None = None, on_silent: Silent | None = None
    ) -> None:
        self.authority = authority
        self._keepalive = keepalive  # (interval, timeout) in seconds
        self._on_silent = on_silent  # told when the keepalive cuts this connection
        self._heard_at = 0.0  # loop time when something last arrived
        self._ping_at: float | None = None  # loop time of our PING that nothing has followed yet
        self._keepalive_timer: asyncio.TimerHandle | None = None
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._streams: dict[int, _Call] = {}
        self._waiting: deque[_Call] = deque()  # calls waiting for a stream (MAX_CONCURRENT_STREAMS)
        self._blocked: dict[int, _Call] = {}  # calls whose request waits for window
        self._next_id = 1
        self._send_window = f.DEFAULT_WINDOW
        self._peer_initial = f.DEFAULT_WINDOW
        self._peer_max_frame = f.DEFAULT_MAX_FRAME
        self._peer_max_streams = _UNLIMITED
        self._consumed = 0  # DATA bytes received and not yet given back to the connection window
        self._decoder = Decoder(table_size=0, max_list_size=MAX_HEADER_BLOCK_BYTES)
        self._decoded: dict[bytes, dict[str, str]] = {}
        self._block_stream = 0  # the stream whose header block continues in CONTINUATION frames
        self.settled: asyncio.Future[None] = self._loop.create_future()  # the server's first SETTINGS
        self.closed: str | None = None  # why this connection takes no new calls
        self._lost = False
        self._out: list[bytes] = []

    # -- asyncio.Protocol --

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's transports are not subclasses
        values = {f.S_HEADER_TABLE_SIZE: 0, f.S_ENABLE_PUSH: 0, f.S_INITIAL_WINDOW_SIZE: STREAM_WINDOW,
                  f.S_MAX_FRAME_SIZE: MAX_FRAME}  # fmt: skip
        preface = f.PREFACE + f.settings(values) + f.window_update(0, CONNECTION_WINDOW - f.DEFAULT_WINDOW)
        self._transport.write(preface)
        if self._keepalive is not None:
            self._heard_at = self._loop.time()
            self._keepalive_timer = self._loop.call_later(self._tick_s(), self._keepalive_tick)

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        if self._keepalive_timer is not None:
            self._keepalive_timer.cancel()
            self._keepalive_timer = None
        self._stop_all(f"the connection was lost{f' ({exc})' if exc else ''}", sent=True)
        if not self.settled.done():
            self.settled.set_exception(RpcError(StatusCode.UNAVAILABLE, self.closed or "lost", sent=False))
            self.settled.exception()  # retrieved: the connecting caller reads `closed`

    def data_received(self, data: bytes) -> None:
        if self._lost:
            return
        self._heard_at = self._loop.time()
        if self._buffer:  # the start of a frame that did not fit in the last read (at most MAX_FRAME)
            data = bytes(self._buffer) + data
            self._buffer.clear()
        try:
            self._frames(data)
        except ConnectionError_ as exc:
            self._fail(exc.code, str(exc))

    # -- calls --

    @property
    def busy(self) -> int:
        return len(self._streams) + len(self._waiting)

    def start(self, block: bytes, body: bytes, deadline: float, limit: int) -> _Call:
        """A call, started now (or when a stream is free); its result is `call.done`."""
        call = _Call(block, body, limit, self._loop.create_future())
        call.timer = self._loop.call_at(deadline, self._expire, call)
        if self.closed is not None:  # (the channel checks first; a connection lost in between)
            self._settle(call, RpcError(StatusCode.UNAVAILABLE, self.closed, sent=False))
        elif len(self._streams) >= self._peer_max_streams:
            self._waiting.append(call)
        else:
            self._open(call)
        return call

    def cancel(self, call: _Call) -> None:
        """The caller gave up: reset its stream, forget it."""
        if call.id and self._streams.get(call.id) is call:
            self._write(f.rst_stream(call.id, ErrorCode.CANCEL))
            self._finish(call)
        elif not call.id and call in self._waiting:
            self._waiting.remove(call)
        if call.timer is not None:
            call.timer.cancel()

    def close(self, why: str) -> None:
        """Fail every call and close (GOAWAY NO_ERROR first)."""
        if self._transport is not None and not self._lost:
            self._write(f.goaway(0, ErrorCode.NO_ERROR, why[:200]))
            self._flush()
            self._transport.close()
        self._stop_all(why, sent=True)

    def alpn(self) -> str | None:
        """The protocol TLS agreed on (None in cleartext)."""
        ssl_object = self._transport.get_extra_info("ssl_object") if self._transport is not None else None
        return ssl_object.selected_alpn_protocol() if ssl_object is not None else None

    def _open(self, call: _Call) -> None:
        sid = call.id = self._next_id
        self._next_id += 2
        if self._next_id > MAX_STREAM_ID:  # this is its last stream: later calls go to a new connection
            self.closed = "the connection used up its stream ids"
        self._streams[sid] = call
        call.send_window = self._peer_initial
        self._write_block(sid, call.block)
        call.block = b""
        self._send_body(call)

    def _write_block(self, sid: int, block: bytes) -> None:
        size = self._peer_max_frame
        if len(block) <= size:
            self._write(f.frame(f.HEADERS, f.END_HEADERS, sid, block))
            return
        parts = [block[i : i + size] for i in range(0, len(block), size)]
        self._write(f.frame(f.HEADERS, 0, sid, parts[0]))
        for i, part in enumerate(parts[1:], 2):
            self._write(f.frame(f.CONTINUATION, f.END_HEADERS if i == len(parts) else 0, sid, part))

    def _send_body(self, call: _Call) -> None:
        """Write what the windows allow of the call's request; the rest waits for WINDOW_UPDATE."""
        body, sid = call.body, call.id
        while True:
            n = len(body)
            room = min(self._send_window, call.send_window, self._peer_max_frame)
            if n <= room:
                self._write(f.header(f.DATA, f.END_STREAM, sid, n))
                self._write(body if isinstance(body, bytes) else bytes(body))
                self._send_window -= n
                call.send_window -= n
                call.body = b""
                call.sent = True
                self._blocked.pop(sid, None)
                return
            if room <= 0:
                call.body = body
                self._blocked[sid] = call
                return
            view = memoryview(body)
            self._write(f.header(f.DATA, 0, sid, room))
            self._write(bytes(view[:room]))
            self._send_window -= room
            call.send_window -= room
            body = view[room:]

    def _drain_blocked(self) -> None:
        for call in list(self._blocked.values()):
            if self._send_window <= 0:
                break
            self._send_body(call)

    def _expire(self, call: _Call) -> None:
        call.timer = None
        if call.done.done():
            return
        if call.id and self._streams.get(call.id) is call:
            self._write(f.rst_stream(call.id, ErrorCode.CANCEL))
            self._finish(call)
        elif call in self._waiting:
            self._waiting.remove(call)
        self._settle(call, RpcError(StatusCode.DEADLINE_EXCEEDED, "deadline exceeded"))

    def _finish(self, call: _Call) -> None:
        """The stream is over (ended, reset or given up): free it, start a waiting call."""
        self._streams.pop(call.id, None)
        self._blocked.pop(call.id, None)
        if call.timer is not None:
            call.timer.cancel()
            call.timer = None
        self._open_waiting()
        self._close_if_idle()

    def _open_waiting(self) -> None:
        """Give waiting calls the streams the server allows now."""
        while self._waiting and len(self._streams) < self._peer_max_streams and self.closed is None:
            self._open(self._waiting.popleft())

    def _close_if_idle(self) -> None:
        """A connection that takes no new calls closes once its last stream is over."""
        if self.closed is not None and not self._streams and self._transport is not None and not self._lost:
            self._flush()
            self._transport.close()

    def _settle(self, call: _Call, outcome: list[bytes] | BaseException) -> None:
        if call.timer is not None:
            call.timer.cancel()
            call.timer = None
        if not call.done.done():
            if isinstance(outcome, BaseException):
                call.done.set_exception(outcome)
            else:
                call.done.set_result(outcome)

    # -- reading --

    def _frames(self, data: bytes) -> None:
        pos, end = 0, len(data)
        unpack = f.HEAD.unpack_from
        streams = self._streams
        while end - pos >= f.FRAME_HEADER_BYTES:
            word = unpack(data, pos)[0]
            length = word >> 8
            if length > MAX_FRAME:
                raise ConnectionError_(ErrorCode.FRAME_SIZE_ERROR, f"a frame of {length} bytes exceeds the "
                                                                   f"{MAX_FRAME} announced")  # fmt: skip
            start = pos + f.FRAME_HEADER_BYTES
            if end - start < length:
                break
            kind, flags = word & 0xFF, data[pos + 4]
            sid = unpack(data, pos + 5)[0] & f.STREAM_MASK
            pos = start + length
            if self._block_stream and kind != f.CONTINUATION:
                raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "a header block was interrupted by another frame")
            if kind == f.DATA and not flags & (f.PADDED | f.END_STREAM):  # the common frame, inline
                self._consume(length)
                call = streams.get(sid)
                if call is not None:
                    self._take(call, data[start:pos])
            elif kind == f.DATA:
                self._data(flags, sid, data[start:pos])
            elif kind == f.HEADERS or kind == f.CONTINUATION:
                self._headers(kind, flags, sid, data[start:pos])
            else:
                self._control(kind, flags, sid, data[start:pos])
            if self._lost:
                return
        if pos < end:
            self._buffer += data[pos:]

    def _consume(self, n: int) -> None:
        """`n` DATA bytes arrived: give the connection window back once half of it is used."""
        self._consumed += n
        if self._consumed >= CONNECTION_WINDOW // 2:
            self._write(f.window_update(0, self._consumed))
            self._consumed = 0

    def _take(self, call: _Call, payload: bytes) -> None:
        call.data += payload
        if len(call.data) > call.limit + PREFIX_BYTES:
            self._write(f.rst_stream(call.id, ErrorCode.CANCEL))
            self._finish(call)
            self._settle(call, RpcError(StatusCode.RESOURCE_EXHAUSTED, f"a response of more than {call.limit} "
                                                                        "bytes (max_message_bytes)"))  # fmt: skip
            return
        call.recv_left -= len(payload)
        if call.recv_left < STREAM_WINDOW // 2:
            self._write(f.window_update(call.id, STREAM_WINDOW - call.recv_left))
            call.recv_left = STREAM_WINDOW

    def _data(self, flags: int, sid: int, payload: bytes) -> None:
        if sid == 0:
            raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "DATA on stream 0")
        self._consume(len(payload))  # padding included: it counts against the window
        call = self._streams.get(sid)
        if call is None:
            return  # a stream we gave up on
        if flags & f.PADDED:
            if not payload or payload[0] >= len(payload):
                raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "padding as long as the frame")
            payload = payload[1 : len(payload) - payload[0]]
        self._take(call, payload)
        if flags & f.END_STREAM and self._streams.get(sid) is call:  # gRPC ends a stream with trailers
            self._finish(call)
            self._settle(call, RpcError(StatusCode.INTERNAL, "the server ended the stream without trailers"))

    def _headers(self, kind: int, flags: int, sid: int, payload: bytes) -> None:
        if sid == 0:
            raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "HEADERS on stream 0")
        if kind == f.CONTINUATION:
            if sid != self._block_stream:
                raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "CONTINUATION without a header block to continue")
        else:
            start, end = 0, len(payload)
            if flags & f.PADDED:
                if not payload or payload[0] >= end:
                    raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "padding as long as the frame")
                start, end = 1, end - payload[0]
            if flags & f.PRIORITY_FLAG:
                start += 5
            payload = payload[start:end]
            if sid >= self._next_id or sid % 2 == 0:
                raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, f"HEADERS on stream {sid}, which we did not open")
        call = self._streams.get(sid)
        if kind == f.HEADERS and call is not None:
            call.hblock = bytearray()
            call.ends_stream = bool(flags & f.END_STREAM)
        ending = flags & f.END_HEADERS
        self._block_stream = 0 if ending else sid
        if call is None:  # a stream we gave up on: header tables are 0, a skipped block leaves no state
            return
        call.hblock += payload
        if len(call.hblock) > MAX_HEADER_BLOCK_BYTES:
            raise ConnectionError_(ErrorCode.ENHANCE_YOUR_CALM, "a header block over 1 MiB")
        if ending:
            self._header_block(call)

    def _header_block(self, call: _Call) -> None:
        block = bytes(call.hblock)
        call.hblock = bytearray()
        fields = self._decoded.get(block)
        if fields is None:
            try:
                fields = dict(self._decoder.decode(block))
            except HpackError as exc:
                raise ConnectionError_(ErrorCode.COMPRESSION_ERROR, str(exc)) from None
            except Exception as exc:  # a header list over the bound
                raise ConnectionError_(ErrorCode.ENHANCE_YOUR_CALM, str(exc)) from None
            if len(self._decoded) >= DECODED_MAX:
                self._decoded.clear()
            self._decoded[block] = fields
        if call.headers is None:  # the response's headers (or trailers-only)
            call.headers = fields
            status = fields.get(":status", "")
            if status != "200":
                code = HTTP_TO_GRPC.get(int(status), StatusCode.UNKNOWN) if status.isdigit() else StatusCode.INTERNAL
                self._end(call, RpcError(code, f"the server answered HTTP status {status or 'none'}"))
                return
            if not call.ends_stream:
                return
        elif not call.ends_stream:
            self._end(call, RpcError(StatusCode.INTERNAL, "a second header block that does not end the stream"))
            return
        self._end(call, self._outcome(call, fields))

    def _outcome(self, call: _Call, trailers: dict[str, str]) -> list[bytes] | RpcError:
        status = trailers.get("grpc-status")
        if status != "0":
            code = status_code(int(status)) if status is not None and status.isdigit() else StatusCode.UNKNOWN
            message = percent_decode(trailers.get("grpc-message", "")) if status else "a response without grpc-status"
            return RpcError(code, message, trailers)
        messages, data, pos, end = [], call.data, 0, len(call.data)
        unpack = PREFIX.unpack_from
        while end - pos >= PREFIX_BYTES:
            compressed, length = unpack(data, pos)
            if compressed:
                return RpcError(StatusCode.INTERNAL, "a compressed response (none was asked for)")
            pos += PREFIX_BYTES
            messages.append(bytes(data[pos : pos + length]))
            pos += length
        if pos != end:
            return RpcError(StatusCode.INTERNAL, "the response ended inside a message")
        return messages

    def _end(self, call: _Call, outcome: list[bytes] | RpcError) -> None:
        if not call.sent or not call.ends_stream:  # our side of the stream is still open: close it
            self._write(f.rst_stream(call.id, ErrorCode.CANCEL))
        self._finish(call)
        self._settle(call, outcome)

    def _control(self, kind: int, flags: int, sid: int, payload: bytes) -> None:
        if kind == f.SETTINGS:
            if not flags & f.ACK:
                self._settings(payload)
        elif kind == f.WINDOW_UPDATE:
            if len(payload) != 4:
                raise ConnectionError_(ErrorCode.FRAME_SIZE_ERROR, "a WINDOW_UPDATE of other than 4 bytes")
            grant = f.u32(payload) & f.STREAM_MASK
            if sid == 0:
                self._send_window += grant
            elif (call := self._streams.get(sid)) is not None:
                call.send_window += grant
            self._drain_blocked()
        elif kind == f.PING:
            if not flags & f.ACK:
                self._write(f.ping(payload, ack=True))
        elif kind == f.RST_STREAM:
            call = self._streams.get(sid)
            if call is not None and len(payload) == 4:
                code = f.u32(payload)
                status = _RESET_STATUS.get(code, StatusCode.INTERNAL)  # type: ignore[call-overload]
                self._finish(call)
                self._settle(call, RpcError(status, f"the server reset the stream ({_code_name(code)})",
                                            sent=code != ErrorCode.REFUSED_STREAM))  # fmt: skip
        elif kind == f.GOAWAY:
            if len(payload) < 8:
                raise ConnectionError_(ErrorCode.FRAME_SIZE_ERROR, "GOAWAY shorter than 8 bytes")
            self._goaway(f.u32(payload) & f.STREAM_MASK, f.u32(payload, 4), payload[8:])
        elif kind == f.PUSH_PROMISE:
            raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "a push (PUSH_PROMISE), which we did not allow")
        # PRIORITY and unknown frame types are ignored (RFC 9113 5.5)

    def _settings(self, payload: bytes) -> None:
        if len(payload) % 6:
            raise ConnectionError_(ErrorCode.FRAME_SIZE_ERROR, "a SETTINGS payload not a multiple of 6 bytes")
        for key, value in f.parse_settings(payload):
            if key == f.S_INITIAL_WINDOW_SIZE:
                if value > f.MAX_WINDOW:
                    raise ConnectionError_(ErrorCode.FLOW_CONTROL_ERROR, "SETTINGS_INITIAL_WINDOW_SIZE over 2^31-1")
                delta, self._peer_initial = value - self._peer_initial, value
                for call in self._streams.values():
                    call.send_window += delta
            elif key == f.S_MAX_FRAME_SIZE:
                if not f.DEFAULT_MAX_FRAME <= value <= f.MAX_FRAME_LIMIT:
                    raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, f"SETTINGS_MAX_FRAME_SIZE {value} out of range")
                self._peer_max_frame = value
            elif key == f.S_MAX_CONCURRENT_STREAMS:
                self._peer_max_streams = value
        self._write(f.frame(f.SETTINGS, f.ACK, 0))
        self._drain_blocked()
        self._open_waiting()
        if not self.settled.done():
            self.settled.set_result(None)

    def _goaway(self, last: int, code: int, debug: bytes) -> None:
        why = f"the server sent GOAWAY ({_code_name(code)}{': ' + debug.decode('utf-8', 'replace') if debug else ''})"
        self.closed = self.closed or why
        for call in [c for s, c in self._streams.items() if s > last]:
            self._finish(call)
            self._settle(call, RpcError(StatusCode.UNAVAILABLE, why, sent=False))
        self._fail_waiting(why)
        self._close_if_idle()

    # -- keepalive --

    def _tick_s(self) -> float:
        assert self._keepalive is not None
        return min(self._keepalive) * TICK_SHARE

    def _keepalive_tick(self) -> None:
        """PING a quiet connection; cut one that answered nothing within `keepalive_timeout_s`."""
        assert self._keepalive is not None
        interval, timeout = self._keepalive
        now = self._loop.time()
        if self._ping_at is not None and self._heard_at >= self._ping_at:
            self._ping_at = None  # the answer (or anything else) came
        if self._ping_at is not None and now - self._ping_at >= timeout:
            self._keepalive_timer = None
            why = f"the server answered no keepalive PING within {timeout:g} s"
            log.info("http2 connection to a server cut", extra=kv(server=self.authority, why=why))
            if self._transport is not None:
                self._transport.abort()  # a graceful close would wait for a peer that reads nothing
            self._stop_all(why, sent=True)
            if self._on_silent is not None:
                self._on_silent(why)
            return
        quiet_s = interval * BUSY_PING_SHARE if self._streams else interval
        if self._ping_at is None and now - self._heard_at >= quiet_s:
            self._ping_at = now
            self._write(f.ping(bytes(f.PING_BYTES), ack=False))
        self._keepalive_timer = self._loop.call_later(self._tick_s(), self._keepalive_tick)

    # -- writing and failing --

    def _write(self, data: bytes) -> None:
        """Queue frames: everything written in one loop iteration leaves in one write."""
        if not self._out:
            self._loop.call_soon(self._flush)
        self._out.append(data)

    def _flush(self) -> None:
        out, self._out = self._out, []
        if self._transport is not None and not self._lost and out and not self._transport.is_closing():
            self._transport.write(b"".join(out) if len(out) > 1 else out[0])

    def _fail(self, code: ErrorCode, why: str) -> None:
        """A connection error of the server's: GOAWAY with `code`, close, fail every call."""
        log.info("http2 connection to a server closed", extra=kv(server=self.authority, code=code.name, why=why))
        self.close(f"protocol error from the server ({code.name}): {why}")

    def _stop_all(self, why: str, *, sent: bool) -> None:
        self.closed = self.closed or why
        for call in list(self._streams.values()):
            self._finish(call)
            self._settle(call, RpcError(StatusCode.UNAVAILABLE, why, sent=sent))
        self._fail_waiting(why)

    def _fail_waiting(self, why: str) -> None:
        """Calls still waiting for a stream never reached the server."""
        while self._waiting:
            self._settle(self._waiting.popleft(), RpcError(StatusCode.UNAVAILABLE, why, sent=False))


def _code_name(code: int) -> str:
    try:
        return ErrorCode(code).name
    except ValueError:
        return f"code {code}"


class Channel:
    """Calls to one gRPC server (`host:port`, `[v6 host]:port`) over one connection at a time."""

    def __init__(
        self,
        target: str,
        *,
        ssl_context: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
        metadata: Sequence[tuple[str, str]] = (),
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        max_pending_calls: int = DEFAULT_MAX_PENDING_CALLS,
        backoff_initial_s: float = 1.0,
        backoff_max_s: float = 5.0,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        keepalive_s: float | None = None,
        keepalive_timeout_s: float = DEFAULT_KEEPALIVE_TIMEOUT_S,
        on_silent: Silent | None = None,
    ) -> None:
        """`on_silent(why)`: called when the keepalive takes a connection of this channel as lost
        (its server answered nothing in time), after its calls failed."""
        host, sep, port = target.rpartition(":")
        if not sep or not port.isdigit() or not host:
            raise ValueError(f"{target!r} is not host:port")
        self.target = target
        self._host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
        self._port = int(port)
        self._ssl = ssl_context
        self._server_hostname = server_hostname
        self._metadata = tuple(metadata)
        self._max_message_bytes = max_message_bytes
        self._max_pending = max_pending_calls
        self._backoff_initial_s = backoff_initial_s
        self._backoff_max_s = backoff_max_s
        self._connect_timeout_s = connect_timeout_s
        self._keepalive = None if keepalive_s is None else (keepalive_s, keepalive_timeout_s)
        self._on_silent = on_silent
        self._backoff_s = backoff_initial_s
        self._retry_at = 0.0  # in backoff until then
        self._last_error = ""
        self._conn: Connection | None = None
        self._old: set[Connection] = set()  # replaced connections finishing their calls
        self._connecting: asyncio.Lock | None = None  # made in the loop of the first call
        self._methods: dict[tuple[str, tuple[tuple[str, str], ...]], Method] = {}
        self._pending = 0
        self._closed = False

    def method(self, path: str, metadata: Sequence[tuple[str, str]] = ()) -> Method:
        """`path` with the headers every call of it carries (the channel's metadata, then
        `metadata`), encoded once."""
        key = (path, tuple(metadata))
        found = self._methods.get(key)
        if found is None:
            block = bytearray(b"\x83\x87" if self._ssl is not None else b"\x83\x86")  # :method POST, :scheme
            block += b"\x04" + integer(len(path.encode()), 7) + path.encode()  # :path, literal value
            block += b"\x01" + integer(len(self.target), 7) + self.target.encode()  # :authority
            block += literal("content-type", "application/grpc") + literal("te", "trailers")
            block += literal("user-agent", "sluice-http2")
            for name, value in (*self._metadata, *metadata):
                block += literal(name, value)
            if len(self._methods) >= DECODED_MAX:
                self._methods.clear()
            found = self._methods[key] = Method(path, bytes(block))
        return found

    async def unary(self, method: Method | str, request: bytes, *, timeout_s: float,
                    metadata: Sequence[tuple[str, str]] = ()) -> bytes:  # fmt: skip
        messages = await self.server_stream(method, request, timeout_s=timeout_s, metadata=metadata)
        if len(messages) != 1:
            raise RpcError(StatusCode.INTERNAL, f"a unary call answered {len(messages)} messages")
        return messages[0]

    async def server_stream(self, method: Method | str, request: bytes, *, timeout_s: float,
                            metadata: Sequence[tuple[str, str]] = ()) -> list[bytes]:  # fmt: skip
        """The call's response messages, when its stream has ended."""
        if self._closed:
            raise RpcError(StatusCode.UNAVAILABLE, f"{self.target}: the channel is closed", sent=False)
        if self._pending >= self._max_pending:
            raise RpcError(StatusCode.RESOURCE_EXHAUSTED, f"{self.target}: {self._pending} calls are already waiting "
                                                          "(max_pending_calls)", sent=False)  # fmt: skip
        if isinstance(method, str):
            method = self.method(method)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        body = PREFIX.pack(0, len(request)) + request
        extra = b"".join([literal(n, v) for n, v in metadata]) if metadata else b""
        self._pending += 1
        try:
            retried = False
            while True:
                conn = self._conn
                if conn is None or conn.closed is not None:
                    conn = await self._connect(deadline)
                left = deadline - loop.time()
                block = method.block + literal("grpc-timeout", format_timeout(left)) + extra
                call = conn.start(block, body, deadline, self._max_message_bytes)
                try:
                    return await call.done
                except RpcError as exc:
                    if exc.sent or retried or loop.time() >= deadline:
                        raise
                    retried = True  # the server never saw it: once more, on a new connection
                except asyncio.CancelledError:
                    conn.cancel(call)
                    raise
        finally:
            self._pending -= 1

    async def ready(self, timeout_s: float) -> None:
        """Connect now if not connected (RpcError UNAVAILABLE when that fails)."""
        if self._conn is None or self._conn.closed is not None:
            await self._connect(asyncio.get_running_loop().time() + timeout_s)

    async def close(self) -> None:
        """Fail the calls in flight (UNAVAILABLE) and close; later calls fail too."""
        self._closed = True
        for conn in [*self._old, *([self._conn] if self._conn is not None else [])]:
            conn.close(f"{self.target}: the channel is closed")
        self._conn = None
        self._old.clear()

    async def _connect(self, deadline: float) -> Connection:
        loop = asyncio.get_running_loop()
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        try:
            async with asyncio.timeout_at(deadline):
                async with self._connecting:
                    return await self._connect_locked(loop)
        except TimeoutError:
            raise RpcError(StatusCode.DEADLINE_EXCEEDED, f"{self.target}: no connection before the deadline",
                           sent=False) from None  # fmt: skip

    async def _connect_locked(self, loop: asyncio.AbstractEventLoop) -> Connection:
        conn = self._conn
        if conn is not None and conn.closed is None:
            return conn  # another call connected meanwhile
        if self._closed:
            raise RpcError(StatusCode.UNAVAILABLE, f"{self.target}: the channel is closed", sent=False)
        now = loop.time()
        if now < self._retry_at:
            raise RpcError(StatusCode.UNAVAILABLE, f"{self.target}: {self._last_error} (next attempt in "
                                                   f"{self._retry_at - now:.1f} s)", sent=False)  # fmt: skip
        if conn is not None and conn.busy:
            self._old.add(conn)  # it closes itself when its last call ends
        self._old = {c for c in self._old if c.busy}
        self._conn = None
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                _, conn = await loop.create_connection(
                    lambda: Connection(self.target, self._keepalive, self._silent), self._host, self._port,
                    ssl=self._ssl,
                    server_hostname=self._server_hostname if self._ssl is not None else None,
                )  # fmt: skip
                self._check_alpn(conn)
                await conn.settled
        except (OSError, TimeoutError, RpcError, ssl.SSLError) as exc:
            why = f"cannot connect ({type(exc).__name__}: {exc})" if str(exc) else "cannot connect"
            self._back_off(loop.time(), why)
            raise RpcError(StatusCode.UNAVAILABLE, f"{self.target}: {self._last_error}", sent=False) from None
        self._backoff_s = self._backoff_initial_s
        self._conn = conn
        return conn

    def _silent(self, why: str) -> None:
        """The keepalive took a connection as lost: back off as after a failed connect (a new
        connection to a host that dropped off the network would wait for its connect timeout)."""
        self._back_off(asyncio.get_running_loop().time(), why)
        if self._on_silent is not None:
            self._on_silent(why)

    def _back_off(self, now: float, error: str) -> None:
        self._last_error = error
        self._retry_at = now + self._backoff_s * random.uniform(1 - BACKOFF_JITTER, 1 + BACKOFF_JITTER)
        self._backoff_s = min(self._backoff_s * BACKOFF_MULTIPLIER, self._backoff_max_s)

    def _check_alpn(self, conn: Connection) -> None:
        if self._ssl is None:
            return
        chosen = conn.alpn()
        if chosen != "h2":
            conn.close("the server did not agree to HTTP/2 (ALPN h2)")
            raise RpcError(StatusCode.UNAVAILABLE, f"{self.target}: the server did not choose ALPN h2 ({chosen})",
                           sent=False)  # fmt: skip


def client_ssl_context(ca_file: str | None = None) -> ssl.SSLContext:
    """TLS 1.2 or later offering ALPN `h2`, verifying the server against `ca_file` (PEM) or the
    system's roots."""
    ctx = ssl.create_default_context(cafile=ca_file)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_alpn_protocols(["h2"])
    return ctx
