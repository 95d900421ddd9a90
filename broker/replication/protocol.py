"""The replication stream's frames (TCP, one connection per replica; docs/replication.md).

Every frame is a header and a payload:

| offset | size | field |
|---|---|---|
| 0 | 4 | magic 0x534C5250 (`SLRP`) |
| 4 | 1 | version = 1 |
| 5 | 1 | type (below) |
| 6 | 4 | payload size (u32, little-endian) |
| 10 | … | payload |

| type | direction | payload |
|---|---|---|
| HELLO 1 | replica → primary | JSON: group, name, epoch (the replica's last), log_end |
| START 2 | primary → replica | JSON: epoch, from_offset (the replica truncates its log to it), min_offset |
| DATA 3 | primary → replica | segment_base u64, position u64 (in that segment), then CommitLog bytes |
| ACK 4 | replica → primary | u64: the replica's log end, held under its flush policy |
| ERROR 5 | either | UTF-8 text for a person; the connection closes after it |
| META 6 | primary → replica | JSON: version, and {column family: {key: value}} of all topic and group metadata |
| META_ACK 7 | replica → primary | u64: the metadata version the replica now holds |
| STATE 8 | primary → replica | one numbered change of the replicated consumer state, or a snapshot piece (state.py) |
| STATE_ACK 9 | replica → primary | u64: the last state change the replica applied |
| META_PART 10 | primary → replica | a leading piece of a META payload too large for one frame |

A META payload larger than the frame limit travels as META_PART frames followed by one META frame
with its last piece; the replica joins them (`meta`). A payload that fits is one META frame, as
before META_PART existed.

DATA carries a piece of the CommitLog that never crosses a segment; it need not end on a record
boundary (the replica writes whole records and keeps the rest for the next piece). The records'
own CRCs protect their bytes; a frame with a bad magic, version, type or size ends the connection.
"""

from __future__ import annotations

import asyncio
import json
import struct
from enum import IntEnum
from typing import Any

from common.errors import BadRequest

MAGIC = 0x534C5250
VERSION = 1
_HEADER = struct.Struct("<IBBI")
_DATA = struct.Struct("<QQ")
_ACK = struct.Struct("<Q")
MAX_CONTROL_BYTES = 64 * 1024


class FrameType(IntEnum):
    HELLO = 1
    START = 2
    DATA = 3
    ACK = 4
    ERROR = 5
    META = 6
    META_ACK = 7
    STATE = 8
    STATE_ACK = 9
    META_PART = 10


def frame(kind: FrameType, payload: bytes | bytearray | memoryview) -> list[bytes | bytearray | memoryview]:
    """The buffers of one frame (header, payload), for `StreamWriter.writelines`."""
    return [_HEADER.pack(MAGIC, VERSION, kind, len(payload)), payload]


def control(kind: FrameType, body: dict[str, Any]) -> list[bytes | bytearray | memoryview]:
    return frame(kind, json.dumps(body, separators=(",", ":")).encode())


def data(segment_base: int, position: int, chunk: bytes | memoryview) -> list[bytes | bytearray | memoryview]:
    return [
        _HEADER.pack(MAGIC, VERSION, FrameType.DATA, _DATA.size + len(chunk)),
        _DATA.pack(segment_base, position),
        chunk,
    ]


def ack(position: int) -> list[bytes | bytearray | memoryview]:
    return frame(FrameType.ACK, _ACK.pack(position))


def meta(payload: bytes, max_payload_bytes: int) -> list[bytes | bytearray | memoryview]:
    """The frames of one META payload: META_PART pieces of at most `max_payload_bytes`, then META."""
    view = memoryview(payload)
    buffers: list[bytes | bytearray | memoryview] = []
    while len(view) > max_payload_bytes:
        buffers += frame(FrameType.META_PART, view[:max_payload_bytes])
        view = view[max_payload_bytes:]
    return buffers + frame(FrameType.META, view)


def meta_ack(version: int) -> list[bytes | bytearray | memoryview]:
    return frame(FrameType.META_ACK, _ACK.pack(version))


def state_ack(seq: int) -> list[bytes | bytearray | memoryview]:
    return frame(FrameType.STATE_ACK, _ACK.pack(seq))


def error(message: str) -> list[bytes | bytearray | memoryview]:
    return frame(FrameType.ERROR, message.encode()[:MAX_CONTROL_BYTES])


async def read_frame(reader: asyncio.StreamReader, max_payload_bytes: int) -> tuple[FrameType, bytes]:
    """The next frame; BadRequest for a malformed one, IncompleteReadError at end of stream."""
    header = await reader.readexactly(_HEADER.size)
    magic, version, kind, size = _HEADER.unpack(header)
    if magic != MAGIC or version != VERSION:
        raise BadRequest(f"not a replication frame (magic 0x{magic:08x}, version {version})")
    try:
        ftype = FrameType(kind)
    except ValueError:
        raise BadRequest(f"unknown replication frame type {kind}") from None
    bulk = (FrameType.DATA, FrameType.META, FrameType.META_PART, FrameType.STATE)
    limit = max_payload_bytes + _DATA.size if ftype in bulk else MAX_CONTROL_BYTES
    if size > limit:
        raise BadRequest(f"replication frame of {size} bytes exceeds {limit}")
    return ftype, await reader.readexactly(size)


def parse_control(payload: bytes, *fields: str) -> dict[str, Any]:
    try:
        body = json.loads(payload)
    except ValueError:
        raise BadRequest("replication control frame is not JSON") from None
    if not isinstance(body, dict) or any(f not in body for f in fields):
        raise BadRequest(f"replication control frame lacks one of {', '.join(fields)}")
    return body


def parse_data(payload: bytes) -> tuple[int, int, memoryview]:
    if len(payload) <= _DATA.size:
        raise BadRequest("replication data frame without data")
    base, position = _DATA.unpack_from(payload)
    return base, position, memoryview(payload)[_DATA.size :]


def parse_ack(payload: bytes) -> int:
    if len(payload) != _ACK.size:
        raise BadRequest("replication ack frame of the wrong size")
    return int(_ACK.unpack(payload)[0])
