"""CommitLog record codec (format version 1). Pure functions, no I/O.

Every record is self-describing and checked on decode. All integers are little-endian. All
lengths sit in the fixed header, so encoding is one `pack` and one `join`, and the three fields the
writer assigns are adjacent, so sealing is one `pack_into` plus the CRC.

| offset | size | field                    | meaning                                                   |
|--------|------|--------------------------|-----------------------------------------------------------|
| 0      | 4    | total_size (u32)         | bytes of the whole record, this field included            |
| 4      | 4    | magic (u32)              | 0x43554C53 (b"SLUC"): a record starts here                |
| 8      | 4    | crc32 (u32)              | zlib.crc32 of bytes [12, total_size)                      |
| 12     | 1    | version (u8)             | 1                                                         |
| 13     | 1    | message_type (u8)        | NORMAL 1, FIFO 2, DELAY 3, TRANSACTION 4                  |
| 14     | 2    | flags (u16)              | bit 0: body is gzip-compressed (as the producer sent it)  |
| 16     | 4    | queue_id (u32)           |                                                           |
| 20     | 8    | queue_offset (u64)       | assigned by the writer; strictly increasing per queue     |
| 28     | 8    | physical_offset (u64)    | assigned by the writer; this record's CommitLog position  |
| 36     | 8    | store_timestamp_ms (u64) | assigned by the writer                                    |
| 44     | 8    | born_timestamp_ms (u64)  | when the producer created the message                     |
| 52     | 8    | delivery_timestamp_ms    | u64; 0 = deliver at once (timer messages set it)          |
| 60     | 4    | delivery_attempt (u32)   | attempts already made when the record was written         |
| 64     | 4    | body_size (u32)          |                                                           |
| 68     | 2    | topic_size (u16)         |                                                           |
| 70     | 2    | message_id_size (u16)    |                                                           |
| 72     | 2    | tag_size (u16)           | 0 = no tag                                                |
| 74     | 2    | message_group_size (u16) | 0 = no message group                                      |
| 76     | 2    | born_host_size (u16)     |                                                           |
| 78     | 2    | store_host_size (u16)    |                                                           |
| 80     | 2    | key_count (u16)          |                                                           |
| 82     | 2    | property_count (u16)     | user properties                                           |
| 84     | 2    | system_property_count    | u16                                                       |
| 86     | ...  | variable part            | see below                                                 |

Variable part, in order, all text UTF-8: topic, message id, tag, message group, born host, store
host (sizes from the header); each key as u16 size + bytes; each user property and then each
system property as (u16 key size, key, u32 value size, value); finally the body.

The writer patches queue_offset, physical_offset, store_timestamp_ms and then the CRC into an
already encoded record (`seal`), so encoding happens on the caller's side, before offsets exist.
An append's records are encoded back to back into one buffer (`encode_batch`), which the writer
seals in place and hands to the kernel without copying it again.

The CRC is the standard CRC-32 (zlib's); ISA-L's implementation (package `isal`) computes the same
value ~4x faster on 1 KiB records, so it is used when installed, zlib's otherwise.
"""

from __future__ import annotations

import collections
import functools
import itertools
import operator
import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import accumulate, repeat
from operator import add
from typing import NamedTuple

try:  # same CRC-32 as zlib.crc32, SIMD-accelerated; the CRC is ~20% of a 1 KiB append's CPU with zlib
    from isal.isal_zlib import crc32
except ImportError:  # pragma: no cover - isal is a declared dependency; zlib gives identical values
    from zlib import crc32

from common.errors import BadRequest, MessageCorrupted
from common.model import require_field_order

MAGIC = 0x43554C53
VERSION = 1
FLAG_BODY_GZIP = 0x1

_HEADER = struct.Struct("<IIIBBHIQQQQQIIHHHHHHHHH")
HEADER_SIZE = _HEADER.size  # 86
_SEAL = struct.Struct("<QQQ")  # queue_offset, physical_offset, store_timestamp_ms at byte 20
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_PREFIX = struct.Struct("<II")  # total_size, magic
_drain: Callable[[Iterable[object]], None] = collections.deque[object](maxlen=0).extend  # consume an iterator in C
MAX_U16 = 0xFFFF

