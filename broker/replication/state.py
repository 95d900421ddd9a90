"""Replicated consumer state: which column families, and their STATE frames (docs/replication.md).

A STATE frame carries one numbered change of the primary's replicated column families (or a piece
of a snapshot of all of them), recorded by `broker/store/statelog.py`:

| offset | size | field |
|---|---|---|
| 0 | 1 | flags: 1 SNAPSHOT (a piece of a snapshot), 2 LAST (the snapshot's last piece) |
| 1 | 8 | seq (u64): the change's number; a snapshot's: the last change it includes |
| 9 | 4 | number of operations (u32) |
| 13 | … | operations |

Each operation: kind u8 (1 PUT, 2 DELETE, 3 DELETE_RANGE), then four length-prefixed fields
(u16 column family, u16 topic, u32 key, u32 value; a DELETE_RANGE's value is its end key).

Keys of committed offsets and lite topics hold the broker's **topic id**, which every member
allocates on its own (its dispatcher interns topics as it meets them). Those keys travel with the
topic's **name** in the topic field; the replica puts its own id for that name into the key.
Numbers are little-endian.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable

import rocksdict

from broker.amqp_meta_store import AMQP_META_CFS
from broker.lite import keys as LK
from broker.mqtt_store import MQTT_CFS
from broker.popstate import POP_CFS
from broker.security_store import SECURITY_CFS
from broker.store import keys as SK
from broker.store.index import Index
from broker.store.statelog import DELETE, DELETE_RANGE, PUT, Op
from broker.tiering.kv import CF_TIER
from broker.timer.keys import TIMER_CFS
from broker.trace import TRACE_CFS
from broker.transaction.pending import TXN_CFS
from common.errors import BadRequest

SNAPSHOT, LAST = 1, 2

# Everything a consumer relies on that lives in RocksDB rather than in the CommitLog: pop cursors,
# in-flight entries and their deadlines, committed offsets, pending timers, half messages, lite
# topics and subscriptions (filters too); and what a successor must continue: the security
# document, the AMQP metadata and the MQTT gateway's state, tiering's manifest (what is uploaded, so
# a new primary neither re-tiers nor skips a range) and the message trace. (Topic and group metadata
# travel as META frames; the CommitLog's indexes are rebuilt by each member's dispatcher.)
REPLICATED_CFS: tuple[str, ...] = (
    *POP_CFS, SK.CF_OFFSETS, *TIMER_CFS, *TXN_CFS, *LK.LITE_CFS, *SECURITY_CFS, *AMQP_META_CFS, CF_TIER, *TRACE_CFS,
    *MQTT_CFS,
)  # fmt: skip

_HEAD = struct.Struct("<BQI")
_OP = struct.Struct("<BHHII")
_TID = struct.Struct(">I")


def _after_group(key: bytes) -> int:
    """Where the topic id starts in a key that begins with a u16-length-prefixed group name."""
    return 2 + int(struct.unpack_from(">H", key)[0])


# Column family -> where the topic id sits in its keys (lite/keys.py, store/keys.py).
_TOPIC_AT: dict[str, Callable[[bytes], int]] = {
    SK.CF_OFFSETS: _after_group,
    LK.CF_LITE_NAME: lambda _key: 0,
    LK.CF_LITE_EXP: lambda _key: 8,
    LK.CF_LITE_META: lambda _key: 0,
    LK.CF_LITE_SUB: _after_group,
    LK.CF_LITE_SUBR: lambda _key: 0,
    LK.CF_LITE_FILT: _after_group,
}


def encode(flags: int, seq: int, ops: Iterable[Op], index: Index) -> bytes:
    """A STATE frame's payload; topic ids in keys become topic names (the primary's `index`)."""
    parts: list[bytes] = []
    count = 0
    for kind, cf, key, value in ops:
        topic = b""
        locate = _TOPIC_AT.get(cf)
        if locate is not None:
            at = locate(key)
            name = index.topic_name(_TID.unpack_from(key, at)[0])
            if name is None:
                raise BadRequest(f"state key of {cf} names an unknown topic id")
            topic = name.encode()
        cfb = cf.encode()
        parts += [_OP.pack(kind, len(cfb), len(topic), len(key), len(value)), cfb, topic, key, value]
        count += 1
    return _HEAD.pack(flags, seq, count) + b"".join(parts)


def decode(payload: bytes) -> tuple[int, int, list[tuple[int, str, str, bytes, bytes]]]:
    """(flags, seq, [(kind, column family, topic, key, value)])."""
    try:
        flags, seq, count = _HEAD.unpack_from(payload)
        at = _HEAD.size
        ops = []
        for _ in range(count):
            kind, n_cf, n_topic, n_key, n_value = _OP.unpack_from(payload, at)
            at += _OP.size
            cf = payload[at : at + n_cf].decode()
            at += n_cf
            topic = payload[at : at + n_topic].decode()
            at += n_topic
            key = payload[at : at + n_key]
            at += n_key
            value = payload[at : at + n_value]
            at += n_value
            ops.append((kind, cf, topic, key, value))
    except (struct.error, UnicodeDecodeError):
        raise BadRequest("malformed replication STATE frame") from None
    if at != len(payload) or any(op[1] not in REPLICATED_CFS for op in ops):
        raise BadRequest("replication STATE frame with trailing bytes or a column family not replicated")
    return flags, seq, ops


# In the store's `meta` column family (not replicated) while a snapshot is being applied: the
# replicated column families then hold a mix of the old state and part of the new, so the member
# must not campaign (member.py) until a later snapshot completes.
SNAPSHOT_INCOMPLETE_KEY = b"r:snapshot-incomplete"


def snapshot_incomplete(index: Index) -> bool:
    """True while this member's replicated state is a partly applied snapshot."""
    return index.cf(SK.CF_META).get(SNAPSHOT_INCOMPLETE_KEY) is not None


