"""Building blocks of the tiering tests: a store with tiering attached, and messages to fill it.

`TierRig` is a real `MessageStore` in a tmp dir (opened with the tier column family, small CommitLog
segments) with a `Manifest` in its RocksDB, an `Uploader` and a `ColdReader` over one object store
(wrapped in `MeteredObjectStore`, so tests count GETs). `clock` is what the uploader and the reader
take as "now": tests move it forward instead of sleeping past `min_age_s`.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from broker.store.config import CommitLogConfig, RetentionConfig, StoreConfig
from broker.store.store import MessageStore
from broker.tiering.config import TieringConfig
from broker.tiering.kv import CF_TIER, RocksKV
from broker.tiering.manifest import Manifest
from broker.tiering.objectstore import MeteredObjectStore, ObjectStore
from broker.tiering.reader import ColdReader
from broker.tiering.uploader import Uploader
from common.record import FLAG_BODY_GZIP, MessageRecord

CLUSTER = "test-cluster"
BROKER = "broker-t"
SEGMENT_BYTES = 64 << 10
STORE_CONFIG = StoreConfig(
    commitlog=CommitLogConfig(segment_bytes=SEGMENT_BYTES),
    retention=RetentionConfig(max_age_s=1.0, max_disk_used_ratio=1.0),
)


@dataclass
class Clock:
    """A `common.clock.Clock` `offset_s` ahead of the system's clocks."""

    offset_s: float = 0.0

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000 + round(self.offset_s * 1000)

    def monotonic(self) -> float:
        return time.monotonic() + self.offset_s


@dataclass
class TierRig:
    store: MessageStore
    objects: MeteredObjectStore
    manifest: Manifest
    uploader: Uploader
    reader: ColdReader
    clock: Clock
    config: TieringConfig
    closed: bool = field(default=False)

    def close(self) -> None:
        """Close reader and store (the uploader's executor must be idle: tests await `uploader.close()`)."""
        if not self.closed:
            self.closed = True
            self.reader.close()
            self.store.close()

    def local(self, topic: str, queue_id: int) -> list[MessageRecord]:
        """Every message of a queue still on local disk, in offset order."""
        low, high = self.store.queue_bounds(topic, queue_id)
        out: list[MessageRecord] = []
        while low < high:
            batch = self.store.read(topic, queue_id, low, max_messages=256).messages
            out.extend(batch)
            low = batch[-1].queue_offset + 1
        return out

    def cold(self, topic: str, queue_id: int, batch: int = 7) -> list[MessageRecord]:
        """Every tiered message of a queue through the cold reader, `batch` at a time."""
        low, end = self.reader.bounds(topic, queue_id)
        out: list[MessageRecord] = []
        while low < end:
            got = self.reader.read(topic, queue_id, low, batch)
            assert got, f"no tiered message at {topic}/{queue_id}@{low} below the tiered end {end}"
            out.extend(got)
            low = got[-1].queue_offset + 1
        return out


def open_rig(data_dir: Path, config: TieringConfig, objects: ObjectStore, clock: Clock | None = None) -> TierRig:
    clock = clock or Clock()
    store = MessageStore(data_dir, STORE_CONFIG, extra_cfs=(CF_TIER,))
    metered = objects if isinstance(objects, MeteredObjectStore) else MeteredObjectStore(objects)
    manifest = Manifest(RocksKV(store.index), prefix=config.prefix, cluster=CLUSTER, broker=BROKER)
    uploader = Uploader(store, manifest, metered, config, clock=clock)
    reader = ColdReader(manifest, metered, config, clock=clock)
    store.retention.may_delete = uploader.may_delete
    return TierRig(store, metered, manifest, uploader, reader, clock, config)


def make_message(topic: str, queue_id: int, n: int, rng: random.Random, body_bytes: int = 200) -> MessageRecord:
    """A message with every field set to something worth round-tripping."""
    return MessageRecord(
        topic=topic, queue_id=queue_id, body=rng.randbytes(body_bytes), message_id=f"{topic}-{queue_id}-{n:06d}",
        tag=rng.choice([None, "TagA", "tag-ü"]), keys=tuple(f"key-{n % 7}-{i}" for i in range(n % 3)),
        message_group=rng.choice([None, "group-1"]), properties={"n": str(n), "ключ": "значение"},
        system_properties={"trace": f"t{n}"}, message_type=rng.choice([1, 2, 3]),
        flags=rng.choice([0, FLAG_BODY_GZIP]), born_timestamp_ms=1_700_000_000_000 + n, born_host="10.0.0.1:5000",
        store_host="10.0.0.2:10911", delivery_timestamp_ms=rng.choice([0, 1_800_000_000_000]),
        delivery_attempt=n % 4,
    )  # fmt: skip


def fill(
    store: MessageStore, topics: Sequence[str], queues: int, per_queue: int, *, seed: int = 1, body_bytes: int = 200
) -> None:
    """Append `per_queue` messages to every queue of every topic, interleaved, in batches of 32."""
    rng = random.Random(seed)
    pending: list[MessageRecord] = []
    for n in range(per_queue):
        for topic in topics:
            for q in range(queues):
                pending.append(make_message(topic, q, n, rng, body_bytes))
                if len(pending) == 32:
                    store.append_blocking(pending)
                    pending = []
    if pending:
        store.append_blocking(pending)
    assert store.wait_dispatched(10.0)