OFF_CRC = 8
OFF_SEAL = 20
CRC_START = 12


@dataclass(slots=True)
class MessageRecord:
    """A message as the CommitLog keeps it. The writer fills queue_offset, physical_offset, store time."""

    topic: str
    queue_id: int
    body: bytes
    message_id: str = ""
    tag: str | None = None
    keys: tuple[str, ...] = ()
    message_group: str | None = None
    properties: dict[str, str] = field(default_factory=dict)
    system_properties: dict[str, str] = field(default_factory=dict)
    message_type: int = 1
    flags: int = 0
    born_timestamp_ms: int = 0
    born_host: str = ""
    store_host: str = ""
    delivery_timestamp_ms: int = 0
    delivery_attempt: int = 0
    queue_offset: int = -1
    physical_offset: int = -1
    store_timestamp_ms: int = 0
    size: int = 0  # encoded size, known after encode/decode


# `_decode_checked` and tiering's `table_to_records` build records positionally, in this order.
RECORD_FIELDS = (
    "topic", "queue_id", "body", "message_id", "tag", "keys", "message_group", "properties", "system_properties",
    "message_type", "flags", "born_timestamp_ms", "born_host", "store_host", "delivery_timestamp_ms",
    "delivery_attempt", "queue_offset", "physical_offset", "store_timestamp_ms", "size",
)  # fmt: skip
require_field_order(MessageRecord, RECORD_FIELDS)


def _too_long(what: str, size: int) -> BadRequest:
    return BadRequest(f"{what} is too long ({size} bytes, at most {MAX_U16})")


def _pairs(out: list[bytes], mapping: dict[str, str], what: str) -> None:
    for k, v in mapping.items():
        kb = k.encode("utf-8")
        vb = v.encode("utf-8")
        if len(kb) > MAX_U16:
            raise _too_long(f"{what} key", len(kb))
        out.append(_U16.pack(len(kb)))
        out.append(kb)
        out.append(_U32.pack(len(vb)))
        out.append(vb)


def encode(rec: MessageRecord) -> bytearray:
    """Encode `rec` with its current offsets; the CRC is left 0 until `seal`."""
    topic = rec.topic.encode("utf-8")
    mid = rec.message_id.encode("utf-8")
    tag = rec.tag.encode("utf-8") if rec.tag else b""
    group = rec.message_group.encode("utf-8") if rec.message_group else b""
    born_host = rec.born_host.encode("utf-8")
    store_host = rec.store_host.encode("utf-8")
    texts = (topic, mid, tag, group, born_host, store_host)
    n_topic, n_mid, n_tag, n_group, n_bhost, n_shost = map(len, texts)
    if (n_topic | n_mid | n_tag | n_group | n_bhost | n_shost) > MAX_U16:
        raise _texts_too_long(texts)
    keys, props, sysprops = rec.keys, rec.properties, rec.system_properties
    if len(keys) > MAX_U16 or len(props) > MAX_U16 or len(sysprops) > MAX_U16:
        raise BadRequest(f"too many keys or properties (at most {MAX_U16} each)")
    body = rec.body
    tail = _tail(rec) if keys or props or sysprops else b""
    total = HEADER_SIZE + n_topic + n_mid + n_tag + n_group + n_bhost + n_shost + len(tail) + len(body)
    if total > 0xFFFFFFFF:
        raise BadRequest("message is too large to store")
    try:
        header = _HEADER.pack(
            total, MAGIC, 0, VERSION, rec.message_type, rec.flags, rec.queue_id,
            max(rec.queue_offset, 0), max(rec.physical_offset, 0), rec.store_timestamp_ms,
            rec.born_timestamp_ms, rec.delivery_timestamp_ms, rec.delivery_attempt, len(body),
            n_topic, n_mid, n_tag, n_group, n_bhost, n_shost, len(keys), len(props), len(sysprops),
        )  # fmt: skip
    except struct.error as exc:  # a number that does not fit its field (queue id, timestamp, ...)
        raise BadRequest(f"a message field is out of range: {exc}") from None
    rec.size = total
    return bytearray().join((header, topic, mid, tag, group, born_host, store_host, tail, body))


