"""The uploader: moves a topic's messages older than `min_age_s` from the local store to tiered segments.

Per topic, in order and one segment at a time: from each queue's tiered end (manifest progress), take
dispatched messages in CommitLog order across all queues of the topic until `segment_target_bytes`
(or `segment_max_messages`); cut a smaller segment only when its oldest message is older than
`segment_max_age_s`. Encode (segment.py), upload under the deterministic key of (topic, next sequence,
epoch), verify (the object store's put), and only then record the segment and the advanced queue ends
in one atomic manifest write. A crash anywhere before that write leaves progress unchanged, so the
restarted uploader rebuilds the same sequence number and overwrites the same key: no gap, no
duplicate range. The bucket's manifest.json follows at most every `mirror_interval_s`.

Failures (object store down, ...) are retried per topic with exponential backoff from
`retry_initial_s` to `retry_max_s`; produce and consume never wait for the uploader. While uploads
fail, `may_delete` keeps untiered CommitLog segments on disk, and a warning says so.

Tasks and threads: `run()` is the background loop, owned (and cancelled) by the broker's task group;
blocking work (RocksDB, reading records, pyarrow, object store) runs in the uploader's own bounded
executor (`upload_concurrency` threads), and `close()` waits for work already handed to it, so the
owner closes the uploader before the store. `may_delete` runs on the retention thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import heapq
import logging
import random
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from broker.store import keys as K
from broker.store.index import CqEntry
from broker.store.segments import Segment
from broker.store.store import MessageStore
from broker.tiering import expiry
from broker.tiering.config import TieringConfig
from broker.tiering.manifest import Manifest, SegmentEntry
from broker.tiering.objectstore import ObjectStore
from broker.tiering.segment import encode_segment
from common import metrics
from common.clock import SYSTEM_CLOCK, Clock
from common.errors import SluiceError, Unavailable
from common.logs import kv

log = logging.getLogger("sluice.tiering.uploader")

T = TypeVar("T")
_MAX_SEGMENTS_PER_ROUND = 16  # per topic, so one topic's backlog does not starve the others
_WARN_INTERVAL_S = 60.0
_UPLOAD_NOW_TIMEOUT_S = 300.0


@dataclass
class TopicStatus:
    topic: str
    local: dict[int, tuple[int, int]]  # queue id -> (min offset, max offset) on local disk
    tiered: dict[int, tuple[int, int]]  # queue id -> (first offset in the bucket, tiered end)
    lag_messages: int  # stored locally, not yet tiered
    lag_s: float  # age of the oldest message not yet tiered
    bytes: int  # in the bucket
    objects: int
    last_error: str
    failures: int  # consecutive
    last_upload_ms: int


@dataclass
class _TopicState:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    failures: int = 0
    retry_at_s: float = 0.0  # monotonic
    last_error: str = ""
    last_upload_ms: int = 0
    mirror_at_s: float = float("-inf")  # monotonic


class Uploader:
    def __init__(
        self,
        store: MessageStore,
        manifest: Manifest,
        objects: ObjectStore,
        config: TieringConfig,
        *,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        """`clock`: "now" for `min_age_s`, `segment_max_age_s` and upload times (common/clock.py)."""
        self.store = store
        self.manifest = manifest
        self.objects = objects
        self.config = config
        self._clock = clock
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=config.upload_concurrency, thread_name_prefix="tier-upload"
        )
        self._states: dict[str, _TopicState] = {}
        self._gaps_warned: set[tuple[str, int, int]] = set()
        self._warned_at_s = float("-inf")
        # Called on an upload thread after each segment is recorded as tiered (the broker traces it).
        self.on_uploaded: Callable[[str, SegmentEntry], None] | None = None

    def _state(self, topic: str) -> _TopicState:
        st = self._states.get(topic)
        if st is None:
            st = self._states[topic] = _TopicState()
        return st

    async def _call(self, fn: Callable[..., T], *args: object) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, functools.partial(fn, *args))

    async def close(self) -> None:
        """Wait for work already in the executor (bounded by the object store's timeouts)."""
        await asyncio.get_running_loop().run_in_executor(None, functools.partial(self._executor.shutdown, wait=True))

    # -- the background loop ---------------------------------------------------------------------

    async def run(self) -> None:
        """Tier every topic, forever, every `scan_interval_s`. Cancel it to stop."""
        while True:
            try:
                await self.run_once()
            except Exception:  # per-topic failures are handled inside; this is a bug or a closed store
                log.exception("tiering round failed")
            await asyncio.sleep(self.config.scan_interval_s)

    async def run_once(self) -> None:
        """One round: each topic not backing off uploads what is due (at most a few segments)."""
        topics = await self._call(self.store.index.topics)
        sem = asyncio.Semaphore(self.config.upload_concurrency)
        async with asyncio.TaskGroup() as tg:
            for topic in topics:
                st = self._state(topic)
                # A topic in backoff waits; one that `upload_now` is draining needs no round.
                if st.retry_at_s <= time.monotonic() and not st.lock.locked():
                    tg.create_task(self._round(topic, sem))

    async def _round(self, topic: str, sem: asyncio.Semaphore) -> None:
        st = self._state(topic)
        async with st.lock, sem:
            try:
                for _ in range(_MAX_SEGMENTS_PER_ROUND):
                    if not await self._call(self._upload_one, topic, False, None):
                        break
                due = time.monotonic() - st.mirror_at_s >= self.config.mirror_interval_s
                if due and self.manifest.mirror_stale(topic):
                    await self._call(self.manifest.write_mirror, self.objects, topic)
                    st.mirror_at_s = time.monotonic()
            except Exception as exc:
                self._failed(topic, exc)
            else:
                self._succeeded(topic)

    async def upload_now(self, topic: str, timeout_s: float = _UPLOAD_NOW_TIMEOUT_S) -> None:
        """Tier everything of `topic` dispatched so far (ignoring `min_age_s`), then write its manifest.json.

        Retries retriable failures with backoff until `timeout_s`, then raises `Unavailable`.
        """
        limits = await self._call(self._queue_highs, topic)
        if not limits and not self.manifest.segments(topic):
            return  # nothing stored, nothing tiered: no manifest.json for a topic that never had messages
        deadline = time.monotonic() + timeout_s
        delay = self.config.retry_initial_s
        st = self._state(topic)
        async with st.lock:
            while True:
                try:
                    await self._call(self._drain_to, topic, limits)
                    await self._call(self.manifest.write_mirror, self.objects, topic)
                    st.mirror_at_s = time.monotonic()
                    self._succeeded(topic)
                    return
                except Exception as exc:
                    self._failed(topic, exc)
                    if not (isinstance(exc, SluiceError) and exc.retriable):
                        raise
                    if time.monotonic() + delay > deadline:
                        raise Unavailable(f"tiering of topic {topic} did not finish in {timeout_s}s: {exc}") from exc
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.config.retry_max_s)

    async def purge(self, topic: str) -> int:
        """`expiry.purge` of one topic (its manifest.json rewritten, then the objects its manifest
        dropped deleted), in this uploader's threads; how many objects were deleted."""
        return await self._call(expiry.purge, self.manifest, self.objects, topic)

    def _succeeded(self, topic: str) -> None:
        st = self._state(topic)
        if st.failures:
            log.info("tiering recovered", extra=kv(topic=topic, after_failures=st.failures))
        st.failures, st.retry_at_s, st.last_error = 0, 0.0, ""

    def _failed(self, topic: str, exc: BaseException) -> None:
        st = self._state(topic)
        st.failures += 1
        st.last_error = str(exc) or type(exc).__name__
        backoff_s = min(self.config.retry_max_s, self.config.retry_initial_s * 2 ** min(st.failures - 1, 30))
        backoff_s *= random.uniform(0.8, 1.0)  # spread retries of many topics
        st.retry_at_s = time.monotonic() + backoff_s
        log.warning(
            "tiering upload failed; will retry",
            extra=kv(topic=topic, failures=st.failures, retry_in_s=round(backoff_s, 1), error=st.last_error),
            exc_info=not isinstance(exc, SluiceError),
        )
        self._warn_paused()

    def _warn_paused(self) -> None:
        now = time.monotonic()
        if now - self._warned_at_s < _WARN_INTERVAL_S:
            return
        self._warned_at_s = now
        used, total = self.store.disk_usage()
        log.warning(
            "tiered storage is not accepting uploads: local deletion of untiered data is paused and the disk "
            "keeps filling",
            extra=kv(store=self.objects.describe(), disk_used_ratio=round(used / total, 3) if total else None,
                     failing_topics=sorted(t for t, s in self._states.items() if s.failures)),
        )  # fmt: skip

    # -- blocking work (executor threads) --------------------------------------------------------

    def _queue_highs(self, topic: str) -> dict[int, int]:
        tid = self.store.index.topic_id(topic)
        if tid is None:
            return {}
        return {q: self.store.index.queue_bounds(tid, q)[1] for q in self.store.index.queue_ids(tid)}

    def _reached(self, topic: str, limits: Mapping[int, int]) -> bool:
        for q, limit in limits.items():
            low = self.store.queue_bounds(topic, q)[0]
            if max(self.manifest.tiered_end(topic, q), low) < limit:
                return False
        return True

    def _drain_to(self, topic: str, limits: Mapping[int, int]) -> None:
        while not self._reached(topic, limits):
            if not self._upload_one(topic, True, limits) and not self._reached(topic, limits):
                raise Unavailable(f"tiering of topic {topic} found nothing to upload below {dict(limits)}")

    def _collect(
        self, topic: str, tid: int, cutoff_ms: int | None, limits: Mapping[int, int] | None
    ) -> tuple[list[CqEntry], int]:
        """Untiered entries of the topic in CommitLog order, up to the segment target."""
        index, progress = self.store.index, self.manifest.progress(topic)
        heap: list[tuple[int, int, CqEntry, Iterator[CqEntry], int]] = []

        def push(q: int, it: Iterator[CqEntry], stop: int) -> None:
            e = next(it, None)
            if e is not None and e.queue_offset < stop and (cutoff_ms is None or e.store_timestamp_ms <= cutoff_ms):
                heapq.heappush(heap, (e.physical_offset, q, e, it, stop))

        for q in index.queue_ids(tid):
            low, high = index.queue_bounds(tid, q)
            start = progress.end(q)
            if start < low:
                if max(start, index.incarnation_floor(tid, q)) < low:  # a deleted topic's messages are no gap
                    self._warn_gap(topic, q, start, low)
                start = low
            stop = high if limits is None else min(high, limits.get(q, 0))
            if start < stop:
                push(q, index.cq_entries(tid, q, start), stop)
        picked: list[CqEntry] = []
        used = 0
        expect: dict[int, int] = {}
        while heap and used < self.config.segment_target_bytes and len(picked) < self.config.segment_max_messages:
            _, q, e, it, stop = heapq.heappop(heap)
            assert expect.setdefault(q, e.queue_offset) == e.queue_offset, "queue offsets are contiguous"
            expect[q] = e.queue_offset + 1
            picked.append(e)
            used += e.size
            push(q, it, stop)
        return picked, used

    def _warn_gap(self, topic: str, queue_id: int, end: int, low: int) -> None:
        if (topic, queue_id, low) not in self._gaps_warned:
            self._gaps_warned.add((topic, queue_id, low))
            log.warning(
                "messages were deleted locally before they were tiered; the tiered queue has a gap",
                extra=kv(topic=topic, queue_id=queue_id, tiered_end=end, local_min=low, missing=low - end),
            )

    def _upload_one(self, topic: str, force: bool, limits: Mapping[int, int] | None) -> bool:
        """Build, upload, verify and record one segment of `topic`; False when nothing is due."""
        tid = self.store.index.topic_id(topic)
        if tid is None:
            return False
        now_s = self._clock.now_ms() / 1000
        cutoff_ms = None if force else int((now_s - self.config.min_age_s) * 1000)
        picked, used = self._collect(topic, tid, cutoff_ms, limits)
        if not picked:
            return False
        full = used >= self.config.segment_target_bytes or len(picked) >= self.config.segment_max_messages
        oldest_ms = min(e.store_timestamp_ms for e in picked)
        if not (force or full or now_s * 1000 - oldest_ms >= self.config.segment_max_age_s * 1000):
            return False
        records = [self.store.read_at(e.physical_offset, e.size) for e in picked]
        seg = encode_segment(
            records, topic=topic, cluster=self.manifest.cluster, broker=self.manifest.broker,
            row_group_rows=self.config.row_group_rows, row_group_bytes=self.config.row_group_bytes,
        )  # fmt: skip
        seq = self.manifest.progress(topic).next_seq
        key = self.manifest.object_key(topic, seq)
        info = self.objects.put(key, seg.data)
        uploaded_ms = self._clock.now_ms()
        entry = SegmentEntry(seq, key, info.size, info.sha256, seg.info.rows, seg.info.queues, seg.info.min_store_ms,
                             seg.info.max_store_ms, uploaded_ms, seg.row_groups)  # fmt: skip
        if not self.manifest.add_segment(topic, entry, {q: last + 1 for q, (_, last) in seg.info.queues.items()}):
            self.objects.delete(key)  # the topic was deleted meanwhile: its old messages are not tiered
            log.info("discarded a segment of a deleted topic", extra=kv(topic=topic, key=key, rows=seg.info.rows))
            return True
        self._state(topic).last_upload_ms = uploaded_ms
        if self.on_uploaded is not None:
            self.on_uploaded(topic, entry)
        log.info("tiered a segment", extra=kv(topic=topic, key=key, rows=seg.info.rows, bytes=info.size))
        return True

    # -- retention hook and status ---------------------------------------------------------------

    def may_delete(self, segment: Segment) -> bool:
        """True when every message of this CommitLog segment is tiered (`Retention.may_delete`).

        The store's `segq` table lists, per segment, each (topic, queue) it holds (its highest
        offset there is found from the ConsumeQueue); the segment may go when each of those offsets
        is below the queue's tiered end, or of a deleted topic (below its queue's incarnation).
        Correct however topics interleave in segments; costs one short RocksDB scan.
        """
        index = self.store.index
        prefix = K.segment_prefix(segment.base)
        for key, value in index.cf(K.CF_SEGQ).items(from_key=prefix):
            if not key.startswith(prefix):
                break
            _, tid, qid = K.segq_key_parse(key)
            topic = index.topic_name(tid)
            highest = index.segment_queue_max(tid, qid, K.U64.unpack(value)[0], segment.end)
            if topic is None or self.manifest.tiered_end(topic, qid) <= highest:
                if highest < index.incarnation_floor(tid, qid):
                    continue  # a deleted topic's messages: nothing to tier
                if any(s.failures for s in self._states.values()):
                    self._warn_paused()
                return False
        return True

    def status(self) -> list[TopicStatus]:
        """Tiering status of every topic of the store (blocking: RocksDB reads; cheap)."""
        return [self.topic_status(t) for t in self.store.index.topics()]

    def topic_status(self, topic: str) -> TopicStatus:
        index = self.store.index
        tid = index.topic_id(topic)
        local: dict[int, tuple[int, int]] = {}
        tiered: dict[int, tuple[int, int]] = {}
        lag_messages = 0
        oldest_ms: int | None = None
        # Queues with local entries, and tiered ones whose local copy is gone (evicted or retained away).
        queues = set(index.queue_ids(tid)) | set(self.manifest.progress(topic).ends) if tid is not None else set()
        for q in sorted(queues):
            assert tid is not None
            local[q] = low, high = index.queue_bounds(tid, q)
            tiered[q] = self.manifest.bounds(topic, q)
            pending_from = max(tiered[q][1], low)
            lag_messages += max(0, high - pending_from)
            entry = index.cq_entry(tid, q, pending_from) if pending_from < high else None
            if entry is not None:
                oldest_ms = entry.store_timestamp_ms if oldest_ms is None else min(oldest_ms, entry.store_timestamp_ms)
        segs = self.manifest.segments(topic)
        st = self._state(topic)
        lag_s = 0.0 if oldest_ms is None else max(0.0, self._clock.now_ms() / 1000 - oldest_ms / 1000)
        return TopicStatus(topic, local, tiered, lag_messages, lag_s, sum(s.size for s in segs), len(segs),
                           st.last_error, st.failures, st.last_upload_ms)  # fmt: skip


def tier_metric_samples(broker: str, uploader: Uploader) -> list[metrics.Sample]:
    """Scrape-time tier metrics of one broker (`sluice_tier_upload_lag_messages` per topic).

    The broker registers it while tiering runs: `metrics.register_source(lambda: tier_metric_samples(name, up))`.
    Reads RocksDB and the manifest (cheap, like `status`), on the scraping thread.
    """
    return [(metrics.TIER_UPLOAD_LAG, (broker, s.topic), float(s.lag_messages)) for s in uploader.status()]
