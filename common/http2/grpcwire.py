"""What both sides of gRPC over HTTP/2 agree on (the gRPC "PROTOCOL-HTTP2" wire format): status
codes, the 5-byte message prefix, `grpc-timeout` values, `grpc-message` percent-encoding and how
`-bin` metadata travels. The server (grpcserver.py) and the client (client.py) both use these.
"""

from __future__ import annotations

import base64
import math
import re
import struct
from enum import IntEnum

PREFIX = struct.Struct(">BI")  # a message's compressed flag and length
PREFIX_BYTES = 5


class StatusCode(IntEnum):
    """gRPC status codes (the numbers every gRPC implementation uses)."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


def status_code(value: int) -> StatusCode:
    """A status number as sent; one outside the known range is UNKNOWN (as gRPC reads it)."""
    try:
        return StatusCode(value)
    except ValueError:
        return StatusCode.UNKNOWN


# What an HTTP status other than 200 means to a gRPC client (gRPC's "http-grpc-status-mapping").
HTTP_TO_GRPC = {400: StatusCode.INTERNAL, 401: StatusCode.UNAUTHENTICATED, 403: StatusCode.PERMISSION_DENIED,
                404: StatusCode.UNIMPLEMENTED, 429: StatusCode.UNAVAILABLE, 502: StatusCode.UNAVAILABLE,
                503: StatusCode.UNAVAILABLE, 504: StatusCode.UNAVAILABLE}  # fmt: skip

_TIMEOUT = re.compile(r"(\d{1,8})([HMSmun])\Z")
_UNIT_S = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}
_TIMEOUT_DIGITS_MAX = 99_999_999
_UNSAFE = re.compile(r"[^\x20-\x24\x26-\x7e]")
_ESCAPED = re.compile(r"%[0-9A-Fa-f]{2}")


_timeouts: dict[str, float | None] = {}
_TIMEOUTS_MAX = 1024  # values remembered (clients repeat theirs: "10100m", "9998m")


def parse_timeout(value: str) -> float | None:
    """The seconds of a grpc-timeout header (`<up to 8 digits><unit>`), None when malformed."""
    try:
        return _timeouts[value]
    except KeyError:
        pass
    m = _TIMEOUT.match(value)
    seconds = None if m is None else int(m.group(1)) * _UNIT_S[m.group(2)]
    if len(_timeouts) >= _TIMEOUTS_MAX:
        _timeouts.clear()
    _timeouts[value] = seconds
    return seconds


def format_timeout(seconds: float) -> str:
    """A grpc-timeout value for `seconds` (rounded up to the millisecond, at least 1 ms)."""
    ms = max(1, math.ceil(seconds * 1000))
    if ms <= _TIMEOUT_DIGITS_MAX:
        return f"{ms}m"
    return f"{min(_TIMEOUT_DIGITS_MAX, math.ceil(seconds))}S"


def percent_encode(message: str) -> str:
    """grpc-message's encoding: UTF-8, every byte outside printable ASCII (and '%') as %XX."""
    if not _UNSAFE.search(message):
        return message
    return "".join(chr(b) if 0x20 <= b <= 0x7E and b != 0x25 else f"%{b:02X}" for b in message.encode())


def percent_decode(message: str) -> str:
    """The text of a grpc-message value; a malformed escape is kept as it is."""
    if "%" not in message:
        return message
    raw = _ESCAPED.sub(lambda m: chr(int(m.group()[1:], 16)), message).encode("latin-1", "replace")
    return raw.decode("utf-8", "replace")


def b64(value: bytes) -> bytes:
    """A `-bin` value as sent: base64 without padding."""
    return base64.b64encode(value).rstrip(b"=")


def unb64(value: str) -> bytes:
    """A received `-bin` value (padded or not); b"" when it is not base64."""
    try:
        return base64.b64decode(value + "=" * (-len(value) % 4))
    except ValueError:
        return b""