def _texts_too_long(texts: tuple[bytes, ...]) -> BadRequest:
    names = ("topic", "message id", "tag", "message group", "born host", "store host")
    name, size = max(zip(names, map(len, texts), strict=True), key=lambda p: p[1])
    return _too_long(name, size)


def _too_big(size: int, limit: int) -> BadRequest:
    return BadRequest(f"message of {size} bytes exceeds the store's record limit of {limit} bytes")


def _tail(rec: MessageRecord) -> bytes:
    """The keys and properties of the variable part (empty for most messages)."""
    extra: list[bytes] = []
    for key in rec.keys:
        kb = key.encode("utf-8")
        if len(kb) > MAX_U16:
            raise _too_long("message key", len(kb))
        extra.append(_U16.pack(len(kb)))
        extra.append(kb)
    _pairs(extra, rec.properties, "user property")
    _pairs(extra, rec.system_properties, "system property")
    return b"".join(extra)


def encode_one(rec: MessageRecord, max_record_bytes: int) -> bytearray:
    """`encode_batch` of a single record: `encode` has less set-up (the writer seals the offsets)."""
    if rec.queue_id < 0:
        raise BadRequest(f"queue id {rec.queue_id} is negative")
    buf = encode(rec)
    if len(buf) > max_record_bytes:
        raise _too_big(len(buf), max_record_bytes)
    return buf


def encode_batch(records: Sequence[MessageRecord], max_record_bytes: int) -> tuple[bytearray, list[int], bool]:
    """Encode `records` back to back into one buffer, for the writer to seal in place.

    Returns (buffer, size of each record, whether all records target one queue). The bytes of each
    record are exactly `encode(rec)` with queue offset, physical offset and store time left 0 (the
    writer's `seal` sets them); `rec.size` is set as `encode` does. Text fields that repeat from
    one record to the next (topic, hosts, as in a batched send) are encoded once.
    """
    if len(records) == 1:
        buf = encode_one(records[0], max_record_bytes)
        return buf, [len(buf)], True
    parts: list[bytes] = []
    add = parts.extend
    sizes: list[int] = []
    size_of = sizes.append
    pack = _HEADER.pack
    topic_s: str | None = None
    bhost_s: str | None = None
    shost_s: str | None = None
    topic = born_host = store_host = b""
    first = records[0]
    one_queue_topic, one_queue_id = first.topic, first.queue_id
    one_queue = True
    for rec in records:
        qid = rec.queue_id
        if qid < 0:
            raise BadRequest(f"queue id {qid} is negative")
        if rec.topic != topic_s:
            topic_s = rec.topic
            topic = topic_s.encode("utf-8")
        if one_queue and (qid != one_queue_id or topic_s != one_queue_topic):
            one_queue = False
        if rec.born_host != bhost_s:
            bhost_s = rec.born_host
            born_host = bhost_s.encode("utf-8")
        if rec.store_host != shost_s:
            shost_s = rec.store_host
            store_host = shost_s.encode("utf-8")
        mid = rec.message_id.encode("utf-8")
        tag = rec.tag.encode("utf-8") if rec.tag else b""
        group = rec.message_group.encode("utf-8") if rec.message_group else b""
        n_topic, n_mid, n_tag, n_group = len(topic), len(mid), len(tag), len(group)
        n_bhost, n_shost = len(born_host), len(store_host)
        if (n_topic | n_mid | n_tag | n_group | n_bhost | n_shost) > MAX_U16:
            raise _texts_too_long((topic, mid, tag, group, born_host, store_host))
        keys, props, sysprops = rec.keys, rec.properties, rec.system_properties
        if keys or props or sysprops:
            if len(keys) > MAX_U16 or len(props) > MAX_U16 or len(sysprops) > MAX_U16:
                raise BadRequest(f"too many keys or properties (at most {MAX_U16} each)")
            tail = _tail(rec)
        else:
            tail = b""
        body = rec.body
        total = HEADER_SIZE + n_topic + n_mid + n_tag + n_group + n_bhost + n_shost + len(tail) + len(body)
        if total > max_record_bytes:
            raise _too_big(total, max_record_bytes)
        try:
            header = pack(
                total, MAGIC, 0, VERSION, rec.message_type, rec.flags, qid, 0, 0, 0,
                rec.born_timestamp_ms, rec.delivery_timestamp_ms, rec.delivery_attempt, len(body),
                n_topic, n_mid, n_tag, n_group, n_bhost, n_shost, len(keys), len(props), len(sysprops),
            )  # fmt: skip
        except struct.error as exc:  # a number that does not fit its field (queue id, timestamp, ...)
            raise BadRequest(f"a message field is out of range: {exc}") from None
        rec.size = total
        size_of(total)
        add((header, topic, mid, tag, group, born_host, store_host, tail, body))
    return bytearray().join(parts), sizes, one_queue


