"""CommitLog record codec (format version 1). Pure functions, no I/O.

Every record is self-describing and checked on decode. All integers are little-endian.

| offset | size | field                   | meaning                                                    |
|--------|------|-------------------------|------------------------------------------------------------|
| 0      | 4    | total_size (u32)        | bytes of the whole record, this field included             |
| 4      | 4    | magic (u32)             | 0x43554C53 (b"SLUC"): a record starts here                 |
| 8      | 4    | crc32 (u32)             | zlib.crc32 of bytes [12, total_size)                       |
| 12     | 1    | version (u8)            | 1                                                          |
| 13     | 1    | message_type (u8)       | NORMAL 1, FIFO 2, DELAY 3, TRANSACTION 4                   |
| 14     | 2    | flags (u16)             | bit 0: body is gzip-compressed (as the producer sent it)   |
| 16     | 4    | queue_id (u32)          |                                                            |
| 20     | 8    | queue_offset (u64)      | assigned by the writer; strictly increasing per queue      |
| 28     | 8    | physical_offset (u64)   | assigned by the writer; this record's CommitLog position   |
| 36     | 8    | born_timestamp_ms (u64) | when the producer created the message                      |
| 44     | 8    | store_timestamp_ms (u64)| assigned by the writer                                     |
| 52     | 8    | delivery_timestamp_ms   | u64; 0 = deliver at once (timer messages set it)           |
| 60     | 4    | delivery_attempt (u32)  | attempts already made when the record was written          |
| 64     | 4    | body_size (u32)         |                                                            |
| 68     | 2    | topic_size (u16)        |                                                            |
| 70     | ...  | variable part           | see below                                                  |

Variable part, in order: topic (topic_size bytes); then each as u16 length + UTF-8 bytes:
message_id, tag (empty = no tag), message_group (empty = none), born_host, store_host; keys as
u16 count then u16 length + bytes each; user properties and then system properties, each as u16
count then (u16 key length, key, u32 value length, value) pairs; finally the body.

The writer patches queue_offset, physical_offset, store_timestamp_ms and then the CRC into an
already encoded record (`seal`), so encoding can happen before offsets are known.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field

from common.errors import BadRequest, MessageCorrupted

MAGIC = 0x43554C53
VERSION = 1
FLAG_BODY_GZIP = 0x1

_HEADER = struct.Struct("<IIIBBHIQQQQQIIH")
HEADER_SIZE = _HEADER.size  # 70
_SEAL_OFFSETS = struct.Struct("<QQ")  # queue_offset, physical_offset at byte 20
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_PREFIX = struct.Struct("<II")  # total_size, magic
MAX_U16 = 0xFFFF

OFF_CRC = 8
OFF_QUEUE_OFFSET = 20
OFF_STORE_TIMESTAMP = 44
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


def _str(out: list[bytes], text: str, what: str) -> None:
    data = text.encode("utf-8")
    if len(data) > MAX_U16:
        raise BadRequest(f"{what} is too long ({len(data)} bytes, at most {MAX_U16})")
    out.append(_U16.pack(len(data)))
    out.append(data)


def _map(out: list[bytes], mapping: dict[str, str], what: str) -> None:
    if len(mapping) > MAX_U16:
        raise BadRequest(f"too many {what} ({len(mapping)}, at most {MAX_U16})")
    out.append(_U16.pack(len(mapping)))
    for k, v in mapping.items():
        _str(out, k, f"{what} key")
        vb = v.encode("utf-8")
        out.append(_U32.pack(len(vb)))
        out.append(vb)


def encode(rec: MessageRecord) -> bytearray:
    """Encode `rec` with its current offsets; the CRC is left 0 until `seal`."""
    topic = rec.topic.encode("utf-8")
    if len(topic) > MAX_U16:
        raise BadRequest("topic name is too long")
    var: list[bytes] = [topic]
    _str(var, rec.message_id, "message id")
    _str(var, rec.tag or "", "tag")
    _str(var, rec.message_group or "", "message group")
    _str(var, rec.born_host, "born host")
    _str(var, rec.store_host, "store host")
    if len(rec.keys) > MAX_U16:
        raise BadRequest("too many message keys")
    var.append(_U16.pack(len(rec.keys)))
    for key in rec.keys:
        _str(var, key, "message key")
    _map(var, rec.properties, "user properties")
    _map(var, rec.system_properties, "system properties")
    var.append(rec.body)
    var_bytes = b"".join(var)
    total = HEADER_SIZE + len(var_bytes)
    if total > 0xFFFFFFFF:
        raise BadRequest("message is too large to store")
    header = _HEADER.pack(
        total,
        MAGIC,
        0,
        VERSION,
        rec.message_type,
        rec.flags,
        rec.queue_id,
        max(rec.queue_offset, 0),
        max(rec.physical_offset, 0),
        rec.born_timestamp_ms,
        rec.store_timestamp_ms,
        rec.delivery_timestamp_ms,
        rec.delivery_attempt,
        len(rec.body),
        len(topic),
    )
    out = bytearray(header)
    out += var_bytes
    rec.size = total
    return out


def seal(buf: bytearray, queue_offset: int, physical_offset: int, store_timestamp_ms: int) -> None:
    """Write the offsets the writer assigned and the CRC into an encoded record, in place."""
    _SEAL_OFFSETS.pack_into(buf, OFF_QUEUE_OFFSET, queue_offset, physical_offset)
    struct.pack_into("<Q", buf, OFF_STORE_TIMESTAMP, store_timestamp_ms)
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
    (total, magic, crc, version, mtype, flags, qid, qoff, phys, born, stored, deliver, attempt, body_size, tsize) = (
        _HEADER.unpack_from(view, pos)
    )
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
        return _decode_variable(
            rec_view, total, mtype, flags, qid, qoff, phys, born, stored, deliver, attempt, body_size, tsize
        )
    except (struct.error, UnicodeDecodeError, IndexError) as exc:
        raise MessageCorrupted(f"record at {where or pos} has a malformed body: {exc}") from None


def _decode_variable(
    v: memoryview,
    total: int,
    mtype: int,
    flags: int,
    qid: int,
    qoff: int,
    phys: int,
    born: int,
    stored: int,
    deliver: int,
    attempt: int,
    body_size: int,
    tsize: int,
) -> MessageRecord:
    p = HEADER_SIZE
    topic = bytes(v[p : p + tsize]).decode("utf-8")
    p += tsize

    def text() -> str:
        nonlocal p
        (n,) = _U16.unpack_from(v, p)
        p += 2
        s = bytes(v[p : p + n]).decode("utf-8")
        p += n
        return s

    def mapping() -> dict[str, str]:
        nonlocal p
        (count,) = _U16.unpack_from(v, p)
        p += 2
        out: dict[str, str] = {}
        for _ in range(count):
            k = text()
            (n,) = _U32.unpack_from(v, p)
            p += 4
            out[k] = bytes(v[p : p + n]).decode("utf-8")
            p += n
        return out

    message_id = text()
    tag = text()
    group = text()
    born_host = text()
    store_host = text()
    (nkeys,) = _U16.unpack_from(v, p)
    p += 2
    keys = tuple(text() for _ in range(nkeys))
    props = mapping()
    sysprops = mapping()
    if p + body_size != total:
        raise struct.error(f"body of {body_size} bytes does not end the record (ends at {p + body_size}, size {total})")
    body = bytes(v[p : p + body_size])
    return MessageRecord(
        topic=topic,
        queue_id=qid,
        body=body,
        message_id=message_id,
        tag=tag or None,
        keys=keys,
        message_group=group or None,
        properties=props,
        system_properties=sysprops,
        message_type=mtype,
        flags=flags,
        born_timestamp_ms=born,
        born_host=born_host,
        store_host=store_host,
        delivery_timestamp_ms=deliver,
        delivery_attempt=attempt,
        queue_offset=qoff,
        physical_offset=phys,
        store_timestamp_ms=stored,
        size=total,
    )
