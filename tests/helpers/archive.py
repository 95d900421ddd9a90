"""A tiered archive with known contents, built by the real tiering core (MessageStore + Uploader).

`ArchiveBuilder` opens a real store (tests/helpers/tiering.py's rig) over an object store (moto S3
in the tests, the same in the Spark benchmark), appends messages "at" chosen store times, and tiers
every topic with `upload_now` (which also writes manifest.json, as the broker does). Store times are
chosen by pinning the CommitLog writer's clock while a batch is appended (`pinned_store_time`), so
tests can lay out hours or a day of data in a second. `Produced` rows are what was acknowledged,
with the offsets and store times the store assigned: the expected answers of the Spark tests.

The official-client e2e the lead may add later only needs `Produced`-like expectations and the same
S3 fixtures: replace `ArchiveBuilder` with a broker started with `--s3-*` flags.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import broker.store.writer as writer_module
from broker.tiering.config import TieringConfig
from broker.tiering.stores import s3_store
from common.record import MessageRecord
from tests.helpers.tiering import BROKER, CLUSTER, TierRig, open_rig

_clock_lock = threading.Lock()
TIER_TIMEOUT_S = 120.0


class _PinnedClock:
    """The `time` module with `time_ns` pinned; every other function (the flusher's `perf_counter`,
    `monotonic`, `sleep`) stays the real one, so the writer's background threads keep working."""

    def __init__(self, real: ModuleType, ms: int) -> None:
        self._real = real
        self._ns = ms * 1_000_000

    def time_ns(self) -> int:
        return self._ns

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


@contextlib.contextmanager
def pinned_store_time(ms: int) -> Iterator[None]:
    """While inside, the CommitLog writer stamps every record with store time `ms`."""
    with _clock_lock:
        real = writer_module.time
        writer_module.time = _PinnedClock(real, ms)  # type: ignore[assignment]
        try:
            yield
        finally:
            writer_module.time = real


@dataclass(frozen=True)
class Produced:
    cluster: str
    broker: str
    topic: str
    queue_id: int
    queue_offset: int
    message_id: str
    keys: tuple[str, ...]
    message_group: str | None
    tag: str | None
    body: bytes
    store_ms: int


def message(topic: str, queue_id: int, message_id: str, *, keys: Sequence[str] = (), body: bytes = b"x",
            group: str | None = None, tag: str | None = None, born_ms: int = 0) -> MessageRecord:  # fmt: skip
    return MessageRecord(
        topic=topic, queue_id=queue_id, body=body, message_id=message_id, tag=tag, keys=tuple(keys),
        message_group=group, properties={"p": message_id}, born_timestamp_ms=born_ms or int(time.time() * 1000),
        born_host="127.0.0.1:1", store_host="127.0.0.1:2",
    )  # fmt: skip


class ArchiveBuilder:
    def __init__(self, data_dir: Path, config: TieringConfig) -> None:
        self.config = config
        self.rig: TierRig = open_rig(data_dir, config, s3_store(config))
        self.produced: list[Produced] = []

    def produce(self, records: Sequence[MessageRecord], store_ms: int) -> list[Produced]:
        """Append `records` (one durable batch) with store time `store_ms`; what was acknowledged."""
        with pinned_store_time(store_ms):
            results = self.rig.store.append_blocking(records)
        out = [
            Produced(CLUSTER, BROKER, r.topic, r.queue_id, res.queue_offset, r.message_id, tuple(r.keys),
                     r.message_group, r.tag, bytes(r.body), res.store_timestamp_ms)
            for r, res in zip(records, results, strict=True)
        ]  # fmt: skip
        self.produced.extend(out)
        return out

    def tier(self) -> None:
        """Tier everything produced so far, every topic, and mirror the manifests; then close the store."""
        assert self.rig.store.wait_dispatched(TIER_TIMEOUT_S)
        topics = sorted({p.topic for p in self.produced})

        async def run() -> None:
            for topic in topics:
                await self.rig.uploader.upload_now(topic, timeout_s=TIER_TIMEOUT_S)
            await self.rig.uploader.close()

        asyncio.run(asyncio.wait_for(run(), TIER_TIMEOUT_S))
        self.rig.close()

    def close(self) -> None:
        self.rig.close()