class EncodedBatch(NamedTuple):
    """`encode_columns`' result: the buffer and per-record sizes, plus what the store's index needs
    (computed on the way, so the caller does not walk the records again)."""

    buf: bytearray
    sizes: list[int]
    one_queue: bool  # every record targets one (topic, queue id)
    message_ids: list[bytes]  # UTF-8
    queue_ids: list[int]
    uniform: bool  # one topic, tag and host pair for all records (the vector path encoded them)


_SHARED_FIELDS = ("topic", "born_host", "store_host", "tag", "message_group")  # alike in a uniform batch
_SHARED = operator.attrgetter(*_SHARED_FIELDS)
_GET_ID, _GET_BODY, _GET_QID, _GET_TYPE, _GET_FLAGS, _GET_BORN, _GET_DELIVER, _GET_ATTEMPT = (
    operator.attrgetter(f)
    for f in ("message_id", "body", "queue_id", "message_type", "flags", "born_timestamp_ms",
              "delivery_timestamp_ms", "delivery_attempt")
)  # fmt: skip
_GET_KEYS, _GET_PROPS, _GET_SYSPROPS = (operator.attrgetter(f) for f in ("keys", "properties", "system_properties"))
_TEXT_SIZES = struct.Struct("<HHHHHH")  # topic, id, tag, group, born host, store host (header offset 68)
_ZERO_COUNTS = b"\0" * 6  # key, property and system property counts of a record without them
_VECTOR_MIN = 4  # below this many records the per-record loop is cheaper than setting up the maps


@functools.lru_cache(maxsize=256)
def _uniform_layout(lead: int, id_size: int, trail: int) -> struct.Struct:
    """The header and texts of a record of a uniform batch as one struct.

    Fields: total size, magic, (crc: 0), version, type, flags, queue id, (the writer's 24 bytes: 0),
    born, delivery, attempt, body size, then the six text sizes (12 bytes), the key, property and
    system property counts, the topic (`lead` - 12 bytes), the message id, and `trail` bytes (tag,
    group, born host, store host). Same bytes as `_HEADER.pack` + the texts of `encode`.
    """
    return struct.Struct(f"<II4xBBHI24xQQII12sHHH{lead - 12}s{id_size}s{trail}s")


_PLAIN_FIELDS = ("message_type", "flags", "delivery_timestamp_ms", "delivery_attempt")
_SHARED_PLAIN = operator.attrgetter(*_SHARED_FIELDS, *_PLAIN_FIELDS)
_MIDDLE = struct.Struct("<IIBBH")  # magic, crc (0), version, type, flags: header bytes [4, 16)
_AFTER_BORN = struct.Struct("<QI")  # delivery timestamp, attempt: header bytes [52, 64)


@functools.lru_cache(maxsize=256)
def _plain_layout(lead: int, id_size: int, trail: int) -> struct.Struct:
    """`_uniform_layout` for records whose type, flags, delivery time and attempt are alike: those
    are packed once per batch (`_MIDDLE`, `_AFTER_BORN`) and passed as bytes. Fields: total size,
    header bytes [4, 16), queue id, (the writer's 24 bytes: 0), born, header bytes [52, 64), body
    size, then `lead` bytes (the six text sizes, three zero counts and the topic: no keys or
    properties), the message id and `trail` bytes as in `_uniform_layout`."""
    return struct.Struct(f"<I12sI24xQ12sI{lead}s{id_size}s{trail}s")


def _tail_of(rec: MessageRecord) -> bytes:
    return _tail(rec) if rec.keys or rec.properties or rec.system_properties else b""


