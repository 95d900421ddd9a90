"""The HTTP/2 frame layer (RFC 9113 sections 4 and 6): names of frame types, flags, settings and
error codes, and the encoders of every frame either side of Sluice writes.

A frame is a 9-byte header (24-bit length, type, flags, reserved bit + 31-bit stream id) and its
payload. Parsing is done inline by the two connections (common/http2/server.py and the bench's
client), where one `unpack_from` of the first word reads length and type together.
"""

from __future__ import annotations

import struct
from enum import IntEnum

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
FRAME_HEADER_BYTES = 9

# Frame types (RFC 9113 6).
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)

# Flags.
END_STREAM = 0x1
ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20

# Settings (RFC 9113 6.5.2).
S_HEADER_TABLE_SIZE = 0x1
S_ENABLE_PUSH = 0x2
S_MAX_CONCURRENT_STREAMS = 0x3
S_INITIAL_WINDOW_SIZE = 0x4
S_MAX_FRAME_SIZE = 0x5
S_MAX_HEADER_LIST_SIZE = 0x6

DEFAULT_WINDOW = 65_535
DEFAULT_MAX_FRAME = 16_384
MAX_FRAME_LIMIT = (1 << 24) - 1
MAX_WINDOW = (1 << 31) - 1
STREAM_MASK = MAX_WINDOW  # the reserved bit is ignored on receipt
PING_BYTES = 8


class ErrorCode(IntEnum):
    """RST_STREAM and GOAWAY error codes (RFC 9113 7)."""

    NO_ERROR = 0x0
    PROTOCOL_ERROR = 0x1
    INTERNAL_ERROR = 0x2
    FLOW_CONTROL_ERROR = 0x3
    SETTINGS_TIMEOUT = 0x4
    STREAM_CLOSED = 0x5
    FRAME_SIZE_ERROR = 0x6
    REFUSED_STREAM = 0x7
    CANCEL = 0x8
    COMPRESSION_ERROR = 0x9
    CONNECT_ERROR = 0xA
    ENHANCE_YOUR_CALM = 0xB
    INADEQUATE_SECURITY = 0xC
    HTTP_1_1_REQUIRED = 0xD


class ConnectionError_(Exception):
    """A connection error (RFC 9113 5.4.1): GOAWAY with `code`, then close (either side)."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


HEAD = struct.Struct(">I")  # length (24 bits) + type, read as one word; then flags; then the stream id
_U32 = struct.Struct(">I")
_U32X2 = struct.Struct(">II")
_SETTING = struct.Struct(">HI")


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return HEAD.pack((len(payload) << 8) | kind) + bytes((flags,)) + _U32.pack(stream) + payload


def header(kind: int, flags: int, stream: int, length: int) -> bytes:
    """A frame's 9-byte header alone (the payload written after it, uncopied)."""
    return HEAD.pack((length << 8) | kind) + bytes((flags,)) + _U32.pack(stream)


def settings(values: dict[int, int]) -> bytes:
    return frame(SETTINGS, 0, 0, b"".join(_SETTING.pack(k, v) for k, v in values.items()))


def parse_settings(payload: bytes) -> list[tuple[int, int]]:
    """(identifier, value) of a SETTINGS payload whose length the caller checked is a multiple of 6."""
    return [_SETTING.unpack_from(payload, i) for i in range(0, len(payload), 6)]


def window_update(stream: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream, _U32.pack(increment))


def rst_stream(stream: int, code: int) -> bytes:
    return frame(RST_STREAM, 0, stream, _U32.pack(code))


def goaway(last_stream: int, code: int, debug: str = "") -> bytes:
    return frame(GOAWAY, 0, 0, _U32X2.pack(last_stream, code) + debug.encode("utf-8", "replace"))


def ping(payload: bytes, *, ack: bool) -> bytes:
    return frame(PING, ACK if ack else 0, 0, payload)


def u32(payload: bytes, at: int = 0) -> int:
    return int(_U32.unpack_from(payload, at)[0])
