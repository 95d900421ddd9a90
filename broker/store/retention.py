"""Retention: delete whole CommitLog segments, oldest first, and their index entries.

A sealed segment goes when its newest record is older than `max_age_s` (its file's mtime is the
time of its last write) or while the disk is fuller than `max_disk_used_ratio`. The active segment
and anything not yet dispatched are never deleted. Index entries go with the segment, without a
full scan: the `segq` table says which queues the segment held (and an offset of each there, from
which the highest is found in the ConsumeQueue), so each
queue loses its prefix with one range delete and records its new floor (a queue left empty keeps
its offsets); message-id and key entries are prefixed by the segment and go with one range delete
per column family.

`may_delete(segment)` lets tiering veto the deletion of data not yet safely uploaded.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from pathlib import Path

from broker.store import keys as K
from broker.store.config import RetentionConfig
from broker.store.index import Index
from broker.store.segments import Segment, SegmentSet
from common.logs import kv

log = logging.getLogger("sluice.store.retention")


class Retention:
    def __init__(
        self,
        segments: SegmentSet,
        index: Index,
        config: RetentionConfig,
        data_dir: Path,
        may_delete: Callable[[Segment], bool] | None = None,
    ) -> None:
        self._segments = segments
        self._index = index
        self._cfg = config
        self._data_dir = data_dir
        self.may_delete = may_delete or (lambda _seg: True)
        self.deleted_segments = 0

    def disk_used_ratio(self) -> float:
        usage = shutil.disk_usage(self._data_dir)
        return usage.used / usage.total if usage.total else 0.0

    def run(self, dispatched_position: int, now_s: float) -> int:
        deleted = 0
        while True:
            segs = self._segments.all()
            if len(segs) <= 1:
                break
            oldest = segs[0]
            if oldest.end > dispatched_position:
                break
            age_s = now_s - oldest.path.stat().st_mtime
            too_old = self._cfg.max_age_s > 0 and age_s > self._cfg.max_age_s
            too_full = self._cfg.max_disk_used_ratio < 1.0 and self.disk_used_ratio() > self._cfg.max_disk_used_ratio
            if not (too_old or too_full):
                break
            if not self.may_delete(oldest):
                log.warning(
                    "retention paused: the oldest segment may not be deleted yet",
                    extra=kv(segment=oldest.name(), reason="age" if too_old else "disk"),
                )
                break
            self.drop_index_entries(oldest)
            self._segments.delete_oldest()
            deleted += 1
            self.deleted_segments += 1
            log.info(
                "retention deleted a segment",
                extra=kv(
                    segment=oldest.name(), bytes=oldest.size, age_s=round(age_s), reason="age" if too_old else "disk"
                ),
            )
        return deleted

    def drop_index_entries(self, segment: Segment) -> None:
        index = self._index
        batch = index.batch()
        segment_base = segment.base
        prefix = K.segment_prefix(segment_base)
        cq, meta = index.handle(K.CF_CQ), index.handle(K.CF_META)
        queues = 0
        for key, value in index.cf(K.CF_SEGQ).items(from_key=prefix):
            if not key.startswith(prefix):
                break
            _, tid, qid = K.segq_key_parse(key)
            max_offset = index.segment_queue_max(tid, qid, K.U64.unpack(value)[0], segment.end)
            batch.delete_range(K.cq_key(tid, qid, 0), K.cq_key(tid, qid, max_offset + 1), cq)
            # The floor only rises: tiering's evict-local may already have raised it past this segment.
            old = index.cf(K.CF_META).get(K.queue_floor_key(tid, qid))
            floor = max(max_offset + 1, 0 if old is None else K.U64.unpack(old)[0])
            batch.put(K.queue_floor_key(tid, qid), K.U64.pack(floor), meta)
            queues += 1
        end = K.next_prefix(prefix)
        for name in (K.CF_MSGID, K.CF_KEYIDX, K.CF_SEGQ):
            batch.delete_range(prefix, end, index.handle(name))
        index.write(batch)
        log.debug("dropped index entries of a segment", extra=kv(segment_base=segment_base, queues=queues))
