"""Byte layout of the message trace, RocksDB column family `trace` (pure codec, no I/O).

Every key starts with a kind byte and the event's time bucket (`time_ms // bucket_ms`), so that
retention deletes whole buckets with one range deletion per kind and a lookup seeks once per live
bucket. Integers are big-endian; strings are UTF-8 with a u16 length in front.

    sent batches:               b"s" | bucket u32 | topic (u16 len + bytes) | queue u32 | end u64 | seq u32
    sent appends:               b"a" | bucket u32 | topic (u16 len + bytes) | end position u64 | seq u32
    position events:            b"p" | bucket u32 | topic (u16 len + bytes) | queue u32 | offset u64
                                     | time_ms u64 | seq u32
    tiered ranges:              b"t" | bucket u32 | topic (u16 len + bytes) | queue u32 | end u64 | seq u32

Everything is keyed by where messages are stored, not by their ids: the pop engine and acks know
positions (resolving an id per ack would cost a read), and a send is recorded once per append,
as the offset range [start, end) it took in its queue (the producer's client id and host), so the
produce path pays one event per request, not per message. A lookup finds a message's positions
through the store's message-id index, then scans the `p` keys of each position and seeks the `s`
and `t` ranges: a range key ends with `end`, so the first key after `offset + 1` is the range
that may hold `offset`. An append whose messages go to queues of their own (a lite topic's
messages, one per lite topic; a priority topic's, one per level) is one `a` event keyed by the
CommitLog range it took (an append's records are contiguous): the lookup, which knows the
message's position from the message-id index, seeks it the same way.

Values come in two encodings, told apart by their first byte:

    compact (deliveries and acks), first byte 0x02:
        version u8 = 2 | kind u8 (1 delivered, 2 acked, 3 sent) | attempt u32 | text (UTF-8, the rest):
        the group; for a send, the producer's client id, 0x00, its host
    JSON (every other event), first byte `{`: an object with `"v": 1` and the event's fields.

The compact form keeps the consume path cheap: one struct pack per event instead of a JSON dump.
Compact `sent` position events (one per message of a lite or priority send) are what stores
written before `a` events hold; they are still read. One event per append instead: those were a
RocksDB entry per message at a random place of the memtable, which cost a lite send more than the
message's own ConsumeQueue entry.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable, Iterator
from itertools import repeat
from typing import Any

FORMAT_VERSION = 1
KIND_SENT = b"s"
KIND_POSITION = b"p"
KIND_TIERED = b"t"
KIND_APPEND = b"a"
KINDS = (KIND_SENT, KIND_POSITION, KIND_TIERED, KIND_APPEND)

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_POS = struct.Struct(">IQ")  # queue, offset
_TAIL = struct.Struct(">QI")  # time_ms, seq
_POS_TAIL = struct.Struct(">IQQI")  # queue, offset, time_ms, seq
_COMPACT = struct.Struct(">BBI")  # version, kind, attempt
COMPACT_VERSION = 2
COMPACT_KINDS = {"delivered": 1, "acked": 2, "sent": 3}
_SENT_CODE = COMPACT_KINDS["sent"]
_COMPACT_NAMES = {code: name for name, code in COMPACT_KINDS.items()}
U32_MAX = 0xFFFFFFFF


def _text(value: str) -> bytes:
    raw = value.encode("utf-8")
    if len(raw) > 0xFFFF:
        raise ValueError("trace key text longer than 65535 bytes")
    return _U16.pack(len(raw)) + raw


def bucket_prefix(kind: bytes, bucket: int) -> bytes:
    return kind + _U32.pack(min(max(bucket, 0), U32_MAX))


def range_queue_prefix(kind: bytes, bucket: int, topic: str, queue_id: int) -> bytes:
    return bucket_prefix(kind, bucket) + _text(topic) + _U32.pack(queue_id)


def range_key(kind: bytes, bucket: int, topic: str, queue_id: int, end: int, seq: int) -> bytes:
    return range_queue_prefix(kind, bucket, topic, queue_id) + _U64.pack(end) + _U32.pack(seq)


def append_prefix(bucket: int, topic: str) -> bytes:
    return bucket_prefix(KIND_APPEND, bucket) + _text(topic)


def append_key(bucket: int, topic: str, end: int, seq: int) -> bytes:
    """The key of an append's `sent` event: `end` is where its records end in the CommitLog."""
    return append_prefix(bucket, topic) + _U64.pack(end) + _U32.pack(seq)


def range_seek(queue_prefix: bytes, offset: int) -> bytes:
    """Where the first range whose end is past `offset` starts."""
    return queue_prefix + _U64.pack(offset + 1)


def position_prefix(bucket: int, topic: str, queue_id: int, offset: int) -> bytes:
    return bucket_prefix(KIND_POSITION, bucket) + _text(topic) + _POS.pack(queue_id, offset)


def position_key(bucket: int, topic: str, queue_id: int, offset: int, time_ms: int, seq: int) -> bytes:
    return topic_prefix(bucket, topic) + _POS_TAIL.pack(queue_id, offset, time_ms, seq)


def topic_prefix(bucket: int, topic: str) -> bytes:
    """The part of a position key before the queue (callers cache it per bucket and topic)."""
    return bucket_prefix(KIND_POSITION, bucket) + _text(topic)


def position_keys_after(
    prefix: bytes, queue_ids: Iterable[int], offsets: Iterable[int], time_ms: int, seqs: Iterable[int]
) -> Iterator[bytes]:
    """The position keys of a run of events of one time, below `prefix` (`topic_prefix`): one per
    (queue, offset, seq)."""
    return map(prefix.__add__, map(_POS_TAIL.pack, queue_ids, offsets, repeat(time_ms), seqs))


def position_time(key: bytes) -> int:
    """The time_ms of a position key (its last 12 bytes are time_ms u64 | seq u32)."""
    value: int = _TAIL.unpack_from(key, len(key) - _TAIL.size)[0]
    return value


def encode_compact(kind: str, attempt: int, group: bytes) -> bytes:
    return _COMPACT.pack(COMPACT_VERSION, COMPACT_KINDS[kind], attempt) + group


def encode_value(fields: dict[str, Any]) -> bytes:
    return json.dumps({"v": FORMAT_VERSION, **fields}, separators=(",", ":")).encode()


def decode_value(raw: bytes, time_ms: int = 0) -> dict[str, Any]:
    """The event's fields; a compact value takes its time from the key (`time_ms`)."""
    if raw[:1] == bytes((COMPACT_VERSION,)):
        _, code, attempt = _COMPACT.unpack_from(raw)
        kind = _COMPACT_NAMES.get(code)
        if kind is None:
            raise ValueError(f"unknown compact trace event kind {code}")
        text = raw[_COMPACT.size :].decode("utf-8")
        if code == _SENT_CODE:
            client, _, host = text.partition("\0")
            return {"k": kind, "t": time_ms, "client": client, "host": host}
        return {"k": kind, "t": time_ms, "attempt": attempt, "group": text}
    doc = json.loads(raw)
    if not isinstance(doc, dict) or doc.get("v") != FORMAT_VERSION:
        raise ValueError("unknown trace value format")
    return doc
