"""`BrokerTiering`: tiered storage attached to a running broker (issue #7 wiring of the core).

Built by `LocalBroker.start()` only when `[broker.tiering] bucket` is set. It owns the object store
(wrapped in `MeteredObjectStore`, whose counters the metrics read), the manifest in the store's
RocksDB (`CF_TIER`), the `Uploader` (its loop is one of the broker's tasks; its `may_delete` vetoes
local retention) and the `ColdReader`, and answers the broker's questions about data no longer on
local disk:

- `floor(topic, queue)`: the oldest offset readable anywhere (tiered or local), what "earliest" means;
- `read` / `get` / `find_by_id` / `find_by_key` / `offset_for_timestamp`: the cold read path, each
  run in the tiering read executor, never on the event loop (S3 and pyarrow block), except a read
  whose row groups are all decoded in memory already (a slice of the cache, answered in place);
- `status`, `upload_now`, `evict_local`: the `sluice admin tier ...` operations;
- `expire()`: tiered retention, run by the broker's retention loop;
- `on_deleted` / `purge`: a deleted topic's segments leave the manifest as its deletion is applied,
  and their objects are deleted (`reconcile` catches up with deletions applied while this was not
  running: a restart, a failover).

Failures: a cold read while the object store is down raises `Unavailable` (retriable, bounded by the
S3 client's timeouts) naming the object; a corrupt object raises `SegmentCorrupted` naming it.
Hot reads and produce never touch this object.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from broker.client.api import TierEvictResult
from broker.store import keys as K
from broker.store.deletion import Deletion
from broker.store.store import MessageStore
from broker.tiering.config import TieringConfig
from broker.tiering.errorcount import ErrorCountingObjectStore
from broker.tiering.kv import CF_TIER, RocksKV
from broker.tiering.objectstore import MeteredObjectStore, ObjectStore
from broker.tiering.stores import open_object_store
from common.clock import SYSTEM_CLOCK, Clock
from common.errors import PreconditionFailed
from common.logs import kv
from common.record import MessageRecord

if TYPE_CHECKING:  # the tiering core is imported where tiering starts (pyarrow: only a broker that tiers loads it)
    from broker.tiering.uploader import TopicStatus

log = logging.getLogger("sluice.tiering")

T = TypeVar("T")

TIER_CFS = (CF_TIER,)


def not_enabled(broker: str) -> PreconditionFailed:
    return PreconditionFailed(
        f"tiered storage is not configured on broker {broker}: set [broker.tiering] bucket (or --s3-bucket) "
        "and restart it"
    )


class BrokerTiering:
    def __init__(
        self,
        store: MessageStore,
        config: TieringConfig,
        *,
        cluster: str,
        broker: str,
        retention_lock: threading.Lock,
        objects: ObjectStore | None = None,
        new_epoch: bool = False,
        may_overwrite: Callable[[], bool] = lambda: True,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        """Blocking (RocksDB reads, building the S3 client): construct it off the event loop.
        `new_epoch`, `may_overwrite`: a primary term of a broker group (Manifest). `clock`: the
        ages of segments (upload, tiered retention) and the mirror's time are read on it."""
        from broker.tiering.manifest import Manifest  # pyarrow: only for a broker that tiers
        from broker.tiering.reader import ColdReader
        from broker.tiering.uploader import Uploader

        self.store = store
        self.config = config
        self.objects = MeteredObjectStore(
            ErrorCountingObjectStore(objects if objects is not None else open_object_store(config), broker)
        )
        self.manifest = Manifest(
            RocksKV(store.index), prefix=config.prefix, cluster=cluster, broker=broker, new_epoch=new_epoch,
            may_overwrite=may_overwrite, clock=clock,
        )  # fmt: skip
        self.uploader = Uploader(store, self.manifest, self.objects, config, clock=clock)
        self.reader = ColdReader(self.manifest, self.objects, config, clock=clock)
        self._retention_lock = retention_lock
        self._reads = concurrent.futures.ThreadPoolExecutor(
            max_workers=config.read_concurrency, thread_name_prefix="tier-read"
        )
        store.retention.may_delete = self.uploader.may_delete
        self.reconcile()
        log.info("tiered storage enabled", extra=kv(store=self.objects.describe(), epoch=self.manifest.epoch,
                                                    min_age_s=config.min_age_s))  # fmt: skip

    async def close(self) -> None:
        """Wait for uploads and reads in flight, then release the reader (before the store closes)."""
        await self.uploader.close()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, functools.partial(self._reads.shutdown, wait=True, cancel_futures=True))
        await loop.run_in_executor(None, self.reader.close)

    async def _call(self, fn: Callable[..., T], *args: object) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._reads, functools.partial(fn, *args))

    # -- offsets (in memory: cheap enough for the event loop) ------------------------------------

    def floor(self, topic: str, queue_id: int, local_low: int) -> int:
        """The oldest offset of the queue readable locally or from the bucket."""
        low, end = self.reader.bounds(topic, queue_id)
        return min(low, local_low) if low < end else local_low

    def covers(self, topic: str, queue_id: int, offset: int, local_low: int, *, exact: bool = False) -> bool:
        """True when `offset` is below the local copy and the bucket may hold it: with `exact`, the
        offset lies in the tiered range; without, something at or after it is tiered (a cold read,
        not a jump to the local floor, is the right answer)."""
        if offset >= local_low:
            return False
        low, end = self.reader.bounds(topic, queue_id)
        return low < end and offset < end and (low <= offset or not exact)

    def newest_ms(self, topic: str, queue_id: int) -> int | None:
        """Store time of the newest tiered message of the queue (None when none is tiered): a start
        time after it needs no look into the bucket."""
        segs = self.manifest.queue_segments(topic, queue_id)
        return segs[-1].max_store_ms if segs else None

    # -- the cold read path ----------------------------------------------------------------------

    async def read(self, topic: str, queue_id: int, offset: int, max_messages: int) -> list[MessageRecord]:
        """Tiered messages of a queue from `offset` (or the next tiered one) on, in offset order.

        Answered on the event loop when every row group it needs is already decoded in memory (a
        consumer catching up through read-ahead: a list slice, no thread hop); otherwise in the read
        threads, which fetch and decode."""
        hit = self.reader.read_cached(topic, queue_id, offset, max_messages)
        if hit is not None:
            return hit
        return await self._call(self.reader.read, topic, queue_id, offset, max_messages)

    async def get(self, topic: str, queue_id: int, offset: int) -> MessageRecord | None:
        """The tiered message at exactly this offset, or None when the bucket does not hold it."""
        got = await self.read(topic, queue_id, offset, 1)
        return got[0] if got and got[0].queue_offset == offset else None

    async def find_by_id(self, topic: str, message_id: str) -> list[MessageRecord]:
        return await self._call(functools.partial(self.reader.find_by_id, topic, message_id))

    async def find_by_key(self, topic: str, key: str, limit: int) -> list[MessageRecord]:
        return await self._call(functools.partial(self.reader.find_by_key, topic, key, limit=limit))

    async def offset_for_timestamp(self, topic: str, queue_id: int, timestamp_ms: int) -> int | None:
        return await self._call(self.reader.offset_for_timestamp, topic, queue_id, timestamp_ms)

    # -- operations ------------------------------------------------------------------------------

    async def run(self) -> None:
        """The uploader's loop (cancel to stop)."""
        await self.uploader.run()

    # Status and eviction touch only RocksDB and local files: the default executor, so that cold
    # reads stuck on a slow bucket never delay them.

    async def status(self) -> list[TopicStatus]:
        return await asyncio.to_thread(self.uploader.status)

    async def topic_status(self, topic: str) -> TopicStatus:
        return await asyncio.to_thread(self.uploader.topic_status, topic)

    async def upload_now(self, topic: str, timeout_s: float) -> TopicStatus:
        await self.uploader.upload_now(topic, timeout_s)
        return await self.topic_status(topic)

    async def evict_local(self, topic: str) -> TierEvictResult:
        return await asyncio.to_thread(self._evict_local, topic)

    def expire(self) -> int:
        """Tiered retention once (blocking: object store deletes), after `reconcile`."""
        self.reconcile()
        return self.reader.expire()

    # -- deleted topics (broker/store/deletion.py) -----------------------------------------------

    def on_deleted(self, deletion: Deletion) -> None:
        """The store applied a topic's deletion (any thread): its archived segments leave the
        manifest at once, so no cold read serves them (their objects go in `purge`)."""
        dropped = self.manifest.drop_below(deletion.topic, deletion.floors)
        if dropped:
            log.info("archived segments of a deleted topic dropped", extra=kv(topic=deletion.topic, segments=dropped))

    def reconcile(self) -> int:
        """Drop the archived segments of deletions the store applied while `on_deleted` was not
        listening (re-dispatched as the store opened, copied as a replica before this broker was
        promoted): those below their queues' first offsets since the last deletion (blocking:
        RocksDB reads). How many segments went."""
        index = self.store.index
        dropped = 0
        for topic in self.manifest.topics():
            tid = index.topic_id(topic)
            floors = {} if tid is None else index.incarnation_floors(tid)
            if floors:
                dropped += self.manifest.drop_below(topic, floors)
        if dropped:
            log.info("archived segments of deleted topics dropped", extra=kv(segments=dropped))
        return dropped

    async def purge(self, topic: str) -> int:
        """Delete the objects of the topic's dropped segments, after writing its manifest.json
        without them (object store I/O, in the uploader's threads, which `close` waits for; raises
        the object store's errors)."""
        return await self.uploader.purge(topic)

    def _evict_local(self, topic: str) -> TierEvictResult:
        """Drop the topic's local index entries below each queue's tiered end (reads of them now go
        to the bucket), then delete whole sealed CommitLog segments from the oldest while everything
        in them is tiered, as retention would later. Serialised with the retention loop."""
        store, index = self.store, self.store.index
        tid = index.topic_id(topic)
        dropped = 0
        with self._retention_lock:
            if tid is not None:
                batch = index.batch()
                meta = index.handle(K.CF_META)
                for q in index.queue_ids(tid):
                    low, high = index.queue_bounds(tid, q)
                    end = min(self.manifest.tiered_end(topic, q), high)
                    if end <= low:
                        continue
                    index.delete_cq_below(batch, tid, q, end)  # `end` may fall inside a block
                    batch.put(K.queue_floor_key(tid, q), K.U64.pack(end), meta)
                    dropped += end - low
                index.write(batch)
                if dropped:
                    # Range deletions leave tombstones every later seek into the queue would step over
                    # (milliseconds per read) until a compaction drops them: compact the topic's range now.
                    index.cf(K.CF_CQ).compact_range(K.queue_prefix(tid, 0), K.queue_prefix(tid + 1, 0))
            segments = 0
            while True:
                segs = store.segments.all()
                if len(segs) <= 1 or segs[0].end > store.dispatcher.position:
                    break
                if not self.uploader.may_delete(segs[0]):
                    break
                store.retention.drop_index_entries(segs[0])
                store.segments.delete_oldest()
                segments += 1
        log.info("evicted tiered data from local disk", extra=kv(topic=topic, messages=dropped, segments=segments))
        return TierEvictResult(topic, dropped, segments)
