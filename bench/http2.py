"""A minimal gRPC-over-HTTP/2 client connection for the load generator (`--generator http2`).

Why: on a small machine the generator shares the cores with the server it measures, and grpc.aio
spends ~70-100 µs of CPU per consumed message — each of a receive's 34 stream frames is its own
read operation with its own completion and event-loop wake-up — where the server spends ~90. This
connection is an asyncio Protocol: one `data_received` parses every frame that arrived (often a
whole receive), and a call completes once, when its stream ends. It speaks only what the bench
needs, to a gRPC server on cleartext HTTP/2 (prior knowledge):

- unary and server-streaming calls; requests are written whole (the bench's requests are bytes);
  a response is every gRPC message of the stream, returned when the stream ends;
- flow control: sends respect the server's connection and stream windows (a blocked request waits
  for WINDOW_UPDATE); receives announce a 2 GiB stream window and refill the connection's;
- SETTINGS and PING are acknowledged; RST_STREAM fails its call, GOAWAY (or a lost connection)
  fails every call in flight; a call past its deadline is reset (CANCEL) and fails with
  `grpc.DEADLINE_EXCEEDED`;
- header blocks are decoded with the servers' HPACK decoder (common/http2/hpackcodec.py: the
  trailers' grpc-status / grpc-message); we announce a header table of 0 and send literals only,
  so no dynamic table state is shared, and a block seen before (every OK call's trailers are the
  same bytes) is not decoded again. Frames are written and named by the shared frame codec
  (common/http2/frames.py).

It does not do TLS, compression, or client-side streaming, and does not count its streams against
the server's MAX_CONCURRENT_STREAMS (the bench opens a few per connection; a refused stream fails
its call with `grpc.UNAVAILABLE`). Failures raise `CallError` with the
same code names as the grpc.aio client (`grpc.UNAVAILABLE`, `grpc.DEADLINE_EXCEEDED`, ...).
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Sequence
from typing import cast

import grpc

from bench.errors import CallError
from common.http2.frames import (
    ACK,
    CONTINUATION,
    DATA,
    DEFAULT_MAX_FRAME,
    DEFAULT_WINDOW,
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    HEADERS,
    MAX_FRAME_LIMIT,
    MAX_WINDOW,
    PADDED,
    PING,
    PREFACE,
    PUSH_PROMISE,
    RST_STREAM,
    S_ENABLE_PUSH,
    S_HEADER_TABLE_SIZE,
    S_INITIAL_WINDOW_SIZE,
    S_MAX_FRAME_SIZE,
    SETTINGS,
    WINDOW_UPDATE,
    ErrorCode,
    frame,
)
from common.http2.frames import PRIORITY_FLAG as PRIORITY
from common.http2.hpackcodec import Decoder, integer, literal

REFILL_AT = 1 << 30  # connection receive window: refill after this many bytes were consumed
_PREFIX = struct.Struct(">BI")  # a gRPC message's compressed flag and length
_FRAME = struct.Struct(">I")  # length (24 bits) + type, read as one word with the flags byte apart
_STATUS_NAMES = {s.value[0]: s.name for s in grpc.StatusCode}
CANCEL, REFUSED_STREAM = ErrorCode.CANCEL, ErrorCode.REFUSED_STREAM
DECODED_MAX = 256  # distinct header blocks remembered per connection


def request_headers(authority: str, path: str, timeout_s: float, metadata: Sequence[tuple[str, str]]) -> bytes:
    """The header block of a gRPC request (without the per-call headers the caller appends)."""
    block = bytearray(b"\x83\x86")  # :method POST, :scheme http (static table 3, 6)
    block += b"\x04" + integer(len(path), 7) + path.encode()  # :path (static name 4), literal value
    block += b"\x01" + integer(len(authority), 7) + authority.encode()  # :authority (static name 1)
    block += literal("content-type", "application/grpc") + literal("te", "trailers")
    block += literal("grpc-timeout", f"{max(1, int(timeout_s * 1000))}m")
    for name, value in metadata:
        block += literal(name, value)
    return bytes(block)


class _Stream:
    __slots__ = ("block", "data", "done", "ending", "headers", "send_window")

    def __init__(self, send_window: int, done: asyncio.Future[list[bytes]]) -> None:
        self.send_window = send_window
        self.data = bytearray()
        self.block = bytearray()  # a header block being received (HEADERS + CONTINUATION)
        self.headers: dict[str, str] = {}
        self.ending = False  # the header block being received ends the stream (trailers)
        self.done = done


class Http2Connection(asyncio.Protocol):
    """One HTTP/2 connection to a gRPC server; calls may run concurrently on it (one stream each)."""

    def __init__(self, authority: str) -> None:
        self.authority = authority
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._streams: dict[int, _Stream] = {}
        self._next_stream = 1
        self._send_window = DEFAULT_WINDOW  # the connection's, granted by the server
        self._peer_initial_window = DEFAULT_WINDOW
        self._peer_max_frame = DEFAULT_MAX_FRAME
        self._consumed = 0  # received DATA bytes not yet given back to the connection window
        # We announce a header table of 0: the decoder keeps no state, so a block's headers depend
        # on its bytes alone, and the server's blocks repeat (the same headers, the same trailers).
        self._decoder = Decoder(table_size=0, max_list_size=1 << 20)
        self._decoded: dict[bytes, dict[str, str]] = {}
        self._settled: asyncio.Future[None] = asyncio.get_running_loop().create_future()  # first SETTINGS
        self._closed: str | None = None  # why the connection can no longer be used
        self._window_opened = asyncio.Event()
        self._out: list[bytes] = []  # frames to write at the end of this loop iteration
        self._loop = asyncio.get_running_loop()

    def _write(self, data: bytes) -> None:
        """Queue frames; every call started or answered in one loop iteration shares one write
        (a loopback send is a syscall that wakes the server: the largest cost per call here)."""
        if not self._out:
            self._loop.call_soon(self._flush)
        self._out.append(data)

    def _flush(self) -> None:
        out, self._out = self._out, []
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(b"".join(out))

    # -- asyncio.Protocol --

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's transports are not subclasses
        settings = struct.pack(">HIHIHIHI", S_HEADER_TABLE_SIZE, 0, S_ENABLE_PUSH, 0, S_INITIAL_WINDOW_SIZE,
                               MAX_WINDOW, S_MAX_FRAME_SIZE, MAX_FRAME_LIMIT)  # fmt: skip
        grow = struct.pack(">I", MAX_WINDOW - DEFAULT_WINDOW)
        self._transport.write(PREFACE + frame(SETTINGS, 0, 0, settings) + frame(WINDOW_UPDATE, 0, 0, grow))

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail_all(f"connection lost{f': {exc}' if exc else ''}")

    def data_received(self, data: bytes) -> None:
        if self._buffer:  # the start of a frame that did not fit in the last read
            data = bytes(self._buffer) + data
            self._buffer.clear()
        pos, end = 0, len(data)
        view = memoryview(data)
        streams = self._streams
        unpack = _FRAME.unpack_from
        while end - pos >= 9:
            word = unpack(data, pos)[0]
            length = word >> 8
            start = pos + 9
            if end - start < length:
                break
            pos = start + length
            kind, flags = word & 0xFF, data[start - 5]
            sid = unpack(data, start - 4)[0] & MAX_WINDOW
            if kind == DATA and not flags & (PADDED | END_STREAM):  # the common frame, inline
                self._consumed += length
                st = streams.get(sid)
                if st is not None:
                    st.data += view[start:pos]
                if self._consumed >= REFILL_AT:
                    self._write(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", self._consumed)))
                    self._consumed = 0
                continue
            self._frame(kind, flags, sid, data[start:pos])
        if pos < end:
            self._buffer += view[pos:]

    # -- calls --

    async def ready(self) -> None:
        await self._settled

    @property
    def closed(self) -> str | None:
        return self._closed

    async def call(self, path_headers: bytes, request: bytes, timeout_s: float) -> tuple[list[bytes], dict[str, str]]:
        """One call: write the request, wait for the stream to end; its gRPC messages and trailers.
        Raises CallError for a non-OK grpc-status, a reset stream, a lost connection, a deadline."""
        if self._closed is not None:
            raise CallError("grpc.UNAVAILABLE", self._closed)
        assert self._transport is not None
        sid = self._next_stream
        self._next_stream += 2
        done: asyncio.Future[list[bytes]] = asyncio.get_running_loop().create_future()
        st = self._streams[sid] = _Stream(self._peer_initial_window, done)
        try:
            async with asyncio.timeout(timeout_s):
                self._write(frame(HEADERS, END_HEADERS, sid, path_headers))
                await self._write_data(sid, st, b"\x00" + struct.pack(">I", len(request)) + request)
                messages = await done
        except TimeoutError:
            if self._closed is None and sid in self._streams:
                self._write(frame(RST_STREAM, 0, sid, struct.pack(">I", CANCEL)))
            raise CallError("grpc.DEADLINE_EXCEEDED", f"no answer in {timeout_s:g} s") from None
        finally:
            self._streams.pop(sid, None)
        return messages, st.headers

    async def _write_data(self, sid: int, st: _Stream, body: bytes) -> None:
        assert self._transport is not None
        view, sent = memoryview(body), 0
        while True:
            room = min(self._send_window, st.send_window, self._peer_max_frame, len(body) - sent)
            if room > 0 or len(body) == sent:
                last = sent + room == len(body)
                self._write(frame(DATA, END_STREAM if last else 0, sid, bytes(view[sent : sent + room])))
                self._send_window -= room
                st.send_window -= room
                sent += room
                if last:
                    return
                continue
            if self._closed is not None:
                raise CallError("grpc.UNAVAILABLE", self._closed)
            self._window_opened.clear()
            await self._window_opened.wait()

    def close(self) -> None:
        if self._transport is not None and self._closed is None:
            self._flush()
            self._transport.write(frame(GOAWAY, 0, 0, struct.pack(">II", 0, 0)))
            self._transport.close()
        self._fail_all("closed")

    # -- frames --

    def _frame(self, kind: int, flags: int, sid: int, payload: bytes) -> None:
        if kind == DATA:
            self._data(flags, sid, payload)
        elif kind in (HEADERS, CONTINUATION):
            self._headers(kind, flags, sid, payload)
        elif kind == SETTINGS:
            if not flags & ACK:
                self._settings(payload)
        elif kind == WINDOW_UPDATE:
            grant = struct.unpack(">I", payload)[0] & MAX_WINDOW
            if sid == 0:
                self._send_window += grant
            elif (st := self._streams.get(sid)) is not None:
                st.send_window += grant
            self._window_opened.set()
        elif kind == PING:
            if not flags & ACK:
                self._write(frame(PING, ACK, 0, payload))
        elif kind == RST_STREAM:
            code = struct.unpack(">I", payload)[0]
            name = {CANCEL: "grpc.CANCELLED", REFUSED_STREAM: "grpc.UNAVAILABLE"}.get(code, "grpc.INTERNAL")
            self._fail(sid, name, f"stream reset (code {code})")
        elif kind == GOAWAY:
            last, code = struct.unpack_from(">II", payload)
            self._closed = f"the server sent GOAWAY (code {code}): {payload[8:].decode(errors='replace')}"
            for s in [s for s in self._streams if s > (last & MAX_WINDOW)]:
                self._fail(s, "grpc.UNAVAILABLE", self._closed)
        elif kind == PUSH_PROMISE:  # refused by our SETTINGS: a protocol error
            self._fail_all("the server pushed a stream")
        # PRIORITY and unknown frame types are ignored (RFC 9113 5.5)

    def _data(self, flags: int, sid: int, payload: bytes) -> None:
        size = len(payload)  # padding included: it counts against the window
        self._consumed += size
        if self._consumed >= REFILL_AT:
            self._write(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", self._consumed)))
            self._consumed = 0
        st = self._streams.get(sid)
        if st is None:
            return  # a stream we gave up on (deadline)
        if flags & PADDED:
            payload = payload[1 : size - payload[0]]
        st.data += payload
        if flags & END_STREAM:  # gRPC ends a stream with trailers: this server did not
            self._fail(sid, "grpc.INTERNAL", "the stream ended without trailers")

    def _headers(self, kind: int, flags: int, sid: int, payload: bytes) -> None:
        st = self._streams.get(sid)
        if kind == HEADERS:
            pad = payload[0] if flags & PADDED else 0
            start = (1 if flags & PADDED else 0) + (5 if flags & PRIORITY else 0)
            payload = payload[start : len(payload) - pad]
            if st is not None:
                st.block = bytearray()
                st.ending = bool(flags & END_STREAM)
        if st is None:
            return  # header tables are 0 on both sides: a skipped block leaves no state behind
        st.block += payload
        if flags & END_HEADERS:
            st.headers.update(self._decode(bytes(st.block)))
            if st.ending:
                self._end(st)

    def _decode(self, block: bytes) -> dict[str, str]:
        headers = self._decoded.get(block)
        if headers is None:
            headers = dict(self._decoder.decode(block))
            if len(self._decoded) >= DECODED_MAX:
                self._decoded.clear()
            self._decoded[block] = headers
        return headers

    def _end(self, st: _Stream) -> None:
        if st.done.done():
            return
        status = st.headers.get("grpc-status")
        if status != "0":
            name = _STATUS_NAMES.get(int(status), f"CODE_{status}") if status and status.isdigit() else "UNKNOWN"
            st.done.set_exception(CallError(f"grpc.{name}", st.headers.get("grpc-message", "")))
            return
        st.done.set_result(_messages(st.data))

    def _settings(self, payload: bytes) -> None:
        for i in range(0, len(payload) - 5, 6):
            key, value = struct.unpack_from(">HI", payload, i)
            if key == S_INITIAL_WINDOW_SIZE:
                delta = value - self._peer_initial_window
                self._peer_initial_window = value
                for st in self._streams.values():
                    st.send_window += delta
                self._window_opened.set()
            elif key == S_MAX_FRAME_SIZE:
                self._peer_max_frame = value
        self._write(frame(SETTINGS, ACK, 0))
        if not self._settled.done():
            self._settled.set_result(None)

    def _fail(self, sid: int, code: str, message: str) -> None:
        st = self._streams.get(sid)
        if st is not None and not st.done.done():
            st.done.set_exception(CallError(code, message))

    def _fail_all(self, why: str) -> None:
        if self._closed is None:
            self._closed = why
        for sid in list(self._streams):
            self._fail(sid, "grpc.UNAVAILABLE", why)
        if not self._settled.done():
            self._settled.set_exception(CallError("grpc.UNAVAILABLE", why))
        self._window_opened.set()


def _messages(data: bytearray) -> list[bytes]:
    """The gRPC length-prefixed messages of a stream's DATA (uncompressed only)."""
    out, pos, end = [], 0, len(data)
    unpack = _PREFIX.unpack_from
    while pos + 5 <= end:
        compressed, length = unpack(data, pos)
        if compressed:
            raise CallError("grpc.INTERNAL", "a compressed message (the bench never asks for compression)")
        pos += 5
        out.append(bytes(data[pos : pos + length]))
        pos += length
    if pos != end:
        raise CallError("grpc.INTERNAL", "the stream ended inside a message")
    return out


async def connect(endpoint: str, timeout_s: float) -> Http2Connection:
    host, _, port = endpoint.rpartition(":")
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(timeout_s):
            _, conn = await loop.create_connection(lambda: Http2Connection(endpoint), host, int(port))
            await conn.ready()
    except (OSError, TimeoutError) as exc:
        raise CallError("grpc.UNAVAILABLE", f"{endpoint}: {exc or 'no SETTINGS in time'}") from None
    return conn
