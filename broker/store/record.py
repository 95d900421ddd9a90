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
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field

from common.errors import BadRequest, MessageCorrupted

MAGIC = 0x43554C53
VERSION = 1
FLAG_BODY_GZIP = 0x1

_HEADER = struct.Struct("<IIIBBHIQQQQQIIHHHHHHHHH")
HEADER_SIZE = _HEADER.size  # 86
_SEAL = struct.Struct("<QQQ")  # queue_offset, physical_offset, store_timestamp_ms at byte 20
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_PREFIX = struct.Struct("<II")  # total_size, magic
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
        names = ("topic", "message id", "tag", "message group", "born host", "store host")
        name, size = max(zip(names, map(len, texts), strict=True), key=lambda p: p[1])
        raise _too_long(name, size)
    keys, props, sysprops = rec.keys, rec.properties, rec.system_properties
    if len(keys) > MAX_U16 or len(props) > MAX_U16 or len(sysprops) > MAX_U16:
        raise BadRequest(f"too many keys or properties (at most {MAX_U16} each)")
    body = rec.body
    if keys or props or sysprops:
        extra: list[bytes] = []
        for key in keys:
            kb = key.encode("utf-8")
            if len(kb) > MAX_U16:
                raise _too_long("message key", len(kb))
            extra.append(_U16.pack(len(kb)))
            extra.append(kb)
        _pairs(extra, props, "user property")
        _pairs(extra, sysprops, "system property")
        tail = b"".join(extra)
    else:
        tail = b""
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


def seal(buf: bytearray, queue_offset: int, physical_offset: int, store_timestamp_ms: int) -> None:
    """Write the offsets the writer assigned and the CRC into an encoded record, in place."""
    _SEAL.pack_into(buf, OFF_SEAL, queue_offset, physical_offset, store_timestamp_ms)
    _U32.pack_into(buf, OFF_CRC, zlib.crc32(memoryview(buf)[CRC_START:]))


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
    actual = zlib.crc32(rec_view[CRC_START:])
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
    p = HEADER_SIZE
    texts = []
    for n in (n_topic, n_mid, n_tag, n_group, n_bhost, n_shost):
        texts.append(raw[p : p + n].decode("utf-8"))
        p += n
    keys: list[str] = []
    for _ in range(n_keys):
        (n,) = _U16.unpack_from(raw, p)
        keys.append(raw[p + 2 : p + 2 + n].decode("utf-8"))
        p += 2 + n
    maps: list[dict[str, str]] = []
    for count in (n_props, n_sys):
        m: dict[str, str] = {}
        for _ in range(count):
            (kn,) = _U16.unpack_from(raw, p)
            k = raw[p + 2 : p + 2 + kn].decode("utf-8")
            p += 2 + kn
            (vn,) = _U32.unpack_from(raw, p)
            m[k] = raw[p + 4 : p + 4 + vn].decode("utf-8")
            p += 4 + vn
        maps.append(m)
    if p + body_size != total:
        raise ValueError(f"body of {body_size} bytes does not end the record (ends at {p + body_size}, size {total})")
    return MessageRecord(
        topic=texts[0], queue_id=qid, body=raw[p:], message_id=texts[1], tag=texts[2] or None,
        keys=tuple(keys), message_group=texts[3] or None, properties=maps[0], system_properties=maps[1],
        message_type=mtype, flags=flags, born_timestamp_ms=born, born_host=texts[4], store_host=texts[5],
        delivery_timestamp_ms=deliver, delivery_attempt=attempt, queue_offset=qoff, physical_offset=phys,
        store_timestamp_ms=stored, size=total,
    )  # fmt: skip