def _tails(records: Sequence[MessageRecord]) -> list[bytes]:
    """`_tail_of` of each record. Records with as many user properties each and no keys or system
    properties (a batched send) get theirs from C-level maps over all pairs, cut into one tail per
    record; anything else (or a key too long, which `_tail` names) record by record."""
    props = list(map(_GET_PROPS, records))
    counts = set(map(len, props))
    if len(counts) != 1 or any(map(_GET_KEYS, records)) or any(map(_GET_SYSPROPS, records)):
        return list(map(_tail_of, records))
    (count,) = counts
    names = list(map(str.encode, itertools.chain.from_iterable(props)))
    if not names or max(map(len, names)) > MAX_U16:
        return list(map(_tail_of, records))
    values = list(map(str.encode, itertools.chain.from_iterable(map(dict.values, props))))
    parts = itertools.chain.from_iterable(
        zip(map(_U16.pack, map(len, names)), names, map(_U32.pack, map(len, values)), values, strict=True)
    )
    return list(map(b"".join, zip(*[parts] * (4 * count), strict=True)))


def encode_columns(records: Sequence[MessageRecord], max_record_bytes: int) -> EncodedBatch:
    """`encode_batch`, returning what the index needs too. Unlike `encode_batch` it does not promise
    to set `rec.size` (the sizes are returned; writing to every record costs a cache miss each).

    A batch whose records share topic, tag, message group and hosts and whose message ids have one
    length (a batched send) is encoded with one precompiled struct per batch in C-level `map`s: no
    Python bytecode per record. Anything else, or anything the vector path cannot check cheaply
    (a too-long text, a number out of range), goes through the per-record loop of `encode_batch`,
    which raises the precise error. Both write the same bytes (tests/unit/test_record_batch.py).
    """
    if len(records) >= _VECTOR_MIN:
        done = _encode_uniform(records, max_record_bytes)
        if done is not None:
            return done
    buf, sizes, one_queue = encode_batch(records, max_record_bytes)
    mids = list(map(str.encode, map(_GET_ID, records)))
    return EncodedBatch(buf, sizes, one_queue, mids, list(map(_GET_QID, records)), False)


def _encode_uniform(records: Sequence[MessageRecord], max_record_bytes: int) -> EncodedBatch | None:
    n = len(records)
    # One pass for the texts every record must share and the fields a plain batch shares too (the
    # usual batch shares both); a second only when the latter differ.
    alike = _SHARED_PLAIN(records[0])
    plain_alike = list(map(_SHARED_PLAIN, records)).count(alike) == n
    shared = len(_SHARED_FIELDS)
    if not plain_alike and list(map(_SHARED, records)).count(alike[:shared]) != n:
        return None
    topic_s, bhost_s, shost_s, tag_s, group_s = alike[:shared]
    mids = list(map(str.encode, map(_GET_ID, records)))
    id_size = len(mids[0])
    if list(map(len, mids)).count(id_size) != n:
        return None
    qids = list(map(_GET_QID, records))
    if min(qids) < 0:
        return None
    topic, bhost, shost = topic_s.encode("utf-8"), bhost_s.encode("utf-8"), shost_s.encode("utf-8")
    tag = tag_s.encode("utf-8") if tag_s else b""
    group = group_s.encode("utf-8") if group_s else b""
    if max(len(topic), id_size, len(tag), len(group), len(bhost), len(shost)) > MAX_U16:
        return None
    sizes6 = _TEXT_SIZES.pack(len(topic), id_size, len(tag), len(group), len(bhost), len(shost))
    trail = b"".join((tag, group, bhost, shost))
    bodies = list(map(_GET_BODY, records))
    body_sizes = list(map(len, bodies))
    fixed = HEADER_SIZE + len(topic) + id_size + len(trail)
    extras = any(map(_GET_KEYS, records)) or any(map(_GET_PROPS, records)) or any(map(_GET_SYSPROPS, records))
    plain = None if extras or not plain_alike else alike[shared:]
    try:
        if plain is not None:
            # The usual batch: no keys or properties, and type, flags, delivery time and attempt
            # alike, so those join the constant bytes (fewer arguments per record).
            totals = list(map(add, body_sizes, repeat(fixed)))
            lead = sizes6 + _ZERO_COUNTS + topic
            mtype, flags, deliver, attempt = plain
            layout = _plain_layout(len(lead), id_size, len(trail))
            heads = list(map(layout.pack, totals, repeat(_MIDDLE.pack(MAGIC, 0, VERSION, mtype, flags)), qids,
                        map(_GET_BORN, records), repeat(_AFTER_BORN.pack(deliver, attempt)), body_sizes,
                        repeat(lead), mids, repeat(trail)))  # fmt: skip
            # Heads and bodies interleaved by slice assignment: no tuple per record (as zip makes).
            parts = [b""] * (2 * n)
            parts[::2] = heads
            parts[1::2] = bodies
        else:
            tails = _tails(records)  # raises the precise error for a too-long key
            totals = list(map(add, map(add, body_sizes, map(len, tails)), repeat(fixed)))
            layout = _uniform_layout(12 + len(topic), id_size, len(trail))
            kcs, pcs, scs = (map(len, map(g, records)) for g in (_GET_KEYS, _GET_PROPS, _GET_SYSPROPS))
            heads = list(map(layout.pack, totals, repeat(MAGIC), repeat(VERSION), map(_GET_TYPE, records),
                        map(_GET_FLAGS, records), qids, map(_GET_BORN, records), map(_GET_DELIVER, records),
                        map(_GET_ATTEMPT, records), body_sizes, repeat(sizes6), kcs, pcs, scs, repeat(topic), mids,
                        repeat(trail)))  # fmt: skip
            parts = [b""] * (3 * n)
            parts[::3] = heads
            parts[1::3] = tails
            parts[2::3] = bodies
        if max(totals) > max_record_bytes:
            return None
        buf = bytearray().join(parts)
    except struct.error:  # a number out of range, or more than 65535 keys: the loop names it
        return None
    return EncodedBatch(buf, totals, qids.count(qids[0]) == n, mids, qids, True)


