"""Crash recovery: make the indexes agree with the CommitLog before the store serves anything.

From the dispatch checkpoint, scan the CommitLog forward, verify each record (magic, size, CRC)
and re-dispatch it. What stops the scan decides what happens:

* a **torn tail** — the last record of the last segment is incomplete (fewer bytes than its header
  or declared size, or a CRC failure on a record that ends exactly at end of file, or only zero
  bytes follow) — is truncated: it was never acknowledged, because acknowledgement follows the write
  (async) or the fsync (sync) of the whole record.
* anything else is **corruption** (bad bytes followed by more data, or a bad record in a sealed
  segment). The store refuses to open, naming the file and position, unless the operator set
  `recovery.truncate_corrupt_tail`, which drops everything from that point with a loud log line.
  A record that declares more bytes than the file holds is torn only if no valid record follows
  it: a damaged size field in front of good records is corruption, not a torn write.

After a clean shutdown the checkpoint equals the end of the CommitLog and nothing is scanned.
If the index is *ahead* of the CommitLog (the log lost its tail in an OS crash under the async
policy) the index entries of records that no longer end inside the log are trimmed, and the scan
restarts at the first of them, so a record cut in half is truncated as a torn tail.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass

from broker.store import keys as K
from broker.store.config import RecoveryConfig
from broker.store.dispatcher import index_records
from broker.store.index import Index
from broker.store.segments import Segment, SegmentSet
from broker.store.writer import RecordMeta, Written
from broker.tags import tag_hash
from common.errors import MessageCorrupted, StoreCorrupted
from common.logs import kv
from common.record import HEADER_SIZE, MAGIC, decode, peek_size

log = logging.getLogger("sluice.store.recovery")

_REDISPATCH_BATCH = 5_000


@dataclass
class RecoveryReport:
    start_position: int
    end_position: int
    records: int
    truncated_bytes: int
    seconds: float


class _Stop(Exception):
    def __init__(self, pos: int, reason: str, torn: bool) -> None:
        super().__init__(reason)
        self.pos, self.reason, self.torn = pos, reason, torn


def recover(segments: SegmentSet, index: Index, cfg: RecoveryConfig) -> RecoveryReport:
    t0 = time.monotonic()
    checkpoint = index.checkpoint()
    start = segments.min_offset() if checkpoint is None else max(checkpoint, segments.min_offset())
    end = segments.max_offset()
    if checkpoint is not None and checkpoint > end:
        log.warning(
            "index is ahead of the commitlog (the log lost its tail); trimming index entries",
            extra=kv(checkpoint=checkpoint, commitlog_end=end),
        )
        start = _trim_index(index, segments, end)
    records = 0
    truncated = 0
    pending: list[Written] = []
    segs = [s for s in segments.all() if s.end > start or s is segments.active]
    for seg in segs:
        pos = max(0, start - seg.base)
        try:
            for w in _scan(seg, pos, cfg.scan_chunk_bytes, is_last=seg is segments.active):
                pending.append(w)
                records += 1
                if len(pending) >= _REDISPATCH_BATCH:
                    index_records(index, pending)
                    pending.clear()
        except _Stop as stop:
            if pending:
                index_records(index, pending)
                pending.clear()
            truncated += _handle_stop(segments, seg, stop, cfg)
            break
    if pending:
        index_records(index, pending)
    report = RecoveryReport(start, segments.max_offset(), records, truncated, time.monotonic() - t0)
    if records or truncated:
        log.info(
            "recovered commitlog",
            extra=kv(
                from_position=start,
                to_position=report.end_position,
                records=records,
                truncated_bytes=truncated,
                seconds=round(report.seconds, 3),
            ),
        )
    return report


def _scan(seg: Segment, pos: int, chunk_bytes: int, *, is_last: bool) -> Iterator[Written]:
    """Yield the valid records of `seg` from byte `pos`; raise _Stop where the valid data ends."""
    file_size = seg.size
    with open(seg.path, "rb") as fh:
        fh.seek(pos)
        buf = bytearray()
        buf_start = pos

        def fill(need: int) -> int:
            """Make `buf` hold `need` bytes from `pos` if the file has them; return how many it holds."""
            nonlocal buf_start
            rel = pos - buf_start
            if len(buf) - rel < need:
                del buf[:rel]
                buf_start = pos
                while len(buf) < need:
                    more = fh.read(max(chunk_bytes, need - len(buf)))
                    if not more:
                        break
                    buf.extend(more)
            return len(buf) - (pos - buf_start)

        while pos < file_size:
            remaining = file_size - pos
            if fill(HEADER_SIZE) < 8:
                raise _Stop(pos, f"{remaining} stray bytes at the end", torn=is_last)
            rel = pos - buf_start
            size, magic = peek_size(buf, rel)
            if magic != MAGIC:
                fill(remaining)
                zero_tail = not any(memoryview(buf)[pos - buf_start :])
                raise _Stop(pos, f"bad magic 0x{magic:08x}", torn=is_last and zero_tail)
            if size < HEADER_SIZE:
                raise _Stop(pos, f"impossible record size {size}", torn=False)
            if size > remaining:
                fill(remaining)
                torn = is_last and not _valid_record_after(buf, pos - buf_start, seg.base + buf_start)
                raise _Stop(pos, f"record declares {size} bytes but only {remaining} remain", torn=torn)
            fill(size)
            rel = pos - buf_start
            try:
                rec = decode(buf, rel, where=f"{seg.name()}+{pos}")
            except MessageCorrupted as exc:
                raise _Stop(pos, exc.message, torn=is_last and pos + size == file_size) from None
            if rec.physical_offset != seg.base + pos:
                raise _Stop(pos, f"record says it lives at {rec.physical_offset}", torn=False)
            meta = RecordMeta(rec.topic, rec.queue_id, tag_hash(rec.tag), rec.message_id.encode(), rec.keys)
            yield Written(meta, rec.queue_offset, rec.physical_offset, size, rec.store_timestamp_ms, seg.base)
            pos += size


def _valid_record_after(buf: bytearray, rel: int, buf_position: int) -> bool:
    """Whether a well-formed record (magic, CRC and its own position all right) starts after `rel`.

    `buf_position` is the CommitLog position of `buf[0]`. A torn write leaves nothing valid behind
    the partial record; a damaged size field does.
    """
    magic = MAGIC.to_bytes(4, "little")
    at = buf.find(magic, rel + 5)
    while at != -1:
        start = at - 4
        try:
            rec = decode(buf, start)
        except MessageCorrupted:
            pass
        else:
            if rec.physical_offset == buf_position + start:
                return True
        at = buf.find(magic, at + 1)
    return False


def _handle_stop(segments: SegmentSet, seg: Segment, stop: _Stop, cfg: RecoveryConfig) -> int:
    where = f"segment {seg.path} at byte {stop.pos} (commitlog position {seg.base + stop.pos})"
    following = seg.size - stop.pos + sum(s.size for s in segments.all() if s.base > seg.base)
    if not stop.torn and not cfg.truncate_corrupt_tail:
        raise StoreCorrupted(
            f"commitlog corrupted in {where}: {stop.reason}; {following} bytes follow it. "
            "The broker refuses to start rather than drop data silently. Restore the segment from a "
            "replica or backup, or restart with store.recovery.truncate_corrupt_tail = true "
            "(flag --recovery-truncate-corrupt) to discard everything from this point."
        )
    if stop.torn:
        log.warning(
            "truncating torn tail of the commitlog",
            extra=kv(where=where, reason=stop.reason, bytes=seg.size - stop.pos),
        )
    else:
        log.error(
            "DISCARDING corrupt commitlog data as configured",
            extra=kv(where=where, reason=stop.reason, bytes=following),
        )
    segments.remove_after(seg)
    segments.truncate(seg, stop.pos)
    with open(seg.path, "rb+") as fh:
        os.fsync(fh.fileno())
    return following


def _trim_index(index: Index, segments: SegmentSet, end: int) -> int:
    """Delete the index entries of records that do not end by `end`; return the new checkpoint.

    The log may have lost its tail in the middle of a record: that record's entries go too, and the
    checkpoint moves back to its start so the scan sees the partial record and truncates it (keeping
    an entry for it would leave a queue offset that can never be read, and new appends would land
    after the partial bytes). The active segment's `segq` maxima are rewritten to what is left, so
    retention never range-deletes offsets that later appends reuse in a newer segment.
    """
    batch = index.batch()
    cq, msgid, keyidx, segq = (index.handle(n) for n in (K.CF_CQ, K.CF_MSGID, K.CF_KEYIDX, K.CF_SEGQ))
    last = segments.active
    first_base = last.base if last is not None else 0
    cut = end
    for key, _ in index.cf(K.CF_SEGQ).items(from_key=K.segment_prefix(first_base)):
        base, tid, qid = K.segq_key_parse(key)
        prefix = K.queue_prefix(tid, qid)
        it = index.cf(K.CF_CQ).iter()
        it.seek_for_prev(K.cq_key(tid, qid, K.MAX_U64))
        kept: tuple[int, int] | None = None  # (queue offset, physical offset) of the last entry kept
        while it.valid() and it.key().startswith(prefix):  # blocks from the queue's last one down
            block_key, value = it.key(), it.value()
            entries = list(K.CQ_VALUE.iter_unpack(value))
            n = 0  # entries of the block that end by `end` (a queue's records lie in offset order)
            while n < len(entries) and entries[n][0] + entries[n][1] <= end:
                n += 1
            if n < len(entries):
                cut = min(cut, entries[n][0])
                if n == 0:
                    batch.delete(block_key, cq)
                    it.prev()
                    continue
                batch.put(block_key, value[: n * K.CQ_ENTRY], cq)  # a block partly beyond: shorten it
            kept = (K.cq_key_parse(block_key)[2] + n - 1, entries[n - 1][0])
            break
        if kept is not None and kept[1] >= base:
            batch.put(key, K.U64.pack(kept[0]), segq)
        else:
            batch.delete(key, segq)
    for cf_name, handle in ((K.CF_MSGID, msgid), (K.CF_KEYIDX, keyidx)):
        for key, _ in index.cf(cf_name).items(from_key=K.segment_prefix(first_base)):
            if K.trailing_offset(key) >= cut:
                batch.delete(key, handle)
    index.put_checkpoint(batch, cut)
    index.write(batch)
    return cut
