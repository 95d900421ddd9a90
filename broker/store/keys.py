"""RocksDB key and value layouts of the store's indexes. Pure functions, no I/O.

Keys are big-endian so that RocksDB's byte order is numeric order; values are little-endian.
Topics are interned to a u32 `topic_id` (column family `meta`) to keep keys short: a million
queues cost a million 16-byte ConsumeQueue keys, not a million files.

Column families (key -> value):

- `cq`: topic_id u32, queue_id u32, first queue_offset u64
  -> a block of N >= 1 entries for offsets first .. first+N-1, each
  physical_offset u64, size u32, tag_hash u32, store_timestamp_ms u64 (24 bytes; N = len // 24).
  The dispatcher writes one block per queue, segment and round (at most `CQ_BLOCK_MAX` entries)
  instead of one key per message: half the RocksDB puts of an append. A block never spans two
  CommitLog segments (retention range-deletes a segment's offsets) and blocks of a queue never
  overlap. A one-entry block is byte for byte the one-key-per-message layout stores had before.
- `msgid`: segment_base u64, id length u8, message id, physical_offset u64 -> size u32
- `keyidx`: segment_base u64, topic_id u32, key length u16, key, physical_offset u64 -> size u32
- `segq`: segment_base u64, topic_id u32, queue_id u32 -> a queue_offset of the queue in that
  segment u64: the queue has records there. The dispatcher puts it when the queue first appears in
  the segment (per process: it remembers the keys it put), not with every round, which cost a lite
  send a random memtable insert per message; readers find the highest offset there from it with
  `Index.segment_queue_max`. Stores written before hold the highest offset, which is as good.
- `offsets`: group length u16, group, topic_id u32, queue_id u32 -> committed consumer offset u64
- `meta`: b"checkpoint" -> dispatch position u64 (the next CommitLog byte to dispatch);
  b"t:" + topic name -> topic_id u32; b"i:" + topic_id u32 -> topic name;
  b"q:" + topic_id u32 + queue_id u32 -> queue floor u64 (the queue's min offset after retention
  or a deletion removed entries; it keeps a queue's offsets going when they emptied it);
  b"f:" + topic_id u32 + queue_id u32 -> the first offset of the queue's current incarnation u64
  (where it ended when the topic was last deleted); b"d:" + topic name -> the CommitLog position
  of the topic's last deletion record u64 (deletion.py)

The message-id and key indexes are prefixed by the CommitLog segment that holds the record, so
retention drops a segment's entries with one range delete per column family; a lookup probes each
live segment (there are few: segments are large).
"""

from __future__ import annotations

import functools
import struct

CF_CQ = "cq"
CF_MSGID = "msgid"
CF_KEYIDX = "keyidx"
CF_SEGQ = "segq"
CF_OFFSETS = "offsets"
CF_META = "meta"
STORE_CFS = (CF_CQ, CF_MSGID, CF_KEYIDX, CF_SEGQ, CF_OFFSETS, CF_META)

META_CHECKPOINT = b"checkpoint"
META_TOPIC_PREFIX = b"t:"
META_TOPIC_ID_PREFIX = b"i:"
META_QUEUE_FLOOR_PREFIX = b"q:"
META_INCARNATION_PREFIX = b"f:"
META_DELETED_PREFIX = b"d:"

CQ_KEY = struct.Struct(">IIQ")
_QUEUE_PREFIX = struct.Struct(">II")
CQ_VALUE = struct.Struct("<QIIQ")  # one entry of a ConsumeQueue block
CQ_ENTRY = CQ_VALUE.size
# Entries per ConsumeQueue block. Big enough that a round's share of a busy queue (~175 records in
# store_bench's batch32 phase) is one put, small enough (6 KiB) that reading one entry stays cheap.
CQ_BLOCK_MAX = 256
_U64BE = struct.Struct(">Q")
U32BE = struct.Struct(">I")
U16BE = struct.Struct(">H")
U64 = struct.Struct("<Q")
U32 = struct.Struct("<I")
SEGQ_KEY = struct.Struct(">QII")
MAX_U64 = (1 << 64) - 1


def cq_key(topic_id: int, queue_id: int, queue_offset: int) -> bytes:
    return CQ_KEY.pack(topic_id, queue_id, queue_offset)


