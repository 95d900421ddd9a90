"""AMQP 0-9-1 frames on an asyncio stream: read with limits, decode with pamqp, write.

A frame is type (1 byte), channel (2), payload size (4), payload, and the end octet 0xCE. The
payload size is checked against the negotiated frame_max before anything is read, so a client
cannot make the server buffer more. Method payloads are decoded by pamqp; a content header's
property bytes are kept as the client sent them (pamqp's decode and encode would lose
millisecond timestamps, integer widths and doubles) after pamqp checked that they decode.
"""

from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass

from pamqp import base, commands, exceptions
from pamqp import frame as pframe

from proxy.amqp.codes import FRAME_ERROR, NOT_IMPLEMENTED, SYNTAX_ERROR, AmqpError

METHOD, HEADER, BODY, HEARTBEAT = 1, 2, 3, 8
FRAME_END = 0xCE
PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_OVERHEAD = 8  # header (7) + end octet
_HEAD = struct.Struct(">BHI")
_CONTENT = struct.Struct(">HHQ")
_BASIC_CLASS = 60


@dataclass(frozen=True, slots=True)
class Frame:
    type: int
    channel: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class ContentHeader:
    class_id: int
    body_size: int
    properties: bytes  # flags and values, as sent


async def read_frame(reader: asyncio.StreamReader, frame_max: int) -> Frame:
    """The next frame; AmqpError FRAME_ERROR for one larger than `frame_max` or without its end octet."""
    head = await reader.readexactly(_HEAD.size)
    kind, channel, size = _HEAD.unpack(head)
    if size + FRAME_OVERHEAD > frame_max:
        raise AmqpError(
            FRAME_ERROR, f"frame of {size + FRAME_OVERHEAD} bytes is over the negotiated frame_max {frame_max}"
        )
    rest = await reader.readexactly(size + 1)
    if rest[-1] != FRAME_END:
        raise AmqpError(FRAME_ERROR, f"frame of type {kind} on channel {channel} does not end with 0xCE")
    return Frame(kind, channel, rest[:-1])


def decode_method(payload: bytes) -> base.Frame:
    if len(payload) < 4:
        raise AmqpError(SYNTAX_ERROR, "method frame shorter than its class and method ids")
    class_id, method_id = struct.unpack_from(">HH", payload)
    index = (class_id << 16) | method_id
    cls = commands.INDEX_MAPPING.get(index)
    if cls is None:
        raise AmqpError(NOT_IMPLEMENTED, f"unknown method {class_id}.{method_id}", (class_id, method_id))
    method = cls()
    try:
        method.unmarshal(payload[4:])
    except (struct.error, ValueError, TypeError, UnicodeDecodeError, KeyError, IndexError) as exc:
        raise AmqpError(SYNTAX_ERROR, f"malformed {method.name}: {exc}", (class_id, method_id)) from None
    return method


def decode_header(payload: bytes) -> ContentHeader:
    if len(payload) < _CONTENT.size + 2:
        raise AmqpError(FRAME_ERROR, "content header frame shorter than its fixed fields")
    class_id, _, body_size = _CONTENT.unpack_from(payload)
    properties = payload[_CONTENT.size :]
    try:  # decodable by pamqp (also reads the flags), then kept as sent
        pframe.unmarshal(_HEAD.pack(HEADER, 1, len(payload)) + payload + bytes((FRAME_END,)))
    except (exceptions.UnmarshalingException, struct.error, ValueError, TypeError, UnicodeDecodeError) as exc:
        raise AmqpError(SYNTAX_ERROR, f"malformed content header properties: {exc}") from None
    return ContentHeader(class_id, body_size, properties)


def method_bytes(channel: int, method: base.Frame) -> bytes:
    return pframe.marshal(method, channel)


def content_bytes(channel: int, properties: bytes, body: bytes, frame_max: int) -> bytes:
    """A content header (the stored property bytes, or none) and the body frames."""
    payload = _CONTENT.pack(_BASIC_CLASS, 0, len(body)) + (properties or b"\x00\x00")
    parts = [_HEAD.pack(HEADER, channel, len(payload)), payload, bytes((FRAME_END,))]
    step = frame_max - FRAME_OVERHEAD
    for start in range(0, len(body), step):
        chunk = body[start : start + step]
        parts += [_HEAD.pack(BODY, channel, len(chunk)), chunk, bytes((FRAME_END,))]
    return b"".join(parts)


HEARTBEAT_BYTES = _HEAD.pack(HEARTBEAT, 0, 0) + bytes((FRAME_END,))
