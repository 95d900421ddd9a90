"""Configuration of the store: one frozen dataclass per concern, grouped under `StoreConfig`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

FlushPolicy = Literal["sync", "async"]
MIN_SEGMENT_BYTES = 4096


def _at_least(lowest: float, **values: float) -> None:
    """Refuse a setting below `lowest`, naming it and what it may be (config.build adds the section)."""
    for name, value in values.items():
        if value < lowest:
            raise ValueError(f"{name} is {value}; it must be at least {lowest}")


@dataclass(frozen=True)
class CommitLogConfig:
    segment_bytes: int = 1 << 30
    # sync: acknowledge after fsync (one fsync per group-committed batch).
    # async: acknowledge after write; a flusher fsyncs every flush_interval_ms.
    flush_policy: FlushPolicy = "async"
    flush_interval_ms: int = 200
    # Under `async`, appends of at most this many bytes made on an event loop are written by that
    # loop itself, grouped per loop iteration, instead of being handed to the writer thread: a
    # page-cache write of a few KiB costs less than the two thread hand-offs (docs/storage-format.md).
    # Larger appends, `sync`, and callers off a loop use the writer thread. 0 turns it off.
    inline_append_max_bytes: int = 64 << 10
    # The largest record: the broker's largest body ([broker.limits] max_body_bytes, 16 MiB) and
    # 1 MiB for the rest of the message (the broker refuses to start with less room).
    max_record_bytes: int = 17 << 20
    # Bound on appends waiting for the writer; beyond it appends fail with TOO_MANY_REQUESTS.
    max_pending_appends: int = 100_000
    # Queues whose next queue offset the writer keeps in memory; colder ones are read from the index.
    queue_offset_cache_size: int = 200_000

    def __post_init__(self) -> None:
        _at_least(MIN_SEGMENT_BYTES, segment_bytes=self.segment_bytes)
        _at_least(
            1,
            flush_interval_ms=self.flush_interval_ms,
            max_record_bytes=self.max_record_bytes,
            max_pending_appends=self.max_pending_appends,
            queue_offset_cache_size=self.queue_offset_cache_size,
        )
        _at_least(0, inline_append_max_bytes=self.inline_append_max_bytes)


@dataclass(frozen=True)
class RetentionConfig:
    # Delete sealed segments whose newest record is older than this (0 disables age-based retention).
    max_age_s: float = 72 * 3600.0
    # Delete oldest segments while the data disk is fuller than this ratio (1.0 disables).
    max_disk_used_ratio: float = 0.90
    check_interval_s: float = 30.0

    def __post_init__(self) -> None:
        _at_least(0, max_age_s=self.max_age_s)
        if not 0 < self.max_disk_used_ratio <= 1:
            raise ValueError(f"max_disk_used_ratio is {self.max_disk_used_ratio}; it must be above 0 and at most 1")
        if self.check_interval_s <= 0:
            raise ValueError(f"check_interval_s is {self.check_interval_s}; it must be above 0")


@dataclass(frozen=True)
class RecoveryConfig:
    # A CRC failure followed by more data is corruption, not a torn tail; refuse to start unless the
    # operator explicitly accepts losing everything after the corrupt record.
    truncate_corrupt_tail: bool = False
    scan_chunk_bytes: int = 8 << 20

    def __post_init__(self) -> None:
        _at_least(MIN_SEGMENT_BYTES, scan_chunk_bytes=self.scan_chunk_bytes)


@dataclass(frozen=True)
class ReadConfig:
    # Record bytes one read, and one pop across its reads and queues, carries past its first
    # message: a pop of 32 large AMQP bodies (16 MiB each) stays under the internal RPC's limit.
    max_batch_bytes: int = 32 << 20
    # ConsumeQueue entries one read may scan while skipping filtered messages.
    max_scan_entries: int = 10_000
    # Records of one read that lie at most this many bytes apart in the CommitLog are read with one
    # pread, the bytes between them read and dropped: a lite consumer's pop takes the heads of many
    # lite topics, written at about the same time but seldom back to back.
    coalesce_gap_bytes: int = 64 << 10

    def __post_init__(self) -> None:
        _at_least(1, max_batch_bytes=self.max_batch_bytes, max_scan_entries=self.max_scan_entries)
        _at_least(0, coalesce_gap_bytes=self.coalesce_gap_bytes)


@dataclass(frozen=True)
class StoreConfig:
    commitlog: CommitLogConfig = field(default_factory=CommitLogConfig)
    retention: RetentionConfig = field(default_factory=RetentionConfig)
    recovery: RecoveryConfig = field(default_factory=RecoveryConfig)
    read: ReadConfig = field(default_factory=ReadConfig)
    # RocksDB block cache for the indexes (one cache shared by every column family).
    index_cache_bytes: int = 64 << 20
    # Memtables of all column families together (RocksDB flushes the largest beyond it): the index's
    # memory stays bounded however many messages, timers or half messages it holds.
    index_write_buffer_bytes: int = 128 << 20
