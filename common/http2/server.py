"""The server side of one HTTP/2 connection (RFC 9113): frames, streams, flow control, limits.

An `asyncio.Protocol`: one `data_received` parses every complete frame that arrived (a client's
request is usually one HEADERS and one DATA frame in one read) and everything written while the
event loop runs one iteration leaves in one `transport.write` (`_flush`). What a request means is
the application's (`Application`, the gRPC layer in common/http2/grpcserver.py): it is handed a
stream with its decoded, validated request headers and then the stream's DATA, and writes its
answer through `send_headers` / `send_data` / `reset`.

Flow control. We announce a connection window of `connection_window` and give it back as DATA
arrives (what a connection may hold unread is bounded per stream, below). A stream starts with the
`initial_window` we announce; beyond it the application grants window (`grant`) for a message it
has agreed to take, and our grants on one connection are bounded (`max_granted_bytes`). Sending, we
honour the client's windows and frame size: what does not fit waits on its stream, in order.

Limits, each answered with a clear code (docs/proxy.md, "The HTTP/2 edge"):
- concurrent streams: `max_concurrent_streams` (announced), and streams the client reset still
  count until their work has ended (a reset stream's handler is cancelled, not forgotten: rapid
  reset, CVE-2023-44487). Beyond: RST_STREAM REFUSED_STREAM.
- header blocks: at most `max_header_frames` frames (HEADERS + CONTINUATION) and
  `max_header_list_size` encoded bytes (CONTINUATION floods: GOAWAY ENHANCE_YOUR_CALM); the decoded
  list at most `max_header_list_size` (an HPACK bomb: the stream is refused, the connection stays).
- frames larger than we announced: GOAWAY FRAME_SIZE_ERROR.
- cheap-to-send, dear-to-serve frames (RST_STREAM, SETTINGS, PRIORITY, refused streams, empty DATA,
  PINGs with no request between them) spend tokens of a bucket (`abuse_burst`, refilled at
  `abuse_per_s`); an empty bucket: GOAWAY ENHANCE_YOUR_CALM.
- a client that does not read: while the transport's buffer is full we stop reading its frames;
  no progress for `write_stall_s`: the connection is closed.
- no preface within `handshake_timeout_s`, or no stream open for `idle_timeout_s`: closed (GOAWAY
  NO_ERROR for an idle one).

Keepalive: the client's PINGs are answered (and charged, above, when nothing else came between
them). After `keepalive_s` with nothing received we send a PING of our own; no answer (nor any
other frame) within `keepalive_timeout_s` and the connection is closed with its streams: its peer
vanished without closing it, and a stream that outlives its client (a Telemetry stream, a long
poll) would otherwise keep its session and resources forever. A peer that answers is never
closed for being quiet while it has a stream open (docs/proxy.md, "The HTTP/2 edge").
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import Protocol, cast

from common.http2 import frames as f
from common.http2.frames import ConnectionError_, ErrorCode
from common.http2.hpackcodec import Decoder, HeaderListTooLarge, HpackError
from common.http2.limits import Http2Limits
from common.http2.request import Request, parse_request
from common.logs import kv

log = logging.getLogger("sluice.http2")

GOAWAY_LINGER_S = 1.0  # after a connection error's GOAWAY, the client's input is drained this long
GOAWAY_DEBUG_MAX = 200  # characters of the reason sent in GOAWAY
KEEPALIVE_PING = b"sluice-k"  # the payload of our keepalive PINGs
CLOSED_REMEMBERED = 64  # streams closed lately (by a reset of ours: their in-flight frames are ignored)


class StreamEvents(Protocol):
    """What the application is told about a stream it accepted."""

    def on_data(self, data: bytes, end_stream: bool) -> None: ...

    def on_reset(self, code: int) -> None:
        """The client reset the stream, or the connection was lost: write nothing more to it."""


class Application(Protocol):
    def open_stream(self, conn: ServerConnection, stream: Stream, request: Request, end_stream: bool) -> StreamEvents:
        """A new request: the application answers it through `conn` and ends with `conn.release`."""

    def refuse_stream(self, conn: ServerConnection, stream: Stream, reason: str) -> None:
        """A request that cannot be served (its header list is too large): answer and release it."""


class Stream:
    __slots__ = ("events", "granted", "id", "local_closed", "pending", "recv_window", "released", "remote_closed",
                 "send_window", "writable")  # fmt: skip

    def __init__(self, sid: int, recv_window: int, send_window: int) -> None:
        self.id = sid
        self.recv_window = recv_window  # what the client may still send
        self.send_window = send_window  # what we may still send
        self.events: StreamEvents | None = None
        self.local_closed = False  # we sent END_STREAM or RST_STREAM
        self.remote_closed = False  # the client sent END_STREAM or RST_STREAM
        self.released = False  # the application is done with it
        self.granted = 0  # window granted beyond the initial one, not yet used up
        self.pending: deque[tuple[int, int, bytes]] = deque()  # (type, flags, payload) waiting for window
        self.writable: asyncio.Future[None] | None = None  # set when `pending` empties


class ServerConnection(asyncio.Protocol):
    def __init__(self, app: Application, limits: Http2Limits, on_close: _Closed | None = None) -> None:
        self.app = app
        self.limits = limits
        self._on_close = on_close
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self.peer = ""
        self._buffer = bytearray()
        self._preface = False
        self._settled = False  # the client's first frame (SETTINGS) was seen
        self.streams: dict[int, Stream] = {}
        self._highest = 0  # the highest stream id the client opened
        self._working = 0  # streams the application has not released (reset ones included)
        self._reset_lately: deque[int] = deque(maxlen=CLOSED_REMEMBERED)
        self._closed_lately: deque[int] = deque(maxlen=CLOSED_REMEMBERED)  # ended by both sides
        self._decoder = Decoder(limits.header_table_bytes, limits.max_header_list_bytes)
        self._block = bytearray()  # a header block being received
        self._block_stream = 0  # its stream, while CONTINUATION frames are expected
        self._block_flags = 0
        self._block_frames = 0
        self._block_error: ErrorCode | None = None  # a stream error found in the block's HEADERS frame
        self._recv_left = limits.connection_window_bytes  # connection window the client may still use
        self._send_window = f.DEFAULT_WINDOW
        self._peer_initial = f.DEFAULT_WINDOW
        self._peer_max_frame = f.DEFAULT_MAX_FRAME
        self._blocked: dict[int, Stream] = {}  # streams with output waiting for window
        self.granted = 0  # stream window granted beyond the initial, on every stream
        self._out: list[bytes] = []
        self._paused = False  # the transport's buffer is full: reading is paused until it drains
        self._tokens = float(limits.abuse_burst)
        self._tokens_at = time.monotonic()
        self._ping_strike = False  # a PING came with no request frame since the last one
        self._received_at = time.monotonic()  # when the client's bytes last arrived (keepalive)
        self._ping_sent_at: float | None = None  # our keepalive PING awaiting its answer
        self.goaway_sent: int | None = None  # the last stream id we announced in GOAWAY
        self._peer_goaway = False
        self._closed = False
        self._active_at = time.monotonic()  # when a stream last ended (idle) or output last moved (stall)
        self._stalled_at: float | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._opened_at = time.monotonic()

    # -- asyncio.Protocol --

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        self.peer = _peer_name(transport.get_extra_info("peername"))
        lim = self.limits
        values = {f.S_MAX_CONCURRENT_STREAMS: lim.max_concurrent_streams, f.S_ENABLE_PUSH: 0,
                  f.S_MAX_HEADER_LIST_SIZE: lim.max_header_list_bytes}  # fmt: skip
        if lim.initial_window_bytes != f.DEFAULT_WINDOW:
            values[f.S_INITIAL_WINDOW_SIZE] = lim.initial_window_bytes
        if lim.max_frame_bytes != f.DEFAULT_MAX_FRAME:
            values[f.S_MAX_FRAME_SIZE] = lim.max_frame_bytes
        if lim.header_table_bytes != 4096:
            values[f.S_HEADER_TABLE_SIZE] = lim.header_table_bytes
        out = f.settings(values)
        if lim.connection_window_bytes > f.DEFAULT_WINDOW:
            out += f.window_update(0, lim.connection_window_bytes - f.DEFAULT_WINDOW)
        self._transport.write(out)
        self._arm(lim.handshake_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
        for st in list(self.streams.values()):
            self._drop(st, ErrorCode.CANCEL)
        self.streams.clear()
        self._blocked.clear()
        if self._on_close is not None:
            self._on_close(self)

    def pause_writing(self) -> None:
        self._paused = True
        self._stalled_at = time.monotonic()
        if self._transport is not None:
            self._transport.pause_reading()

    def resume_writing(self) -> None:
        self._paused = False
        self._stalled_at = None if not self._blocked else time.monotonic()
        if self._transport is not None and not self._closed:
            self._transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        if self._closed:
            return
        self._received_at = time.monotonic()
        self._ping_sent_at = None  # anything from the peer shows it is there
        if self._buffer:
            data = bytes(self._buffer) + data
            self._buffer.clear()
        try:
            pos = 0 if self._preface else self._read_preface(data)
            if pos < 0:
                return
            self._frames(data, pos)
        except ConnectionError_ as exc:
            self._fail(exc.code, str(exc))

    # -- reading --

    def _read_preface(self, data: bytes) -> int:
        n = len(f.PREFACE)
        if len(data) < n:
            if not f.PREFACE.startswith(data):
                raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "not an HTTP/2 connection preface")
            self._buffer += data
            return -1
        if not data.startswith(f.PREFACE):
            raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "not an HTTP/2 connection preface")
        self._preface = True
        self._arm(self.limits.idle_timeout_s)
        return n

    def _frames(self, data: bytes, pos: int) -> None:
        end = len(data)
        unpack = f.HEAD.unpack_from
        max_frame = self.limits.max_frame_bytes
        while end - pos >= f.FRAME_HEADER_BYTES:
            word = unpack(data, pos)[0]
            length = word >> 8
            if length > max_frame:
                raise ConnectionError_(ErrorCode.FRAME_SIZE_ERROR, f"a frame of {length} bytes exceeds the "
                                                                   f"{max_frame} announced")  # fmt: skip
            start = pos + f.FRAME_HEADER_BYTES
            if end - start < length:
                break
            kind, flags = word & 0xFF, data[pos + 4]
            sid = unpack(data, pos + 5)[0] & f.STREAM_MASK
            pos = start + length
            if not self._settled:
                if kind != f.SETTINGS or flags & f.ACK:
                    raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "the first frame must be SETTINGS")
                self._settled = True
            if self._block_stream and kind != f.CONTINUATION:
                raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "a header block was interrupted by another frame")
            if kind == f.DATA:
                self._data(flags, sid, data[start:pos])
            elif kind == f.HEADERS:
                self._headers(flags, sid, data[start:pos])
            else:
                self._control(kind, flags, sid, data[start:pos])
            if self._closed:
                return
        if pos < end:
            self._buffer += data[pos:]

    def _data(self, flags: int, sid: int, payload: bytes) -> None:
        if sid == 0:
            raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "DATA on stream 0")
        size = len(payload)
        self._recv_left -= size
        if self._recv_left < 0:
            raise ConnectionError_(ErrorCode.FLOW_CONTROL_ERROR, "DATA beyond the connection window")
        if self._recv_left < self.limits.connection_window_bytes // 2:  # give it back (bounded per stream)
            self._write(f.window_update(0, self.limits.connection_window_bytes - self._recv_left))
            self._recv_left = self.limits.connection_window_bytes
        self._ping_strike = False
        st = self.streams.get(sid)
        if st is None or st.remote_closed:
            self._not_open(sid, "DATA")
            return
        st.recv_window -= size
        if st.recv_window < 0:
            self._reset(st, ErrorCode.FLOW_CONTROL_ERROR)
            return
        if flags & f.PADDED:
            payload = _unpad(payload)
        end_stream = bool(flags & f.END_STREAM)
        if not payload and not end_stream:
            self._charge("empty DATA frames")
        if end_stream:
            st.remote_closed = True
        if st.events is not None:
            st.events.on_data(payload, end_stream)
        if end_stream:
            self._maybe_close(st)

    def _headers(self, flags: int, sid: int, payload: bytes) -> None:
        if sid == 0:
            raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "HEADERS on stream 0")
        self._ping_strike = False
        start, end = 0, len(payload)
        if flags & f.PADDED:
            if not payload or payload[0] >= end:
                raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "padding as long as the frame")
            start, end = 1, end - payload[0]
        if flags & f.PRIORITY_FLAG:
            if end - start < 5:
                raise ConnectionError_(ErrorCode.FRAME_SIZE_ERROR, "HEADERS too short for its priority")
            if f.u32(payload, start) & f.STREAM_MASK == sid:
                self._block_error = ErrorCode.PROTOCOL_ERROR  # depends on itself; the block is still decoded
            start += 5
        self._block = bytearray(payload[start:end])
        self._block_flags = flags
        self._block_frames = 1
        if flags & f.END_HEADERS:
            self._header_block(sid)
        else:
            self._block_stream = sid
            self._check_block()

    def _continuation(self, flags: int, sid: int, payload: bytes) -> None:
        if not self._block_stream or sid != self._block_stream:
            raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "CONTINUATION without a header block to continue")
        self._block += payload
        self._block_frames += 1
        self._check_block()
        if flags & f.END_HEADERS:
            self._block_stream = 0
            self._header_block(sid)

    def _check_block(self) -> None:
        lim = self.limits
        if self._block_frames > lim.max_header_frames or len(self._block) > lim.max_header_list_bytes:
            raise ConnectionError_(ErrorCode.ENHANCE_YOUR_CALM, f"a header block of more than {lim.max_header_frames}"
                                   f" frames or {lim.max_header_list_bytes} bytes")  # fmt: skip

    def _header_block(self, sid: int) -> None:
        block, self._block = bytes(self._block), bytearray()
        too_large = ""
        try:
            fields = self._decoder.decode(block)
        except HpackError as exc:
            raise ConnectionError_(ErrorCode.COMPRESSION_ERROR, str(exc)) from None
        except HeaderListTooLarge as exc:
            fields, too_large = [], str(exc)
        end_stream = bool(self._block_flags & f.END_STREAM)
        st = self.streams.get(sid)
        if self._block_error is not None:
            code, self._block_error = self._block_error, None
            self._highest = max(self._highest, sid)
            self._stream_error_on(sid, code)
            return
        if st is not None:  # trailers
            if st.remote_closed:
                self._not_open(sid, "HEADERS")
            elif not end_stream or any(name.startswith(":") for name, _ in fields) or too_large:
                self._reset(st, ErrorCode.PROTOCOL_ERROR)
            else:
                st.remote_closed = True
                if st.events is not None:
                    st.events.on_data(b"", True)
                self._maybe_close(st)
            return
        if sid % 2 == 0 or sid <= self._highest:
            if sid % 2 == 0:
                raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, f"HEADERS on even stream {sid}")
            if sid in self._closed_lately:
                raise ConnectionError_(ErrorCode.STREAM_CLOSED, f"HEADERS on closed stream {sid}")
            if sid not in self._reset_lately:  # (frames on a stream we reset are ignored)
                raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, f"HEADERS on stream {sid}, lower than {self._highest}")
            return
        self._highest = sid
        if self.goaway_sent is not None or self._peer_goaway:
            self._write(f.rst_stream(sid, ErrorCode.REFUSED_STREAM))
            self._reset_lately.append(sid)
            return
        lim = self.limits
        if len(self.streams) >= lim.max_concurrent_streams or self._working >= lim.max_concurrent_streams:
            self._charge("refused streams")
            self._write(f.rst_stream(sid, ErrorCode.REFUSED_STREAM))
            self._reset_lately.append(sid)
            return
        st = Stream(sid, lim.initial_window_bytes, self._peer_initial)
        st.remote_closed = end_stream
        self.streams[sid] = st
        self._working += 1
        if too_large:
            self.app.refuse_stream(self, st, too_large)
            return
        request = parse_request(fields)
        if request is None:
            self._working -= 1
            st.released = True
            self._reset(st, ErrorCode.PROTOCOL_ERROR)
            return
        st.events = self.app.open_stream(self, st, request, end_stream)

    def _control(self, kind: int, flags: int, sid: int, payload: bytes) -> None:
        if kind == f.CONTINUATION:
            self._continuation(flags, sid, payload)
        elif kind == f.SETTINGS:
            self._settings(flags, sid, payload)
        elif kind == f.WINDOW_UPDATE:
            self._window_update(sid, payload)
        elif kind == f.PING:
            if sid != 0:
                raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "PING on a stream")
            if len(payload) != f.PING_BYTES:
                raise ConnectionError_(ErrorCode.FRAME_SIZE_ERROR, "a PING of other than 8 bytes")
            if not flags & f.ACK:
                if self._ping_strike:
                    self._charge("PINGs")
                self._ping_strike = True
                self._write(f.ping(payload, ack=True))
        elif kind == f.RST_STREAM:
            self._rst_stream(sid, payload)
        elif kind == f.PRIORITY:
            if sid == 0:
                raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "PRIORITY on stream 0")
            if len(payload) != 5:
                self._stream_error_on(sid, ErrorCode.FRAME_SIZE_ERROR)
                return
            self._charge("PRIORITY frames")
            if f.u32(payload) & f.STREAM_MASK == sid:
                self._stream_error_on(sid, ErrorCode.PROTOCOL_ERROR)
        elif kind == f.GOAWAY:
            if sid != 0:
                raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "GOAWAY on a stream")
            if len(payload) < 8:
                raise ConnectionError_(ErrorCode.FRAME_SIZE_ERROR, "GOAWAY shorter than 8 bytes")
            self._peer_goaway = True
            self._close_when_done()
        elif kind == f.PUSH_PROMISE:
            raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "a client may not push (PUSH_PROMISE)")
        # unknown frame types are ignored (RFC 9113 5.5)

    def _settings(self, flags: int, sid: int, payload: bytes) -> None:
        if sid != 0:
            raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & f.ACK:
            if payload:
                raise ConnectionError_(ErrorCode.FRAME_SIZE_ERROR, "a SETTINGS acknowledgement with a payload")
            return
        if len(payload) % 6:
            raise ConnectionError_(ErrorCode.FRAME_SIZE_ERROR, "a SETTINGS payload not a multiple of 6 bytes")
        self._charge("SETTINGS frames")
        for key, value in f.parse_settings(payload):
            if key == f.S_INITIAL_WINDOW_SIZE:
                if value > f.MAX_WINDOW:
                    raise ConnectionError_(ErrorCode.FLOW_CONTROL_ERROR, "SETTINGS_INITIAL_WINDOW_SIZE over 2^31-1")
                delta, self._peer_initial = value - self._peer_initial, value
                for st in self.streams.values():
                    st.send_window += delta
                    if st.send_window > f.MAX_WINDOW:
                        raise ConnectionError_(ErrorCode.FLOW_CONTROL_ERROR, "a stream window over 2^31-1")
            elif key == f.S_MAX_FRAME_SIZE:
                if not f.DEFAULT_MAX_FRAME <= value <= f.MAX_FRAME_LIMIT:
                    raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, f"SETTINGS_MAX_FRAME_SIZE {value} out of range")
                self._peer_max_frame = value
            elif key == f.S_ENABLE_PUSH and value > 1:
                raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "SETTINGS_ENABLE_PUSH other than 0 or 1")
        self._write(f.frame(f.SETTINGS, f.ACK, 0))
        self._drain_blocked()

    def _window_update(self, sid: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise ConnectionError_(ErrorCode.FRAME_SIZE_ERROR, "a WINDOW_UPDATE of other than 4 bytes")
        increment = f.u32(payload) & f.STREAM_MASK
        if sid == 0:
            if increment == 0:
                raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "a WINDOW_UPDATE of 0 on the connection")
            self._send_window += increment
            if self._send_window > f.MAX_WINDOW:
                raise ConnectionError_(ErrorCode.FLOW_CONTROL_ERROR, "the connection window over 2^31-1")
            self._drain_blocked()
            return
        st = self.streams.get(sid)
        if st is None:
            if sid > self._highest:
                raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, f"WINDOW_UPDATE on idle stream {sid}")
            return  # a stream closed lately: allowed, ignored
        if increment == 0:
            self._reset(st, ErrorCode.PROTOCOL_ERROR)
            return
        st.send_window += increment
        if st.send_window > f.MAX_WINDOW:
            self._reset(st, ErrorCode.FLOW_CONTROL_ERROR)
            return
        if st.pending:
            self._drain(st)

    def _rst_stream(self, sid: int, payload: bytes) -> None:
        if sid == 0:
            raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "RST_STREAM on stream 0")
        if len(payload) != 4:
            raise ConnectionError_(ErrorCode.FRAME_SIZE_ERROR, "an RST_STREAM of other than 4 bytes")
        if sid > self._highest:
            raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, f"RST_STREAM on idle stream {sid}")
        st = self.streams.get(sid)
        if st is None:
            return
        self._charge("stream resets")
        self._drop(st, f.u32(payload))
        st.local_closed = True
        self._remove(st)

    def _not_open(self, sid: int, what: str) -> None:
        """A frame on a stream that is not open for the client to send on."""
        if sid > self._highest:
            raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, f"{what} on idle stream {sid}")
        if sid in self._reset_lately:
            return  # sent before our RST_STREAM reached the client: ignored
        st = self.streams.get(sid)
        if st is not None:
            self._reset(st, ErrorCode.STREAM_CLOSED)
        else:
            self._write(f.rst_stream(sid, ErrorCode.STREAM_CLOSED))
            self._reset_lately.append(sid)

    def _stream_error_on(self, sid: int, code: ErrorCode) -> None:
        st = self.streams.get(sid)
        if st is not None:
            self._reset(st, code)
        else:
            self._write(f.rst_stream(sid, code))
            self._reset_lately.append(sid)

    def _charge(self, what: str) -> None:
        now = time.monotonic()
        lim = self.limits
        self._tokens = min(float(lim.abuse_burst), self._tokens + (now - self._tokens_at) * lim.abuse_per_s) - 1
        self._tokens_at = now
        if self._tokens < 0:
            raise ConnectionError_(ErrorCode.ENHANCE_YOUR_CALM, f"too many {what}")

    # -- for the application --

    def grant(self, st: Stream, amount: int) -> bool:
        """Open `st`'s receive window by `amount`; False (nothing granted) when this connection's
        grants beyond the initial windows would exceed `max_granted_bytes`."""
        if st.remote_closed or self._closed:
            return True
        if self.granted + amount > self.limits.max_granted_bytes:
            return False
        self.granted += amount
        st.granted += amount
        st.recv_window += amount
        self._write(f.window_update(st.id, amount))
        return True

    def return_grant(self, st: Stream) -> None:
        """`st`'s granted window is used up or no longer needed: it counts no more."""
        self.granted -= st.granted
        st.granted = 0

    def refill(self, st: Stream, amount: int) -> None:
        """Give back `amount` of `st`'s initial window (a streaming request's message was taken)."""
        if not st.remote_closed and not self._closed and amount > 0:
            st.recv_window += amount
            self._write(f.window_update(st.id, amount))

    def send_headers(self, st: Stream, block: bytes, *, end_stream: bool = False) -> None:
        if st.local_closed:
            return
        flags = f.END_HEADERS | (f.END_STREAM if end_stream else 0)
        if end_stream:
            st.local_closed = True
        if st.pending or len(block) > self._peer_max_frame:
            self._queue(st, f.HEADERS, flags, block)
        else:
            self._write(f.frame(f.HEADERS, flags, st.id, block))
        if end_stream:
            self._maybe_close(st)

    def send_data(self, st: Stream, data: bytes, *, end_stream: bool = False) -> None:
        if st.local_closed:
            return
        n = len(data)
        flags = f.END_STREAM if end_stream else 0
        if end_stream:
            st.local_closed = True
        if not st.pending and n <= self._send_window and n <= st.send_window and n <= self._peer_max_frame:
            self._send_window -= n
            st.send_window -= n
            self._write(f.header(f.DATA, flags, st.id, n))
            self._write(data)
        else:
            self._queue(st, f.DATA, flags, data)
        if end_stream:
            self._maybe_close(st)

    def send_response(self, st: Stream, headers: bytes, body: bytes, trailers: bytes) -> None:
        """A whole answer (headers, one DATA, trailers ending the stream) in one write when it fits."""
        n = len(body)
        if st.local_closed:
            return
        if st.pending or n > self._send_window or n > st.send_window or n > self._peer_max_frame:
            self.send_headers(st, headers)
            self.send_data(st, body)
            self.send_headers(st, trailers, end_stream=True)
            return
        self._send_window -= n
        st.send_window -= n
        st.local_closed = True
        sid = st.id
        self._write(f.header(f.HEADERS, f.END_HEADERS, sid, len(headers)) + headers + f.header(f.DATA, 0, sid, n))
        self._write(body)
        self._write(f.header(f.HEADERS, f.END_HEADERS | f.END_STREAM, sid, len(trailers)) + trailers)
        self._maybe_close(st)

    async def writable(self, st: Stream) -> None:
        """Until `st`'s waiting output has been written (or the stream or connection is gone)."""
        while st.pending and not self._closed and st.id in self.streams:
            if st.writable is None:
                st.writable = self._loop.create_future()
            await st.writable

    def reset(self, st: Stream, code: ErrorCode) -> None:
        """Reset a stream the application is answering (it still calls `release`)."""
        if not st.local_closed or st.pending:
            self._write(f.rst_stream(st.id, code))
            self._reset_lately.append(st.id)
        st.local_closed = st.remote_closed = True
        st.pending.clear()
        self._remove(st)

    def release(self, st: Stream) -> None:
        """The application is done with `st`: it no longer counts against the stream limit."""
        if st.released:
            return
        st.released = True
        self._working -= 1
        self.return_grant(st)
        if not st.remote_closed and st.local_closed and not st.pending and st.id in self.streams:
            # answered before the client finished sending: it need send no more (RFC 9113 8.1)
            self._write(f.rst_stream(st.id, ErrorCode.NO_ERROR))
            self._reset_lately.append(st.id)
            st.remote_closed = True
        self._maybe_close(st)

    def shutdown(self) -> None:
        """GOAWAY (NO_ERROR): streams already opened are served, new ones refused; the connection
        closes when the last one has ended."""
        if self._closed or self.goaway_sent is not None:
            return
        self.goaway_sent = self._highest
        self._write(f.goaway(self._highest, ErrorCode.NO_ERROR, "server shutting down"))
        self._close_when_done()

    def abort(self) -> None:
        if self._transport is not None and not self._closed:
            self._flush()
            self._transport.close()

    # -- writing --

    def _write(self, data: bytes) -> None:
        if not self._out:
            self._loop.call_soon(self._flush)
        self._out.append(data)

    def _flush(self) -> None:
        out, self._out = self._out, []
        if self._transport is not None and not self._closed and out:
            self._transport.write(b"".join(out) if len(out) > 1 else out[0])

    def _queue(self, st: Stream, kind: int, flags: int, payload: bytes) -> None:
        st.pending.append((kind, flags, payload))
        self._blocked[st.id] = st
        if self._stalled_at is None:
            self._stalled_at = time.monotonic()
        self._drain(st)

    def _drain_blocked(self) -> None:
        for st in list(self._blocked.values()):
            if self._send_window <= 0:
                break
            self._drain(st)

    def _drain(self, st: Stream) -> None:
        """Write what the windows allow of `st`'s waiting output, in order."""
        pending = st.pending
        while pending:
            kind, flags, payload = pending[0]
            if kind == f.HEADERS:
                pending.popleft()
                self._write_block(st.id, flags, payload)
                continue
            room = min(self._send_window, st.send_window, self._peer_max_frame)
            n = len(payload)
            if n > room:
                if room <= 0:
                    break
                view = memoryview(payload)  # the rest stays a view: a large message is copied once
                pending[0] = (kind, flags, view[room:])  # type: ignore[assignment]
                self._write(f.header(f.DATA, 0, st.id, room))
                self._write(bytes(view[:room]))
                n = room
            else:
                pending.popleft()
                self._write(f.header(f.DATA, flags, st.id, n))
                self._write(payload)
            self._send_window -= n
            st.send_window -= n
        self._active_at = time.monotonic()
        if not pending:
            self._blocked.pop(st.id, None)
            if not self._blocked and not self._paused:
                self._stalled_at = None
            if st.writable is not None:
                if not st.writable.done():
                    st.writable.set_result(None)
                st.writable = None
            self._maybe_close(st)

    def _write_block(self, sid: int, flags: int, block: bytes) -> None:
        """A header block, split into CONTINUATION frames past the client's frame size."""
        size = self._peer_max_frame
        if len(block) <= size:
            self._write(f.frame(f.HEADERS, flags, sid, block))
            return
        parts = [block[i : i + size] for i in range(0, len(block), size)]
        self._write(f.frame(f.HEADERS, flags & ~f.END_HEADERS, sid, parts[0]))
        for i, part in enumerate(parts[1:], 2):
            self._write(f.frame(f.CONTINUATION, f.END_HEADERS if i == len(parts) else 0, sid, part))

    # -- closing --

    def _reset(self, st: Stream, code: ErrorCode) -> None:
        """A stream error of ours (RFC 9113 5.4.2)."""
        owned = st.events is not None  # then the application releases it when its work has ended
        self._drop(st, code)
        self.reset(st, code)
        if not owned and not st.released:
            st.released = True
            self._working -= 1

    def _drop(self, st: Stream, code: int) -> None:
        """Tell the application its stream is gone (it releases it when its work has ended)."""
        events, st.events = st.events, None
        st.remote_closed = True
        if st.writable is not None and not st.writable.done():
            st.writable.set_result(None)
        if events is not None:
            events.on_reset(code)

    def _maybe_close(self, st: Stream) -> None:
        if st.local_closed and st.remote_closed and not st.pending:
            if st.id in self.streams and st.id not in self._reset_lately:
                self._closed_lately.append(st.id)
            self._remove(st)

    def _remove(self, st: Stream) -> None:
        if self.streams.pop(st.id, None) is not None:
            self._blocked.pop(st.id, None)
            if not self.streams:
                self._active_at = time.monotonic()
        if self.goaway_sent is not None or self._peer_goaway:
            self._close_when_done()

    def _close_when_done(self) -> None:
        if not self.streams and not self._working and self._transport is not None and not self._closed:
            self._flush()
            self._transport.close()

    def _fail(self, code: ErrorCode, why: str) -> None:
        """A connection error: GOAWAY with `code`, and close."""
        if self._closed or self._transport is None:
            return
        if code != ErrorCode.NO_ERROR:
            log.info("http2 connection closed", extra=kv(peer=self.peer, code=code.name, why=why))
        self._out.append(f.goaway(self._highest, code, why[:GOAWAY_DEBUG_MAX]))
        self._flush()
        self._closed = True  # what the client still sends is read and dropped (data_received)
        for st in list(self.streams.values()):
            self._drop(st, ErrorCode.CANCEL)
        # Closing a socket with unread input resets the connection, and the client may lose the
        # GOAWAY on its way: end our side, drain theirs for a moment, then close.
        transport = self._transport
        if transport.can_write_eof():
            transport.write_eof()
        transport.resume_reading()
        self._loop.call_later(GOAWAY_LINGER_S, transport.close)

    def _cut(self, why: str) -> None:
        """Close at once, dropping what is buffered for a peer that does not read or answer (a
        graceful close would wait for it to drain)."""
        log.info("http2 connection closed", extra=kv(peer=self.peer, why=why, streams=len(self.streams)))
        if self._transport is not None:
            self._transport.abort()

    # -- timers --

    def _arm(self, after_s: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        lim = self.limits
        every = min(after_s, lim.write_stall_s, lim.keepalive_s, lim.keepalive_timeout_s) / 2
        self._timer = self._loop.call_later(every, self._tick)

    def _tick(self) -> None:
        self._timer = None
        if self._closed:
            return
        now = time.monotonic()
        lim = self.limits
        if not self._preface:
            if now - self._opened_at >= lim.handshake_timeout_s:
                self._fail(ErrorCode.PROTOCOL_ERROR, "no HTTP/2 preface in time")
                return
        elif self._stalled_at is not None and now - self._stalled_at >= lim.write_stall_s:
            self._cut("the client stopped reading")
            return
        elif not self.streams and not self._working and now - self._active_at >= lim.idle_timeout_s:
            self._fail(ErrorCode.NO_ERROR, "idle")
            return
        elif self._ping_sent_at is not None and now - self._ping_sent_at >= lim.keepalive_timeout_s:
            self._cut("no answer to a keepalive PING")
            return
        elif self._ping_sent_at is None and self._preface and now - self._received_at >= lim.keepalive_s:
            self._ping_sent_at = now
            self._write(f.ping(KEEPALIVE_PING, ack=False))
        self._arm(lim.handshake_timeout_s if not self._preface else lim.idle_timeout_s)


class _Closed(Protocol):
    def __call__(self, conn: ServerConnection) -> None: ...


def _unpad(payload: bytes) -> bytes:
    if not payload or payload[0] >= len(payload):
        raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "padding as long as the frame")
    return payload[1 : len(payload) - payload[0]]


def _peer_name(address: object) -> str:
    """As gRPC names peers: ipv4:host:port, ipv6:[host]:port."""
    if isinstance(address, tuple) and len(address) >= 2:
        host, port = address[0], address[1]
        return f"ipv6:[{host}]:{port}" if ":" in str(host) else f"ipv4:{host}:{port}"
    return str(address or "")