def seal_at(buf: bytearray, view: memoryview, start: int, size: int, queue_offset: int, physical_offset: int,
            store_timestamp_ms: int) -> None:  # fmt: skip
    """`seal` for the record at `start` of a batch buffer (`view` is a memoryview of `buf`)."""
    _SEAL.pack_into(buf, start + OFF_SEAL, queue_offset, physical_offset, store_timestamp_ms)
    _U32.pack_into(buf, start + OFF_CRC, crc32(view[start + CRC_START : start + size]))


def seal_run(buf: bytearray, view: memoryview, start: int, sizes: list[int], first_queue_offset: int,
             physical_offsets: list[int], store_timestamp_ms: int) -> None:  # fmt: skip
    """`seal` every record of a batch buffer that goes to one queue, with consecutive queue offsets:
    the records sit back to back from byte `start` of `buf` (`view` is a memoryview of it).

    The same bytes as `seal_at` per record, but the per-record calls run inside C-level `map`s
    (field positions by `accumulate`): this is the writer's hot loop, and Python bytecode per record
    is what it costs.
    """
    head = sizes[:-1]  # record i starts at start + sum(sizes[:i])
    _drain(map(_SEAL.pack_into, repeat(buf), accumulate(head, initial=start + OFF_SEAL),
               itertools.count(first_queue_offset), physical_offsets, repeat(store_timestamp_ms)))  # fmt: skip
    ends = accumulate(sizes, initial=start)
    next(ends)  # record i ends where record i + 1 starts
    bounds = map(slice, accumulate(head, initial=start + CRC_START), ends)
    crcs = map(crc32, map(view.__getitem__, bounds))
    _drain(map(_U32.pack_into, repeat(buf), accumulate(head, initial=start + OFF_CRC), crcs))


def seal(buf: bytearray, queue_offset: int, physical_offset: int, store_timestamp_ms: int) -> None:
    """Write the offsets the writer assigned and the CRC into an encoded record, in place."""
    _SEAL.pack_into(buf, OFF_SEAL, queue_offset, physical_offset, store_timestamp_ms)
    _U32.pack_into(buf, OFF_CRC, crc32(memoryview(buf)[CRC_START:]))


