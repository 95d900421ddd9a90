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
| 13     | 1    | message_type (u8)        | NORMAL 1, FIFO 2, DELAY 3, TRANSACTION 4, LITE 5, PRIO. 6 |
| 14     | 2    | flags (u16)              | bit 0: body gzip-compressed (as sent); bit 1: dedup send  |
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
system property as (u16 key size, key, u32 value size, value); finally the body. The system
properties a record may carry are named once, below (`SYSPROP_*`), beside the header's fields.

The table is the codec's one statement of the header: `HEADER_FIELDS` restates it field by field
(a unit test holds the two equal) and every struct here is derived from that tuple.

A sent message is encoded once, by the protocol edge that received it (`outgoing`): its record
without topic, queue id, offsets, store time and store host (sizes 0), CRC set. The broker
verifies it (`received`, as a replica verifies copied records: magic, size, version, CRC, and that
the edge left those fields to it), decodes it into a `MessageRecord` and, in the same pass, copies
it once into the buffer the CommitLog will hold, with topic, queue id and store host written in
(`MessageRecord.edge`; the store host is the storing broker's address). The broker checks its
content; the store appends the buffer with the queue id written again where the message moved
(`placed`: lite topics, priority levels; one record's buffer is appended as it is). Records the
broker makes itself (timer copies, half messages, committed copies, dead letters) have no edge
record: `placed` encodes each with `encode_one`, the one per-record encoder (`_fields`,
which checks every field and names the one that does not fit), into the same bytes. So every
append takes one path (`placed`) and is one buffer; the writer patches queue_offset,
physical_offset, store_timestamp_ms and then the CRC into it (`seal_at`) and hands it to the
kernel without copying it again. The format is unchanged (version 1; flags bit 1 is new and
readers ignore it).

The CRC is the standard CRC-32 (zlib's); ISA-L's implementation (package `isal`) computes the same
value ~4x faster on 1 KiB records, so it is used when installed, zlib's otherwise.
"""

from __future__ import annotations

import operator
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import accumulate, repeat
from types import MappingProxyType
from typing import Any, NamedTuple

try:  # same CRC-32 as zlib.crc32, SIMD-accelerated; the CRC is ~20% of a 1 KiB append's CPU with zlib
    from isal.isal_zlib import crc32
except ImportError:  # pragma: no cover - isal is a declared dependency; zlib gives identical values
    from zlib import crc32

from common.errors import BadRequest, IllegalMessageTag, MessageCorrupted
from common.model import MESSAGE_TYPES, require_field_order

MAGIC = 0x43554C53
VERSION = 1
FLAG_BODY_GZIP = 0x1
FLAG_DEDUP = 0x2  # `outgoing`'s dedup: the sender asks for at most one copy of this message id
MAX_U16 = 0xFFFF

# The fixed header as the table above states it, field by field: every struct of this module is
# derived from it ("<": packed, no alignment), so the layout is written down once.
HEADER_FIELDS: tuple[tuple[str, str], ...] = (
    ("total_size", "I"), ("magic", "I"), ("crc32", "I"), ("version", "B"), ("message_type", "B"), ("flags", "H"),
    ("queue_id", "I"), ("queue_offset", "Q"), ("physical_offset", "Q"), ("store_timestamp_ms", "Q"),
    ("born_timestamp_ms", "Q"), ("delivery_timestamp_ms", "Q"), ("delivery_attempt", "I"), ("body_size", "I"),
    ("topic_size", "H"), ("message_id_size", "H"), ("tag_size", "H"), ("message_group_size", "H"),
    ("born_host_size", "H"), ("store_host_size", "H"), ("key_count", "H"), ("property_count", "H"),
    ("system_property_count", "H"),
)  # fmt: skip
# The system properties a record may carry, by name: the variable part's named fields, stated
# here once as the header is above. Properties a client sets or sees (the edges map them to and from
# their protocol):
SYSPROP_LITE_TOPIC = "LITE_TOPIC"  # a LITE message's lite topic (gRPC SystemProperties.lite_topic)
SYSPROP_PRIORITY = "PRIORITY"  # a PRIORITY message's level, decimal (SystemProperties.priority)
SYSPROP_TRACE_CONTEXT = "TRACE_CONTEXT"  # SystemProperties.trace_context, handed back as sent
SYSPROP_TX_RECOVERY_MS = "TRANSACTION_RECOVERY_MS"  # a half message's orphan-check delay, decimal ms
# An AMQP queue's copy of a publish: its content header's property bytes as sent (base64), handed
# back unchanged on delivery; a header takes up to a frame, more than user properties may.
SYSPROP_AMQP_PROPERTIES = "AMQP_PROPERTIES"
# A dead letter's origin (`%DLQ%<group>` records; SystemProperties.dead_letter_queue, `sluice admin dlq`):
SYSPROP_DLQ_ORIGIN_TOPIC = "DLQ_ORIGIN_TOPIC"
SYSPROP_DLQ_ORIGIN_QUEUE = "DLQ_ORIGIN_QUEUE_ID"
SYSPROP_DLQ_ORIGIN_OFFSET = "DLQ_ORIGIN_QUEUE_OFFSET"
SYSPROP_DLQ_ATTEMPTS = "DLQ_DELIVERY_ATTEMPTS"
# Written and read by the broker alone:
SYSPROP_TIMER_TARGET_TOPIC = "TIMER_TARGET_TOPIC"  # a pending timer record: where it goes when due
SYSPROP_TIMER_TARGET_QUEUE = "TIMER_TARGET_QUEUE"
SYSPROP_TIMER_POSITION = "TIMER_POSITION"  # a due copy: its timer's CommitLog position (crash recovery)
SYSPROP_TXN_ID = "TXN_ID"  # a half message's transaction id
SYSPROP_TXN_TOPIC = "TXN_TOPIC"  # a half message's real topic
# An MQTT PUBLISH's own fields (docs/mqtt.md, "Messages and properties"), read by the MQTT gateway:
SYSPROP_MQTT_QOS = "MQTT_QOS"  # 0, 1 or 2
SYSPROP_MQTT_RETAIN = "MQTT_RETAIN"  # "1" when published with RETAIN (Retain As Published)
SYSPROP_MQTT_ORIGIN = "MQTT_ORIGIN"  # the publishing session (namespace NUL client id), for No Local
SYSPROP_MQTT_EXPIRES_MS = "MQTT_EXPIRES_MS"  # epoch ms the message expires at (Message Expiry Interval)
SYSPROP_MQTT_FORMAT = "MQTT_FORMAT"  # the Payload Format Indicator, "1": UTF-8 text

_NAMES = tuple(name for name, _ in HEADER_FIELDS)
OFFSETS: dict[str, int] = dict(
    zip(_NAMES, accumulate((struct.calcsize("<" + code) for _, code in HEADER_FIELDS), initial=0), strict=False)
)


def _span(first: str, last: str) -> struct.Struct:
    """The struct of header fields `first`..`last` (inclusive), packed from `OFFSETS[first]`."""
    i, j = _NAMES.index(first), _NAMES.index(last)
    return struct.Struct("<" + "".join(code for _, code in HEADER_FIELDS[i : j + 1]))


_HEADER = _span("total_size", "system_property_count")
HEADER_SIZE = _HEADER.size  # 86
_PREFIX = _span("total_size", "magic")
_TOTAL = _span("total_size", "total_size")
_SEAL = _span("queue_offset", "store_timestamp_ms")  # the writer's three fields are adjacent
_CRC = _span("crc32", "crc32")
_LEAD = _span("total_size", "crc32")  # an edge record's first 12 bytes; the CRC covers the rest (`_COVERED`)
_COVERED = _span("version", "system_property_count")
_QUEUE_ID = _span("queue_id", "queue_id")
OFF_CRC = OFFSETS["crc32"]
OFF_SEAL = OFFSETS["queue_offset"]
CRC_START = OFFSETS["version"]  # the CRC covers everything after itself
_U16 = struct.Struct("<H")  # variable part: key and property-name sizes
_U32 = struct.Struct("<I")  # variable part: property-value sizes
_U16_2 = struct.Struct("<HH")
OFF_QUEUE_ID = OFFSETS["queue_id"]
OFF_GROUP_SIZE = OFFSETS["message_group_size"]
OFF_MID_SIZE = OFFSETS["message_id_size"]  # then tag_size
OFF_BODY_SIZE = OFFSETS["body_size"]
_NO_MAP: Mapping[str, str] = MappingProxyType({})


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
    # The record an edge encoded this message as (`outgoing`), when the broker received it so
    # (`received`): its bytes as stored, topic and store host written in, which the store appends
    # with the record's queue id written in (`placed`), not encoded again. Empty otherwise (the
    # store then encodes the record: `encode_one`); a change of any other field (a timer's or a
    # half message's copy) must clear it.
    edge: bytes | bytearray = field(default=b"", compare=False, repr=False)
    # The record's bytes as the CommitLog holds them, when it was decoded from them (`decode`): a pop
    # hands them on unchanged (`stored_bytes`). Empty otherwise; a copy that changes a field must clear it.
    raw: bytes = field(default=b"", compare=False, repr=False)


# `_decode_checked` builds records positionally, in this order (tiering's `table_to_records` follows
# the dataclass's own field order, broker/tiering/segment.py `_read_plan`).
RECORD_FIELDS = (
    "topic", "queue_id", "body", "message_id", "tag", "keys", "message_group", "properties", "system_properties",
    "message_type", "flags", "born_timestamp_ms", "born_host", "store_host", "delivery_timestamp_ms",
    "delivery_attempt", "queue_offset", "physical_offset", "store_timestamp_ms", "size", "edge", "raw",
)  # fmt: skip
require_field_order(MessageRecord, RECORD_FIELDS)


def _too_long(what: str, size: int) -> BadRequest:
    return BadRequest(f"{what} is too long ({size} bytes, at most {MAX_U16})")


def _too_big(size: int, limit: int) -> BadRequest:
    return BadRequest(f"message of {size} bytes exceeds the store's record limit of {limit} bytes")


def _pairs(out: list[bytes], mapping: Mapping[str, str], what: str) -> None:
    pack16, pack32 = _U16.pack, _U32.pack
    for k in mapping:  # iterating keys and indexing: a protobuf map's `items()` is a slow Python view
        kb = k.encode("utf-8")
        vb = mapping[k].encode("utf-8")
        if len(kb) > MAX_U16:
            raise _too_long(f"{what} key", len(kb))
        out += (pack16(len(kb)), kb, pack32(len(vb)), vb)


def _tail(keys: Sequence[str], props: Mapping[str, str], sysprops: Mapping[str, str]) -> bytes:
    """The keys and properties of the variable part (empty for most messages)."""
    if not (keys or props or sysprops):
        return b""
    if len(keys) > MAX_U16 or len(props) > MAX_U16 or len(sysprops) > MAX_U16:
        raise BadRequest(f"too many keys or properties (at most {MAX_U16} each)")
    extra: list[bytes] = []
    for key in keys:
        kb = key.encode("utf-8")
        if len(kb) > MAX_U16:
            raise _too_long("message key", len(kb))
        extra.append(_U16.pack(len(kb)))
        extra.append(kb)
    _pairs(extra, props, "user property")
    _pairs(extra, sysprops, "system property")
    return b"".join(extra)


def _texts_too_long(texts: tuple[bytes, ...]) -> BadRequest:
    names = ("topic", "message id", "tag", "message group", "born host", "store host")
    name, size = max(zip(names, map(len, texts), strict=True), key=lambda p: p[1])
    return _too_long(name, size)


def _parts(rec: MessageRecord, queue_offset: int, physical_offset: int, store_timestamp_ms: int) -> tuple[bytes, ...]:
    """`_fields` of a `MessageRecord` with these writer fields; `rec.size` is set."""
    parts = _fields(
        rec.topic, rec.queue_id, rec.body, rec.message_id, rec.tag, rec.keys, rec.message_group, rec.properties,
        rec.system_properties, rec.message_type, rec.flags, rec.born_timestamp_ms, rec.born_host, rec.store_host,
        rec.delivery_timestamp_ms, rec.delivery_attempt, queue_offset, physical_offset, store_timestamp_ms,
    )  # fmt: skip
    rec.size = _TOTAL.unpack_from(parts[0])[0]
    return parts


def _fields(
    topic_s: str, queue_id: int, body: bytes, message_id: str, tag_s: str | None, keys: Sequence[str],
    group_s: str | None, props: Mapping[str, str], sysprops: Mapping[str, str], message_type: int, flags: int,
    born_timestamp_ms: int, born_host_s: str, store_host_s: str, delivery_timestamp_ms: int, delivery_attempt: int,
    queue_offset: int, physical_offset: int, store_timestamp_ms: int,
) -> tuple[bytes, ...]:  # fmt: skip
    """The record's bytes as parts to join (header, texts, tail, body), CRC 0. The one per-record
    encoder: it checks every field and names the first that does not fit. (Written out field by
    field: it is a single send's whole encode.)"""
    topic = topic_s.encode("utf-8")
    mid = message_id.encode("utf-8")
    tag = tag_s.encode("utf-8") if tag_s else b""
    group = group_s.encode("utf-8") if group_s else b""
    born_host = born_host_s.encode("utf-8")
    store_host = store_host_s.encode("utf-8")
    n_topic, n_mid, n_tag, n_group, n_bhost, n_shost = (
        len(topic), len(mid), len(tag), len(group), len(born_host), len(store_host)
    )  # fmt: skip
    if (n_topic | n_mid | n_tag | n_group | n_bhost | n_shost) > MAX_U16:
        raise _texts_too_long((topic, mid, tag, group, born_host, store_host))
    tail = _tail(keys, props, sysprops)
    total = HEADER_SIZE + n_topic + n_mid + n_tag + n_group + n_bhost + n_shost + len(tail) + len(body)
    if total > 0xFFFFFFFF:
        raise BadRequest("message is too large to store")
    try:
        header = _HEADER.pack(
            total, MAGIC, 0, VERSION, message_type, flags, queue_id, queue_offset, physical_offset,
            store_timestamp_ms, born_timestamp_ms, delivery_timestamp_ms, delivery_attempt, len(body),
            n_topic, n_mid, n_tag, n_group, n_bhost, n_shost, len(keys), len(props), len(sysprops),
        )  # fmt: skip
    except struct.error as exc:  # a number that does not fit its field (queue id, timestamp, ...)
        raise BadRequest(f"a message field is out of range: {exc}") from None
    return header, topic, mid, tag, group, born_host, store_host, tail, body


def outgoing(
    body: bytes, message_id: str, message_type: int = 1, tag: str | None = None, keys: Sequence[str] = (),
    message_group: str | None = None, properties: Mapping[str, str] = _NO_MAP,
    system_properties: Mapping[str, str] = _NO_MAP, born_timestamp_ms: int = 0, born_host: str = "",
    delivery_timestamp_ms: int = 0, body_gzip: bool = False, dedup: bool = False,
) -> bytes:  # fmt: skip
    """A message as a protocol edge hands it to a broker (the contract's `send`): its record with
    no topic, queue, offsets, store time or store host, which the broker writes when it appends it
    (`received`), and its CRC set, which the broker checks. `dedup`: store this message id at most
    once within the broker's dedup window (broker/dedup.py; the Spark sink's replays). (Written out
    field by field: it is an edge's whole encode of a message. The CRC runs over the header's tail
    and texts and then the body, so that the record is joined once, straight into bytes.)"""
    if tag == "":  # a record's tag is absent or has characters: "" would come back as no tag
        raise IllegalMessageTag("tag '' is invalid: a tag has at least one printable character and no '|'")
    mid = message_id.encode("utf-8")
    tag_b = tag.encode("utf-8") if tag else b""
    group = message_group.encode("utf-8") if message_group else b""
    host = born_host.encode("utf-8")
    n_mid, n_tag, n_group, n_host = len(mid), len(tag_b), len(group), len(host)
    if (n_mid | n_tag | n_group | n_host) > MAX_U16:
        raise _texts_too_long((b"", mid, tag_b, group, host, b""))
    tail = _tail(keys, properties, system_properties)
    total = HEADER_SIZE + n_mid + n_tag + n_group + n_host + len(tail) + len(body)
    if total > 0xFFFFFFFF:
        raise BadRequest("message is too large to store")
    flags = (FLAG_BODY_GZIP if body_gzip else 0) | (FLAG_DEDUP if dedup else 0)
    try:
        covered = b"".join((_COVERED.pack(
            VERSION, message_type, flags, 0, 0, 0, 0, born_timestamp_ms, delivery_timestamp_ms, 0, len(body), 0,
            n_mid, n_tag, n_group, n_host, 0, len(keys), len(properties), len(system_properties),
        ), mid, tag_b, group, host, tail))  # fmt: skip
    except struct.error as exc:  # a number that does not fit its field (a timestamp, ...)
        raise BadRequest(f"a message field is out of range: {exc}") from None
    return b"".join((_LEAD.pack(total, MAGIC, crc32(body, crc32(covered))), covered, body))


# The `MessageRecord` fields an edge record carries: `outgoing`'s parameters of the same name (the
# broker writes the others when it stores the record). A field added to both is carried by `outgoing_copy`.
_EDGE_FIELDS = tuple(n for n in outgoing.__code__.co_varnames[: outgoing.__code__.co_argcount] if n in RECORD_FIELDS)


def outgoing_copy(rec: MessageRecord, **changes: Any) -> bytes:
    """The `outgoing` record that sends a stored message again: every field an edge record carries
    taken from `rec` (`body_gzip` from its flags; never `dedup`, a property of one send), except
    those `changes` names (`outgoing`'s parameters: a new message id, other properties, ...). What
    the copy must differ in is the caller's rule (admin/dlq.py: a dead letter's resend)."""
    args: dict[str, Any] = {name: getattr(rec, name) for name in _EDGE_FIELDS}
    args["body_gzip"] = bool(rec.flags & FLAG_BODY_GZIP)
    args.update(changes)
    return outgoing(**args)


def peek_group(data: bytes) -> str | None:
    """The message group of an `outgoing` record (it routes the message), None without one."""
    n_group = _U16.unpack_from(data, OFF_GROUP_SIZE)[0]
    if not n_group:
        return None
    start = HEADER_SIZE + sum(_U16_2.unpack_from(data, OFF_MID_SIZE))  # no topic: past message id and tag
    return str(data[start : start + n_group], "utf-8")


def peek_body_size(data: bytes) -> int:
    return _U32.unpack_from(data, OFF_BODY_SIZE)[0]


def received(records: Sequence[bytes], topic: str, queue_id: int, store_host: str) -> list[MessageRecord]:
    """The records of a send (each made by `outgoing`), verified as a replica verifies copied ones
    (magic, size, version, CRC) and as an edge writes them (one whole record, no topic, store host,
    queue, offsets, store time or attempt), decoded, and placed: `topic`, `queue_id` and
    `store_host` set, the message type a `MessageType`, and `edge` the record as the CommitLog
    stores it, in a buffer of its own: topic and store host written in (the one copy of the
    record past the edge), queue id as given, offsets, store time and CRC left for the writer
    (`placed`, `seal_at`). MessageCorrupted names the first that fails. (Written out field by
    field: it is the broker's whole decode of a send.)"""
    topic_b, host_b = topic.encode("utf-8"), store_host.encode("utf-8")
    n_topic, n_shost = len(topic_b), len(host_b)
    if n_topic > MAX_U16 or n_shost > MAX_U16:
        raise _texts_too_long((topic_b, b"", b"", b"", b"", host_b))
    _queue_id(queue_id)  # BadRequest when out of range
    grow = n_topic + n_shost
    out: list[MessageRecord] = []
    unpack, pack, types = _HEADER.unpack_from, _HEADER.pack, MESSAGE_TYPES
    for data in records:
        if type(data) is not bytes:
            data = bytes(data)
        try:
            (total, magic, crc, version, mtype, flags, qid, qoff, phys, stored, born, deliver, attempt, body_size,
             n_t, n_mid, n_tag, n_group, n_bhost, n_s, n_keys, n_props, n_sys) = unpack(data)  # fmt: skip
        except struct.error:
            raise _refused(len(out), data) from None
        view = memoryview(data)
        mt = types.get(mtype)
        if (magic != MAGIC or total != len(data) or version != VERSION or n_t or n_s or qid or qoff or phys
                or stored or attempt or mt is None or crc32(view[CRC_START:]) != crc):  # fmt: skip
            raise _refused(len(out), data)
        e_bhost = HEADER_SIZE + n_mid + n_tag + n_group + n_bhost
        try:
            if n_keys or n_props or n_sys:
                keys, props, sysprops, p = _tail_fields(data, e_bhost, n_keys, n_props, n_sys)
            else:
                keys, props, sysprops, p = (), {}, {}, e_bhost
            if p + body_size != total:
                raise ValueError(f"body of {body_size} bytes does not end the record (ends at {p + body_size})")
            # The four texts decoded at once, cut by character where they are ASCII (as good as always).
            raw = data[HEADER_SIZE:e_bhost]
            texts = raw.decode("utf-8")
            if len(texts) == e_bhost - HEADER_SIZE:
                e_tag = n_mid + n_tag
                e_group = e_tag + n_group
                mid_s, tag_s, group_s, host_s = texts[:n_mid], texts[n_mid:e_tag], texts[e_tag:e_group], texts[e_group:]
            else:
                mid_s, tag_s, group_s, host_s = _texts(data, n_mid, n_tag, n_group, n_bhost)
            head = pack(
                total + grow, MAGIC, 0, VERSION, mtype, flags, queue_id, 0, 0, 0, born, deliver, 0, body_size,
                n_topic, n_mid, n_tag, n_group, n_bhost, n_shost, n_keys, n_props, n_sys,
            )  # fmt: skip
        except (struct.error, UnicodeDecodeError, IndexError, ValueError) as exc:
            raise MessageCorrupted(f"message #{len(out)} of the send has a malformed body: {exc}") from None
        out.append(MessageRecord(
            topic, queue_id, data[p:], mid_s, tag_s or None, keys, group_s or None, props, sysprops, mt, flags,
            born, host_s, store_host, deliver, 0, -1, -1, 0, total + grow,
            bytearray().join((head, topic_b, raw, host_b, view[e_bhost:])),
        ))  # fmt: skip
    return out


def _texts(data: bytes, *sizes: int) -> list[str]:
    """The texts of these sizes after an edge record's header (it has no topic), each decoded."""
    out, at = [], HEADER_SIZE
    for size in sizes:
        out.append(str(data[at : at + size], "utf-8"))
        at += size
    return out


def _refused(i: int, data: bytes) -> MessageCorrupted:
    """Why record #`i` of a send failed the checks of its header: `_check`'s reasons (magic, size,
    version, CRC), or what only the broker writes, or an unknown message type."""
    try:
        h = _check(data, 0, "")
    except MessageCorrupted as exc:
        return MessageCorrupted(f"message #{i} of the send: {exc.message}")
    if h[0] != len(data):
        return MessageCorrupted(f"message #{i} of the send declares size {h[0]} but carries {len(data)} bytes")
    if h[4] not in MESSAGE_TYPES:
        return MessageCorrupted(f"message #{i} of the send has unknown message type {h[4]}")
    return MessageCorrupted(f"message #{i} of the send carries a topic, store host, queue, offset, store time or "
                            "delivery attempt: the broker writes those")  # fmt: skip


def placed(records: Sequence[MessageRecord], max_record_bytes: int) -> tuple[bytearray, list[int]]:
    """Records as the CommitLog stores them, back to back, and their sizes: the store's one append
    path. A received record (`received`) is its `edge` buffer with its queue id written in (lite
    topics and priority levels move a message to a queue of its own after `received`): a join,
    not an encode. A record the broker made itself (no `edge`: a timer's copy, a half message, a
    committed copy, a dead letter) is encoded by `encode_one`, which writes the same bytes
    (tests/unit/test_record_codec.py). The writer then seals offsets, store time and CRC
    (`seal_at`). One record's buffer is its own, not copied."""
    if len(records) == 1:
        rec = records[0]
        if not rec.edge:
            buf = encode_one(rec, max_record_bytes)
            return buf, [len(buf)]
        buf = rec.edge if type(rec.edge) is bytearray else bytearray(rec.edge)
        if len(buf) > max_record_bytes:
            raise _too_big(len(buf), max_record_bytes)
        if rec.queue_id != _QUEUE_ID.unpack_from(buf, OFF_QUEUE_ID)[0]:
            _QUEUE_ID.pack_into(buf, OFF_QUEUE_ID, _queue_id(rec.queue_id))
        return buf, [len(buf)]
    bufs: list[bytes | bytearray] = list(map(_GET_EDGE, records))
    if not all(bufs):  # records the broker made: encoded here, in order (the first bad one is named)
        bufs = [buf or encode_one(rec, max_record_bytes) for buf, rec in zip(bufs, records, strict=True)]
    sizes = list(map(len, bufs))
    if max(sizes) > max_record_bytes:
        raise _too_big(max(sizes), max_record_bytes)
    joined = bytearray().join(bufs)
    queues = list(map(_GET_QID, records))
    if list(map(_QUEUE_ID.unpack_from, bufs, repeat(OFF_QUEUE_ID))) != list(zip(queues)):  # moved since
        at = 0
        for qid, size in zip(queues, sizes, strict=True):
            _QUEUE_ID.pack_into(joined, at + OFF_QUEUE_ID, _queue_id(qid))
            at += size
    return joined, sizes


def _queue_id(queue_id: int) -> int:
    if not 0 <= queue_id <= 0xFFFFFFFF:
        raise BadRequest(f"queue id {queue_id} is out of range")
    return queue_id


def encode(rec: MessageRecord) -> bytearray:
    """Encode `rec` with its current offsets; the CRC is left 0 until `seal`."""
    parts = _parts(rec, max(rec.queue_offset, 0), max(rec.physical_offset, 0), rec.store_timestamp_ms)
    return bytearray().join(parts)


def copy_to_store(
    rec: MessageRecord, topic: str, queue_id: int, system_properties: dict[str, str], **changes: Any
) -> MessageRecord:
    """A stored message copied to be stored again under `topic`/`queue_id` (a dead letter, a timer's
    due message, a committed half message): every field of the message carried over as it is, so a
    field added to the record needs no edit here or in the copiers; the fields the writer assigns
    reset, the attempt count 0, and no bytes of the original kept (its topic and properties differ).
    `changes`: other fields the copy sets."""
    return replace(
        rec, topic=topic, queue_id=queue_id, system_properties=system_properties, delivery_attempt=0,
        queue_offset=-1, physical_offset=-1, store_timestamp_ms=0, size=0, edge=b"", raw=b"", **changes,
    )  # fmt: skip


def stored_bytes(rec: MessageRecord) -> bytes:
    """The record's bytes as the CommitLog holds them, CRC set: those it was decoded from (`raw`,
    handed on unchanged), or, for a record built otherwise (a tiered archive's row, a copy with a
    field changed), `encode` with its offsets and store time, sealed. `decode` reads either back."""
    if rec.raw:
        return rec.raw
    buf = encode(rec)
    _CRC.pack_into(buf, OFF_CRC, crc32(memoryview(buf)[CRC_START:]))
    return bytes(buf)


def encode_one(rec: MessageRecord, max_record_bytes: int) -> bytearray:
    """A record the broker made itself (a timer's copy, a half message, a committed copy, a dead
    letter: no `edge`) as the CommitLog stores it, for `placed`: exactly `encode(rec)` with queue
    offset, physical offset and store time left 0. The one encoder of such records (`_fields`:
    every field checked, the first that does not fit named); `rec.size` is set."""
    if rec.queue_id < 0:
        raise BadRequest(f"queue id {rec.queue_id} is negative")
    buf = bytearray().join(_parts(rec, 0, 0, 0))
    if len(buf) > max_record_bytes:
        raise _too_big(len(buf), max_record_bytes)
    return buf


_GET_QID, _GET_EDGE = operator.attrgetter("queue_id"), operator.attrgetter("edge")


def seal_at(buf: bytearray, view: memoryview, start: int, size: int, queue_offset: int, physical_offset: int,
            store_timestamp_ms: int) -> None:  # fmt: skip
    """Write the offsets the writer assigned and the CRC into the encoded record at `start` of `buf`
    (`view` is a memoryview of `buf`), in place. The one sealer: a loop of it costs no more per
    record than the C-level `map` pipeline it replaced (`seal_run`, removed: ~0.64 against ~0.68 us
    per 1 KiB record at 32 records and at 256, 0.9 against 3.9 us for one)."""
    _SEAL.pack_into(buf, start + OFF_SEAL, queue_offset, physical_offset, store_timestamp_ms)
    _CRC.pack_into(buf, start + OFF_CRC, crc32(view[start + CRC_START : start + size]))


def seal(buf: bytearray, queue_offset: int, physical_offset: int, store_timestamp_ms: int) -> None:
    """`seal_at` for a buffer that holds one record."""
    seal_at(buf, memoryview(buf), 0, len(buf), queue_offset, physical_offset, store_timestamp_ms)


def peek_size(buf: bytes | bytearray | memoryview, pos: int = 0) -> tuple[int, int]:
    """(total_size, magic) of the record starting at `pos`; the caller checks there are 8 bytes."""
    return _PREFIX.unpack_from(buf, pos)


def decode(buf: bytes | bytearray | memoryview, pos: int = 0, *, where: str = "") -> MessageRecord:
    """Decode and verify the record at `pos`. Raises MessageCorrupted naming `where` on any mismatch."""
    h = _check(buf, pos, where)
    raw = buf if type(buf) is bytes and pos == 0 and len(buf) == h[0] else memoryview(buf)[pos : pos + h[0]].tobytes()
    try:
        return _decode_checked(raw, h)
    except (struct.error, UnicodeDecodeError, IndexError, ValueError) as exc:
        raise MessageCorrupted(f"record at {where or pos} has a malformed body: {exc}") from None


class CopiedRecords(NamedTuple):
    """What the dispatcher indexes of records copied from a primary (`verify_copied`), one list per field."""

    topics: list[str]
    queue_ids: list[int]
    tags: list[str]
    message_ids: list[bytes]
    keys: list[tuple[str, ...]]
    queue_offsets: list[int]
    sizes: list[int]
    store_timestamps_ms: list[int]


def verify_copied(buf: bytes | bytearray | memoryview, position: int) -> CopiedRecords:
    """Verify the whole records of `buf`, which belong at CommitLog `position`, as `decode` does
    (magic, size, version, CRC) and that each says it lives where it is; read only what the
    dispatcher indexes (no properties, no body, no MessageRecord: ~3x cheaper than `decode` per
    1 KiB record). A replica runs it on every piece it copies (store.copied_run)."""
    view = memoryview(buf)
    out = CopiedRecords([], [], [], [], [], [], [], [])
    topics, qids, tags, mids, keys_out, qoffs, sizes, stamps = out
    at, end = 0, len(view)
    unpack_u16 = _U16.unpack_from
    while at < end:
        h = _check(view, at, position + at)
        total, phys = h[0], h[8]
        if phys != position + at:
            raise MessageCorrupted(f"record at {position + at} says it lives at {phys}")
        try:
            p = at + HEADER_SIZE
            e_topic = p + h[14]
            e_mid = e_topic + h[15]
            e_tag = e_mid + h[16]
            topics.append(str(view[p:e_topic], "utf-8"))
            mids.append(bytes(view[e_topic:e_mid]))
            tags.append(str(view[e_mid:e_tag], "utf-8"))
            n_keys = h[20]
            if n_keys:
                k = e_tag + h[17] + h[18] + h[19]  # past message group, born host and store host
                keys: list[str] = []
                for _ in range(n_keys):
                    (n,) = unpack_u16(view, k)
                    keys.append(str(view[k + 2 : k + 2 + n], "utf-8"))
                    k += 2 + n
                keys_out.append(tuple(keys))
            else:
                keys_out.append(())
        except (struct.error, UnicodeDecodeError) as exc:
            raise MessageCorrupted(f"record at {position + at} has a malformed body: {exc}") from None
        qids.append(h[6])
        qoffs.append(h[7])
        sizes.append(total)
        stamps.append(h[9])
        at += total
    return out


def _check(buf: bytes | bytearray | memoryview, pos: int, where: str | int) -> tuple[int, ...]:
    """The header of the record at `pos`, its magic, size, version and CRC verified."""
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
    actual = crc32(view[pos + CRC_START : pos + total])
    if actual != crc:
        raise MessageCorrupted(
            f"record at {where or pos} failed its CRC check (stored {crc:08x}, computed {actual:08x})"
        )
    return h


def _decode_checked(raw: bytes, h: tuple[int, ...]) -> MessageRecord:
    """The record `raw` (exactly its bytes) whose verified header is `h`."""
    (total, _m, _c, _v, mtype, flags, qid, qoff, phys, stored, born, deliver, attempt, body_size,
     n_topic, n_mid, n_tag, n_group, n_bhost, n_shost, n_keys, n_props, n_sys) = h  # fmt: skip
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
    keys, props, sysprops, p = _tail_fields(raw, e_shost, n_keys, n_props, n_sys)
    if p + body_size != total:
        raise ValueError(f"body of {body_size} bytes does not end the record (ends at {p + body_size}, size {total})")
    # Positional (see RECORD_FIELDS): keywords cost a microsecond more per message read.
    return MessageRecord(
        texts[0], qid, raw[p:], texts[1], texts[2] or None, keys, texts[3] or None, props, sysprops, mtype,
        flags, born, texts[4], texts[5], deliver, attempt, qoff, phys, stored, total, b"", raw,
    )  # fmt: skip


def _tail_fields(
    raw: bytes, p: int, n_keys: int, n_props: int, n_sys: int
) -> tuple[tuple[str, ...], dict[str, str], dict[str, str], int]:
    """The keys, user and system properties from `p`, and where they end (at the body)."""
    keys: list[str] = []
    for _ in range(n_keys):
        (n,) = _U16.unpack_from(raw, p)
        keys.append(raw[p + 2 : p + 2 + n].decode("utf-8"))
        p += 2 + n
    props, p = _read_map(raw, p, n_props) if n_props else ({}, p)
    sysprops, p = _read_map(raw, p, n_sys) if n_sys else ({}, p)
    return tuple(keys), props, sysprops, p


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
