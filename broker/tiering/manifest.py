"""The tiered manifest: per (topic, broker), the segments in the bucket and how far each queue is tiered.

Kept in the broker's RocksDB (column family `CF_TIER` = "tier", through the `KV` interface of kv.py) and mirrored
as `<prefix>/<cluster>/<broker>/<topic>/manifest.json` in the bucket (docs/tiered-format.md).

KV layout (`u16` and `u64` big-endian; `T` = u16 topic size + UTF-8 topic):

| key               | value                                                                   |
|-------------------|-------------------------------------------------------------------------|
| `e`               | this store's epoch: 12 hex chars, random, fixed when the CF is first used |
| `p` T             | progress JSON: next segment sequence, tiered end offset per queue, totals |
| `s` T seq(u64)    | segment JSON: key, size, sha256, queue ranges, time range, row groups    |
| `x` T seq(u64)    | object key of an expired segment whose object is not yet deleted         |

Invariants: a segment entry is written only after its object was uploaded and verified, in the same
atomic write as the progress it advances; per queue, segments hold consecutive offset ranges in
sequence order (a gap appears only where local retention deleted data before it was tiered); the
mirror never lists an object that is not in the bucket (objects are deleted only after a mirror
without them was written). Object keys are deterministic from (topic, sequence, epoch), so a segment
re-uploaded after a crash overwrites the same key; the epoch keeps a broker that lost its disk from
overwriting objects of its previous life, and each primary term of a replicated broker group starts
a new one (the manifest itself is replicated: docs/replication.md).

Thread-safety: every method may be called from any thread (one lock guards the in-memory view).
"""

from __future__ import annotations

import bisect
import json
import secrets
import struct
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from broker.tiering.format import RowGroupRef, manifest_json, manifest_key, segment_json, segment_key, topic_dir
from broker.tiering.kv import CF_TIER, KV
from broker.tiering.objectstore import ObjectStore
from common.clock import SYSTEM_CLOCK, Clock
from common.errors import PreconditionFailed

_EPOCH = b"e"
_U64 = struct.Struct(">Q")


def _topic_key(topic: str) -> bytes:
    raw = topic.encode("utf-8")
    return struct.pack(">H", len(raw)) + raw


@dataclass(frozen=True)
class SegmentEntry:
    seq: int
    key: str
    size: int
    sha256: str
    rows: int
    queues: dict[int, tuple[int, int]]  # queue id -> (first offset, last offset), inclusive
    min_store_ms: int
    max_store_ms: int
    uploaded_ms: int
    row_groups: tuple[RowGroupRef, ...] = ()

    def to_json(self, *, row_groups: bool = True) -> dict[str, Any]:
        doc = segment_json(
            self.seq, self.key, self.size, self.sha256, self.rows, self.queues, self.min_store_ms, self.max_store_ms,
            self.uploaded_ms,
        )  # fmt: skip
        if row_groups:
            doc["row_groups"] = [
                [g.first_queue, g.first_offset, g.last_queue, g.last_offset, g.rows, g.start, g.end]
                for g in self.row_groups
            ]
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> SegmentEntry:
        return cls(
            seq=int(doc["seq"]), key=str(doc["key"]), size=int(doc["size"]), sha256=str(doc["sha256"]),
            rows=int(doc["rows"]), queues={int(q): (int(r[0]), int(r[1])) for q, r in doc["queues"].items()},
            min_store_ms=int(doc["min_store_timestamp_ms"]), max_store_ms=int(doc["max_store_timestamp_ms"]),
            uploaded_ms=int(doc["uploaded_ms"]),
            row_groups=tuple(RowGroupRef(*map(int, g)) for g in doc.get("row_groups", ())),
        )  # fmt: skip


@dataclass
class Progress:
    next_seq: int = 0
    ends: dict[int, int] = field(default_factory=dict)  # queue id -> first offset not yet tiered

    def end(self, queue_id: int) -> int:
        return self.ends.get(queue_id, 0)


@dataclass
class _TopicView:
    progress: Progress
    segments: list[SegmentEntry]  # by seq
    by_queue: dict[int, list[SegmentEntry]] = field(default_factory=dict)  # by first offset
    lasts: dict[int, list[int]] = field(default_factory=dict)  # parallel to by_queue: last offsets
    version: int = 0  # bumped on every change; the mirror records the version it wrote

    def reindex(self) -> None:
        self.by_queue = {}
        for seg in self.segments:
            for q in seg.queues:
                self.by_queue.setdefault(q, []).append(seg)
        self.lasts = {q: [s.queues[q][1] for s in segs] for q, segs in self.by_queue.items()}
        self.version += 1