def peek_size(buf: bytes | bytearray | memoryview, pos: int = 0) -> tuple[int, int]:
    """(total_size, magic) of the record starting at `pos`; the caller checks there are 8 bytes."""
    return _PREFIX.unpack_from(buf, pos)


def decode(buf: bytes | bytearray | memoryview, pos: int = 0, *, where: str = "") -> MessageRecord:
    """Decode and verify the record at `pos`. Raises MessageCorrupted naming `where` on any mismatch."""
    view = memoryview(buf)
    avail = len(view) - pos
    if avail < HEADER_SIZE:
        raise MessageCorrupted(f"record at {where or pos} is truncated ({avail} bytes, header needs {HEADER_SIZE})")
    h = _HEADER.unpack_from(view, pos)
    total, magic, crc, version = h[0], h[1], h[2], h[3]
    if magic != MAGIC:
        raise MessageCorrupted(f"record at {where or pos} has bad magic 0x{magic:08x}")
    if total < HEADER_SIZE or total > avail:
        raise MessageCorrupted(f"record at {where or pos} declares size {total} but {avail} bytes are available")
    if version != VERSION:
        raise MessageCorrupted(f"record at {where or pos} has unknown format version {version}")
    rec_view = view[pos : pos + total]
    actual = crc32(rec_view[CRC_START:])
    if actual != crc:
        raise MessageCorrupted(
            f"record at {where or pos} failed its CRC check (stored {crc:08x}, computed {actual:08x})"
        )
    try:
        return _decode_checked(rec_view, h)
    except (struct.error, UnicodeDecodeError, IndexError, ValueError) as exc:
        raise MessageCorrupted(f"record at {where or pos} has a malformed body: {exc}") from None


def _decode_checked(v: memoryview, h: tuple[int, ...]) -> MessageRecord:
    (total, _m, _c, _v, mtype, flags, qid, qoff, phys, stored, born, deliver, attempt, body_size,
     n_topic, n_mid, n_tag, n_group, n_bhost, n_shost, n_keys, n_props, n_sys) = h  # fmt: skip
    raw = v.tobytes()
    # The six names back to back, sliced directly (once per message read: no loop, no list).
    p = HEADER_SIZE
    e_topic = p + n_topic
    e_mid = e_topic + n_mid
    e_tag = e_mid + n_tag
    e_group = e_tag + n_group
    e_bhost = e_group + n_bhost
    e_shost = e_bhost + n_shost
    texts = (
        raw[p:e_topic].decode("utf-8"), raw[e_topic:e_mid].decode("utf-8"), raw[e_mid:e_tag].decode("utf-8"),
        raw[e_tag:e_group].decode("utf-8"), raw[e_group:e_bhost].decode("utf-8"),
        raw[e_bhost:e_shost].decode("utf-8"),
    )  # fmt: skip
    p = e_shost
    keys: list[str] = []
    for _ in range(n_keys):
        (n,) = _U16.unpack_from(raw, p)
        keys.append(raw[p + 2 : p + 2 + n].decode("utf-8"))
        p += 2 + n
    props, p = _read_map(raw, p, n_props) if n_props else ({}, p)
    sysprops, p = _read_map(raw, p, n_sys) if n_sys else ({}, p)
    if p + body_size != total:
        raise ValueError(f"body of {body_size} bytes does not end the record (ends at {p + body_size}, size {total})")
    # Positional (see RECORD_FIELDS): keywords cost a microsecond more per message read.
    return MessageRecord(
        texts[0], qid, raw[p:], texts[1], texts[2] or None, tuple(keys), texts[3] or None, props, sysprops, mtype,
        flags, born, texts[4], texts[5], deliver, attempt, qoff, phys, stored, total,
    )  # fmt: skip


def _read_map(raw: bytes, p: int, count: int) -> tuple[dict[str, str], int]:
    """`count` (u16 size, key, u32 size, value) pairs from `p`: the map, and where they end."""
    m: dict[str, str] = {}
    for _ in range(count):
        (kn,) = _U16.unpack_from(raw, p)
        k = raw[p + 2 : p + 2 + kn].decode("utf-8")
        p += 2 + kn
        (vn,) = _U32.unpack_from(raw, p)
        m[k] = raw[p + 4 : p + 4 + vn].decode("utf-8")
        p += 4 + vn
    return m, p
