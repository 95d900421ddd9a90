"""Configuration of the store: one frozen dataclass per concern, grouped under `StoreConfig`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

FlushPolicy = Literal["sync", "async"]


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
    max_record_bytes: int = 8 << 20
    # Bound on appends waiting for the writer; beyond it appends fail with TOO_MANY_REQUESTS.
    max_pending_appends: int = 100_000
    # Queues whose next queue offset the writer keeps in memory; colder ones are read from the index.
    queue_offset_cache_size: int = 200_000


@dataclass(frozen=True)
class RetentionConfig:
    # Delete sealed segments whose newest record is older than this (0 disables age-based retention).
    max_age_s: float = 72 * 3600.0
    # Delete oldest segments while the data disk is fuller than this ratio (1.0 disables).
    max_disk_used_ratio: float = 0.90
    check_interval_s: float = 30.0


@dataclass(frozen=True)
class RecoveryConfig:
    # A CRC failure followed by more data is corruption, not a torn tail; refuse to start unless the
    # operator explicitly accepts losing everything after the corrupt record.
    truncate_corrupt_tail: bool = False
    scan_chunk_bytes: int = 8 << 20


@dataclass(frozen=True)
class ReadConfig:
    max_batch_bytes: int = 32 << 20
    # ConsumeQueue entries one read may scan while skipping filtered messages.
    max_scan_entries: int = 10_000
    # Records of one read that lie at most this many bytes apart in the CommitLog are read with one
    # pread, the bytes between them read and dropped: a lite consumer's pop takes the heads of many
    # lite topics, written at about the same time but seldom back to back.
    coalesce_gap_bytes: int = 64 << 10


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
