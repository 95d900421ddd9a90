"""Ready body bytes of a group's queue: what an AMQP queue's `x-max-length-bytes` is kept against.

RabbitMQ limits the body bytes of a queue's ready messages: never delivered, plus those requeued
(delivered, invisibility ended). Here that is the body sizes of the offsets from the group's read
position (cursor) to the queue's end, plus those of its due redeliveries.

Only queues someone asks about are tracked (a status request with `ready_bytes`). For each, the
tracker holds the running sum of body sizes of the offsets from the group's consumed offset (the
oldest not yet done) to the end it last saw: a range sum is two lookups, a due redelivery's size
one. The first ask reads the records' headers of that range once; later asks read only what was
appended since (a record's body size is in its fixed header; a ConsumeQueue entry's size is the
whole record's) and drop what the consumed offset has passed. Records read then are in the page
cache (the publishes just stored); a longer read (a first ask of a long queue) runs in a worker
thread (`ReadBehind`, `catch_up`: PopEngine.group_queues_with_bytes). Messages no longer on the
local disk (deleted by retention, or moved to the tier) count as empty bodies.
"""

from __future__ import annotations

import asyncio
import collections
import struct
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import islice

from broker.store.store import MessageStore
from common.errors import MessageCorrupted
from common.record import OFFSETS

_U32 = struct.Struct("<I")  # a record's total_size (its first field) and body_size
_OFF_BODY_SIZE = OFFSETS["body_size"]
_COALESCE_BYTES = 256 * 1024  # neighbouring records read with one pread up to this many bytes
_SMALL_RECORD = 8 * 1024  # a record above this has only its body size read
INLINE_MAX = 2048  # records read on the event loop at most per queue and ask; more are read in a worker thread
MAX_TRACKED = 4096  # queues tracked at once; the least recently asked about is dropped (and read again if asked)

QueueKey = tuple[str, str, int]  # (group, topic, queue id)


@dataclass(slots=True)
class _Sums:
    topic_id: int
    base: int  # the offset sums[0] stands for
    sums: array[int] = field(default_factory=lambda: array("q", [0]))  # sums[i]: bytes of [base, base + i)

    @property
    def end(self) -> int:
        return self.base + len(self.sums) - 1

    def between(self, start: int, end: int) -> int:
        return self.sums[end - self.base] - self.sums[start - self.base]


class ReadBehind(Exception):
    """`ReadyBytes.ready` would have to read more records than it reads on the event loop."""

    def __init__(self, key: QueueKey, sums: _Sums, end: int) -> None:
        super().__init__(f"{key}: offsets {sums.end}..{end} not read yet")
        self.key, self.sums, self.start, self.end = key, sums, sums.end, end


class ReadyBytes:
    def __init__(self, store: MessageStore, max_tracked: int = MAX_TRACKED, inline_max: int = INLINE_MAX) -> None:
        self._store = store
        self._max = max_tracked
        self.inline_max = inline_max
        self._queues: collections.OrderedDict[QueueKey, _Sums] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._queues)

    def ready(self, key: QueueKey, consumed: int, cursor: int, high: int, due: Iterable[int]) -> int:
        """Body bytes of the offsets [cursor, high) and of the `due` ones, of a queue the group has
        done below `consumed` (consumed <= cursor <= high; due offsets in [consumed, cursor)).
        Raises `ReadBehind` when more than `inline_max` records are to be read: `catch_up` reads
        them off the event loop, then ask again."""
        topic = key[1]
        tid = self._store.index.topic_id(topic)
        if tid is None or high <= consumed:
            self._queues.pop(key, None)
            return 0
        s = self._queues.get(key)
        if s is None or s.topic_id != tid or not s.base <= consumed <= s.end or high < s.end:
            s = _Sums(tid, consumed)  # new, recreated, reset, truncated, or all read passed: read again
            self._queues[key] = s
            if len(self._queues) > self._max:
                self._queues.popitem(last=False)
        self._queues.move_to_end(key)
        if consumed > s.base:
            del s.sums[: consumed - s.base]
            s.base = consumed
        if high - s.end > self.inline_max:
            raise ReadBehind(key, s, high)
        if high > s.end:
            _append(s, body_sizes(self._store, s.topic_id, key[2], s.end, high), high)
        cursor = max(consumed, min(cursor, high))
        return s.between(cursor, high) + sum(s.between(o, o + 1) for o in due if consumed <= o < cursor)

    def forget(self, group: str) -> None:
        """Stop tracking the group's queues (the group was deleted)."""
        for key in [k for k in self._queues if k[0] == group]:
            del self._queues[key]

    async def catch_up(self, behind: ReadBehind) -> None:
        """Read what `behind` names in a worker thread; kept when the queue's sums still end where
        they did (otherwise the next `ready` sees what is missing then)."""
        s = behind.sums
        sizes = await asyncio.to_thread(body_sizes, self._store, s.topic_id, behind.key[2], behind.start, behind.end)
        if self._queues.get(behind.key) is s and s.end == behind.start:
            _append(s, sizes, behind.end)


def _append(s: _Sums, sizes: list[tuple[int, int]], high: int) -> None:
    """Extend `s` to `high` by the (offset, body size) read; an offset not found counts 0."""
    found = dict(sizes)
    total = s.sums[-1]
    sums = s.sums
    for offset in range(s.end, high):
        total += found.get(offset, 0)
        sums.append(total)


def body_sizes(store: MessageStore, topic_id: int, queue_id: int, start: int, end: int) -> list[tuple[int, int]]:
    """(offset, body size) of a queue's local messages at offsets [start, end), from their records'
    headers: neighbours stored back to back are read with one pread, a large record's size alone."""
    entries = list(islice(store.index.cq_entries(topic_id, queue_id, start), end - start))
    entries = [e for e in entries if e.queue_offset < end]
    segments = store.segments
    out: list[tuple[int, int]] = []
    i, n = 0, len(entries)
    while i < n:
        first = entries[i]
        if first.size > _SMALL_RECORD:
            raw = segments.read(first.physical_offset + _OFF_BODY_SIZE, _U32.size)
            out.append((first.queue_offset, _U32.unpack(raw)[0]))
            i += 1
            continue
        start_pos = first.physical_offset
        stop = start_pos + first.size
        seg_end = segments.find(start_pos).end
        j = i + 1
        while j < n:
            e = entries[j]
            if e.physical_offset != stop or e.size > _SMALL_RECORD or stop + e.size - start_pos > _COALESCE_BYTES:
                break
            if stop + e.size > seg_end:
                break
            stop += e.size
            j += 1
        data = segments.read(start_pos, stop - start_pos)
        for e in entries[i:j]:
            pos = e.physical_offset - start_pos
            if _U32.unpack_from(data, pos)[0] != e.size:
                raise MessageCorrupted(f"no record of {e.size} bytes at commitlog position {e.physical_offset}")
            out.append((e.queue_offset, _U32.unpack_from(data, pos + _OFF_BODY_SIZE)[0]))
        i = j
    return out