class Manifest:
    def __init__(
        self, kv: KV, *, prefix: str, cluster: str, broker: str, new_epoch: bool = False,
        may_overwrite: Callable[[], bool] = lambda: True, clock: Clock = SYSTEM_CLOCK,
    ) -> None:  # fmt: skip
        """`new_epoch`: start a new epoch even if the store has one (a replicated broker group's new
        primary: objects a deposed primary may still be uploading keep the old epoch in their keys,
        so they can never overwrite this term's objects of the same sequence). `may_overwrite()`:
        whether this broker may replace a manifest.json another broker wrote after its own last
        one (a group member: only while its primary term is valid). `clock`: the time a manifest.json
        says it was written (common/clock.py)."""
        self.kv = kv
        self._clock = clock
        self.cluster = cluster
        self.broker = broker
        self._prefix = prefix
        raw = kv.get(_EPOCH)
        if raw is None or new_epoch:
            raw = secrets.token_hex(6).encode("ascii")
            kv.put(_EPOCH, raw)
        self.epoch = raw.decode("ascii")
        self._lock = threading.RLock()
        self._views: dict[str, _TopicView] = {}
        self._mirrored: dict[str, int] = {}  # topic -> view version in the bucket
        self._mirror_locks: dict[str, threading.Lock] = {}
        self._mirror_etags: dict[str, str] = {}  # topic -> etag of the manifest.json this manifest wrote last
        self._may_overwrite = may_overwrite

    # -- naming ----------------------------------------------------------------------------------

    def topic_prefix(self, topic: str) -> str:
        return topic_dir(self._prefix, self.cluster, self.broker, topic)

    def object_key(self, topic: str, seq: int) -> str:
        return segment_key(self._prefix, self.cluster, self.broker, topic, seq, self.epoch)

    def mirror_key(self, topic: str) -> str:
        return manifest_key(self._prefix, self.cluster, self.broker, topic)

    # -- reading ---------------------------------------------------------------------------------

    def _view(self, topic: str) -> _TopicView:
        view = self._views.get(topic)
        if view is None:
            tk = _topic_key(topic)
            raw = self.kv.get(b"p" + tk)
            progress = Progress()
            if raw is not None:
                doc = json.loads(raw)
                progress = Progress(int(doc["next_seq"]), {int(q): int(e) for q, e in doc["ends"].items()})
            segments = [SegmentEntry.from_json(json.loads(v)) for _, v in self.kv.scan(b"s" + tk)]
            view = self._views[topic] = _TopicView(progress, segments)
            view.reindex()
        return view

    def topics(self) -> list[str]:
        """Topics that have tiering progress."""
        out = []
        for key, _ in self.kv.scan(b"p"):
            (n,) = struct.unpack_from(">H", key, 1)
            out.append(key[3 : 3 + n].decode("utf-8"))
        return out

    def progress(self, topic: str) -> Progress:
        with self._lock:
            p = self._view(topic).progress
            return Progress(p.next_seq, dict(p.ends))

    def tiered_end(self, topic: str, queue_id: int) -> int:
        with self._lock:
            return self._view(topic).progress.end(queue_id)

    def segments(self, topic: str) -> list[SegmentEntry]:
        with self._lock:
            return list(self._view(topic).segments)

    def queue_segments(self, topic: str, queue_id: int) -> list[SegmentEntry]:
        with self._lock:
            return list(self._view(topic).by_queue.get(queue_id, ()))

    def bounds(self, topic: str, queue_id: int) -> tuple[int, int]:
        """(first offset still in the bucket, tiered end) of a queue; (end, end) when none is."""
        with self._lock:
            view = self._view(topic)
            end = view.progress.end(queue_id)
            segs = view.by_queue.get(queue_id)
            return (segs[0].queues[queue_id][0], end) if segs else (end, end)

    def locate(self, topic: str, queue_id: int, offset: int) -> tuple[SegmentEntry, int] | None:
        """The segment and row group holding the first message of the queue at or after `offset`."""
        with self._lock:
            view = self._view(topic)
            lasts = view.lasts.get(queue_id)
            if not lasts:
                return None
            i = bisect.bisect_left(lasts, offset)
            if i == len(lasts):
                return None
            seg = view.by_queue[queue_id][i]
        target = (queue_id, max(offset, seg.queues[queue_id][0]))
        keys = [(g.last_queue, g.last_offset) for g in seg.row_groups]
        j = bisect.bisect_left(keys, target)
        assert j < len(keys), "a segment holding a queue range has a row group for it"
        return seg, j

    # -- changing --------------------------------------------------------------------------------

    def _progress_value(self, progress: Progress) -> bytes:
        ends = {str(q): e for q, e in sorted(progress.ends.items())}
        return json.dumps({"next_seq": progress.next_seq, "ends": ends}).encode()

    def add_segment(self, topic: str, entry: SegmentEntry, ends: Mapping[int, int]) -> bool:
        """Record an uploaded, verified segment and the queue ends it advances, atomically. False
        (nothing recorded) when a queue's range starts below its tiered end: the topic was deleted
        while the segment was uploaded, and its end raised past the old messages (`drop_below`)."""
        with self._lock:
            view = self._view(topic)
            if any(first < view.progress.end(q) for q, (first, _) in entry.queues.items()):
                return False
            assert entry.seq == view.progress.next_seq, "segments are added in sequence"
            assert all(last < ends[q] for q, (_, last) in entry.queues.items()), "queue ranges advance"
            progress = Progress(entry.seq + 1, {**view.progress.ends, **ends})
            tk = _topic_key(topic)
            segment_value = json.dumps(entry.to_json()).encode()
            self.kv.write({b"p" + tk: self._progress_value(progress), b"s" + tk + _U64.pack(entry.seq): segment_value})
            view.progress = progress
            view.segments.append(entry)
            view.reindex()
            return True

    def drop_below(self, topic: str, floors: Mapping[int, int]) -> int:
        """A deleted topic's old messages leave the tier: the segments holding only offsets below
        their queues' `floors` (the first offsets of the topic's next incarnation) are dropped and
        remembered as pending deletes, and each queue's tiered end rises to its floor (the
        uploader goes on from there), atomically. How many segments went; nothing changes for a
        topic never tiered or already past its floors."""
        with self._lock:
            view = self._view(topic)
            if not view.segments and not view.progress.ends and not view.progress.next_seq:
                return 0
            gone = [s for s in view.segments if all(last < floors.get(q, 0) for q, (_, last) in s.queues.items())]
            raised = {q: floor for q, floor in floors.items() if floor > view.progress.end(q)}
            if not gone and not raised:
                return 0
            progress = Progress(view.progress.next_seq, {**view.progress.ends, **raised})
            tk = _topic_key(topic)
            puts = {b"x" + tk + _U64.pack(s.seq): s.key.encode() for s in gone}
            puts[b"p" + tk] = self._progress_value(progress)
            self.kv.write(puts, [b"s" + tk + _U64.pack(s.seq) for s in gone])
            dropped = {s.seq for s in gone}
            view.progress = progress
            view.segments = [s for s in view.segments if s.seq not in dropped]
            view.reindex()
            return len(gone)

    def expire_segments(self, topic: str, seqs: Iterable[int]) -> None:
        """Drop segments from the manifest, remembering their objects as pending deletes, atomically."""
        with self._lock:
            view = self._view(topic)
            gone = {s.seq: s for s in view.segments if s.seq in set(seqs)}
            if not gone:
                return
            tk = _topic_key(topic)
            puts = {b"x" + tk + _U64.pack(seq): s.key.encode() for seq, s in gone.items()}
            self.kv.write(puts, [b"s" + tk + _U64.pack(seq) for seq in gone])
            view.segments = [s for s in view.segments if s.seq not in gone]
            view.reindex()

    def pending_deletes(self, topic: str) -> list[tuple[int, str]]:
        tk = _topic_key(topic)
        return [(_U64.unpack(k[-8:])[0], v.decode()) for k, v in self.kv.scan(b"x" + tk)]

    def deleted(self, topic: str, seq: int) -> None:
        self.kv.delete(b"x" + _topic_key(topic) + _U64.pack(seq))

    # -- the bucket's mirror ---------------------------------------------------------------------

    def mirror_document(self, topic: str) -> tuple[int, bytes]:
        """(view version, manifest.json bytes) of a topic, as documented in docs/tiered-format.md."""
        with self._lock:
            view = self._view(topic)
            body = manifest_json(
                self.cluster, self.broker, topic, self.epoch, self._clock.now_ms(), view.progress.ends,
                [s.to_json(row_groups=False) for s in view.segments],
            )  # fmt: skip
            return view.version, body

    def mirror_stale(self, topic: str) -> bool:
        with self._lock:
            return self._mirrored.get(topic) != self._view(topic).version

    def write_mirror(self, objects: ObjectStore, topic: str) -> None:
        """Upload the topic's manifest.json (blocking; raises the object store's errors).

        Writes of one topic are serialised, so an older document never lands after a newer one (an
        expired object is deleted only after a document without it was written). Each is an S3
        conditional write on the version this manifest wrote last (If-Match): a deposed primary of
        a broker group cannot replace the document of the primary that followed it.
        """
        with self._lock:
            mirror_lock = self._mirror_locks.setdefault(topic, threading.Lock())
        with mirror_lock:
            version, body = self.mirror_document(topic)
            key = self.mirror_key(topic)
            etag = self._mirror_etags.get(topic)
            if etag is None:  # this manifest's first document of the topic replaces whatever is there
                etag = _etag_of(objects, key)
            try:
                info = objects.put_if(key, body, etag)
            except PreconditionFailed:
                # Written by another broker since this one's last document: a newer primary of the
                # group (this one is deposed: it must not overwrite), or a deposed one that finished
                # a write after waking up (the current primary overwrites it).
                if not self._may_overwrite():
                    raise PreconditionFailed(
                        f"the bucket's manifest of topic {topic} was written by another broker and this one's "
                        "primary term is over: not overwriting it"
                    ) from None
                info = objects.put_if(key, body, _etag_of(objects, key))
            with self._lock:
                self._mirrored[topic] = version
                self._mirror_etags[topic] = info.etag


def _etag_of(objects: ObjectStore, key: str) -> str:
    """The etag of the object at `key` ("" when there is none: a write must create it)."""
    info = objects.head(key)
    return "" if info is None else info.etag


__all__ = ["CF_TIER", "Manifest", "Progress", "SegmentEntry"]