def cq_key_parse(key: bytes) -> tuple[int, int, int]:
    return CQ_KEY.unpack(key)


def cq_block_end(key: bytes, value: bytes) -> int:
    """One past the last queue offset a ConsumeQueue block holds."""
    return int(CQ_KEY.unpack(key)[2]) + len(value) // CQ_ENTRY


def queue_prefix(topic_id: int, queue_id: int) -> bytes:
    return _QUEUE_PREFIX.pack(topic_id, queue_id)


def cq_value(physical_offset: int, size: int, tag_hash: int, store_timestamp_ms: int) -> bytes:
    return CQ_VALUE.pack(physical_offset, size, tag_hash, store_timestamp_ms)


def segment_prefix(segment_base: int) -> bytes:
    return _U64BE.pack(segment_base)


def msgid_prefix(segment_base: int, message_id: bytes) -> bytes:
    return _U64BE.pack(segment_base) + bytes((len(message_id),)) + message_id


def msgid_key(segment_base: int, message_id: bytes, physical_offset: int) -> bytes:
    return b"".join((_U64BE.pack(segment_base), bytes((len(message_id),)), message_id, _U64BE.pack(physical_offset)))


def keyidx_prefix(segment_base: int, topic_id: int, key: bytes) -> bytes:
    return _U64BE.pack(segment_base) + U32BE.pack(topic_id) + struct.pack(">H", len(key)) + key


def keyidx_key(segment_base: int, topic_id: int, key: bytes, physical_offset: int) -> bytes:
    return keyidx_prefix(segment_base, topic_id, key) + _U64BE.pack(physical_offset)


def trailing_offset(key: bytes) -> int:
    """The physical offset that ends msgid and keyidx keys."""
    return int(_U64BE.unpack_from(key, len(key) - 8)[0])


def segq_key(segment_base: int, topic_id: int, queue_id: int) -> bytes:
    return SEGQ_KEY.pack(segment_base, topic_id, queue_id)


def segq_key_parse(key: bytes) -> tuple[int, int, int]:
    return SEGQ_KEY.unpack(key)


def offsets_key(group: str, topic_id: int, queue_id: int) -> bytes:
    g = group.encode("utf-8")
    return struct.pack(">H", len(g)) + g + _QUEUE_PREFIX.pack(topic_id, queue_id)


def offsets_group_prefix(group: str) -> bytes:
    g = group.encode("utf-8")
    return struct.pack(">H", len(g)) + g


def topic_name_key(name: str) -> bytes:
    return META_TOPIC_PREFIX + name.encode("utf-8")


def topic_id_key(topic_id: int) -> bytes:
    return META_TOPIC_ID_PREFIX + U32BE.pack(topic_id)


def queue_floor_key(topic_id: int, queue_id: int) -> bytes:
    return META_QUEUE_FLOOR_PREFIX + _QUEUE_PREFIX.pack(topic_id, queue_id)


def queue_floor_prefix(topic_id: int) -> bytes:
    return META_QUEUE_FLOOR_PREFIX + U32BE.pack(topic_id)


def incarnation_key(topic_id: int, queue_id: int) -> bytes:
    return META_INCARNATION_PREFIX + _QUEUE_PREFIX.pack(topic_id, queue_id)


def incarnation_prefix(topic_id: int) -> bytes:
    return META_INCARNATION_PREFIX + U32BE.pack(topic_id)


def deleted_key(name: str) -> bytes:
    return META_DELETED_PREFIX + name.encode("utf-8")


def next_prefix(prefix: bytes) -> bytes:
    """The smallest key greater than every key starting with `prefix` (exclusive range end)."""
    b = bytearray(prefix)
    while b:
        if b[-1] != 0xFF:
            b[-1] += 1
            return bytes(b)
        b.pop()
    raise ValueError("no key follows an all-0xFF prefix")


def queue_prefix_parse(raw: bytes) -> tuple[int, int]:
    return _QUEUE_PREFIX.unpack(raw)


@functools.lru_cache(maxsize=256)
def msgid_key_struct(id_length: int) -> struct.Struct:
    """A precompiled layout of `msgid_key` for ids of one length: `.pack(segment_base, id_length,
    message_id, physical_offset)` gives the same bytes in one call (the dispatcher's hot path)."""
    return struct.Struct(f">QB{id_length}sQ")
