"""Byte layout of the message trace, RocksDB column family `trace` (pure codec, no I/O).

Every key starts with a kind byte and the event's time bucket (`time_ms // bucket_ms`), so that
retention deletes whole buckets with one range deletion per kind and a lookup seeks once per live
bucket. Integers are big-endian; strings are UTF-8 with a u16 length in front.

    sent, by message id:        b"m" | bucket u32 | id (u16 len + bytes) | time_ms u64 | seq u32
    position events:            b"p" | bucket u32 | topic (u16 len + bytes) | queue u32 | offset u64
                                     | time_ms u64 | seq u32
    tiered ranges:              b"t" | bucket u32 | topic (u16 len + bytes) | queue u32 | end u64 | seq u32

Position events (delivered, acked, invisible, dead_lettered) are keyed by where the message is
stored, not by its id: the pop engine knows positions, and resolving an id per ack would cost a
read. A lookup finds the positions through the `m` keys and the store's message-id index, then
scans the `p` keys of each position. A tiered range covers offsets [start, end) of a queue; its key
ends with `end`, so the first key after `offset + 1` is the range that may hold `offset`.

Values are compact JSON objects (format version in `v`): the event's fields.
"""

from __future__ import annotations

import json
import struct
from typing import Any

FORMAT_VERSION = 1
KIND_SENT = b"m"
KIND_POSITION = b"p"
KIND_TIERED = b"t"
KINDS = (KIND_SENT, KIND_POSITION, KIND_TIERED)

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_POS = struct.Struct(">IQ")  # queue, offset
_TAIL = struct.Struct(">QI")  # time_ms, seq
U32_MAX = 0xFFFFFFFF


def _text(value: str) -> bytes:
    raw = value.encode("utf-8")
    if len(raw) > 0xFFFF:
        raise ValueError("trace key text longer than 65535 bytes")
    return _U16.pack(len(raw)) + raw


def bucket_prefix(kind: bytes, bucket: int) -> bytes:
    return kind + _U32.pack(min(max(bucket, 0), U32_MAX))


def sent_prefix(bucket: int, message_id: str) -> bytes:
    return bucket_prefix(KIND_SENT, bucket) + _text(message_id)


def sent_key(bucket: int, message_id: str, time_ms: int, seq: int) -> bytes:
    return sent_prefix(bucket, message_id) + _TAIL.pack(time_ms, seq)


def position_prefix(bucket: int, topic: str, queue_id: int, offset: int) -> bytes:
    return bucket_prefix(KIND_POSITION, bucket) + _text(topic) + _POS.pack(queue_id, offset)


def position_key(bucket: int, topic: str, queue_id: int, offset: int, time_ms: int, seq: int) -> bytes:
    return position_prefix(bucket, topic, queue_id, offset) + _TAIL.pack(time_ms, seq)


def tiered_queue_prefix(bucket: int, topic: str, queue_id: int) -> bytes:
    return bucket_prefix(KIND_TIERED, bucket) + _text(topic) + _U32.pack(queue_id)


def tiered_key(bucket: int, topic: str, queue_id: int, end: int, seq: int) -> bytes:
    return tiered_queue_prefix(bucket, topic, queue_id) + _U64.pack(end) + _U32.pack(seq)


def tiered_end(key: bytes, queue_prefix: bytes) -> int:
    value: int = _U64.unpack_from(key, len(queue_prefix))[0]
    return value


def encode_value(fields: dict[str, Any]) -> bytes:
    return json.dumps({"v": FORMAT_VERSION, **fields}, separators=(",", ":")).encode()


def decode_value(raw: bytes) -> dict[str, Any]:
    doc = json.loads(raw)
    if not isinstance(doc, dict) or doc.get("v") != FORMAT_VERSION:
        raise ValueError("unknown trace value format")
    return doc