class StateApplier:
    """A replica's side: applies changes in order, each as one WriteBatch; a snapshot piece by piece.

    A snapshot may be larger than memory, so its pieces are written as they come (memory stays
    bounded by a frame): the first marks the state incomplete (`SNAPSHOT_INCOMPLETE_KEY`) and clears
    the replicated column families in bounded batches, the last piece's batch removes the mark. A
    replica cut off mid-snapshot keeps the mark until the next snapshot completes: it is not
    eligible for election meanwhile (its state is neither the old one nor the new)."""

    def __init__(self, index: Index, max_batch_bytes: int) -> None:
        self._index = index
        self._max_batch = max_batch_bytes
        self._in_snapshot = False

    def apply(self, payload: bytes) -> int | None:
        """Apply one STATE frame; the seq this replica now holds, or None (a snapshot continues)."""
        flags, seq, ops = decode(payload)
        index = self._index
        if flags & SNAPSHOT and not self._in_snapshot:
            self._in_snapshot = True
            self._clear()
        batch = index.batch()
        self._add(batch, ops)
        if flags & SNAPSHOT and not flags & LAST:
            index.write(batch)
            return None
        if flags & SNAPSHOT:
            self._in_snapshot = False
            batch.delete(SNAPSHOT_INCOMPLETE_KEY, index.handle(SK.CF_META))
        index.write(batch)
        return seq

    def _clear(self) -> None:
        """Mark the state incomplete, then delete everything replicated (a snapshot replaces it)."""
        index = self._index
        batch = index.batch()
        batch.put(SNAPSHOT_INCOMPLETE_KEY, b"", index.handle(SK.CF_META))
        index.write(batch)
        for cf in REPLICATED_CFS:
            handle, batch, size = index.handle(cf), index.batch(), 0
            for key in index.cf(cf).keys():  # noqa: SIM118 (a raw-mode Rdict cannot be iterated itself)
                batch.delete(key, handle)
                size += len(key)
                if size >= self._max_batch:
                    index.write(batch)
                    batch, size = index.batch(), 0
            index.write(batch)

    def _add(self, batch: rocksdict.WriteBatch, ops: list[tuple[int, str, str, bytes, bytes]]) -> None:
        index = self._index
        for kind, cf, topic, key, value in ops:
            handle = index.handle(cf)
            locate = _TOPIC_AT.get(cf)
            if locate is not None:  # this member's id of the topic
                tid = _TID.pack(self._topic_id(topic))
                at = locate(key)
                key = key[:at] + tid + key[at + 4 :]
                if kind == DELETE_RANGE:
                    at = locate(value)
                    value = value[:at] + tid + value[at + 4 :]
            if kind == PUT:
                batch.put(key, value, handle)
            elif kind == DELETE:
                batch.delete(key, handle)
            elif kind == DELETE_RANGE:
                batch.delete_range(key, value, handle)
            else:
                raise BadRequest(f"unknown state operation {kind}")

    def _topic_id(self, topic: str) -> int:
        """This member's id of `topic`, persisted at once if new (a snapshot's batch may never be written)."""
        tid = self._index.topic_id(topic)
        if tid is None:
            batch = self._index.batch()
            tid = self._index.intern_topic(topic, batch)
            self._index.write(batch)
        return tid
