"""Recovery from damaged CommitLog segments: torn tails are truncated, corruption refuses cleanly.

The "undispatched" records of these tests are real: the store writes them, then the index is put
back to a copy taken before they were written, exactly as after a crash between the CommitLog write
and the dispatch. Bytes are then damaged in the segment files and the store is reopened.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import struct
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from broker.store.config import CommitLogConfig, RecoveryConfig, RetentionConfig, StoreConfig
from broker.store.store import MessageStore, ReadStatus
from broker.store.writer import AppendResult
from common.errors import MessageCorrupted, OffsetNotFound, StoreCorrupted
from common.record import HEADER_SIZE, MessageRecord, encode, seal

TOPIC = "recovery"
CONFIG = StoreConfig(commitlog=CommitLogConfig(segment_bytes=1 << 20))
SMALL_SEGMENTS = StoreConfig(
    commitlog=CommitLogConfig(segment_bytes=4096),
    retention=RetentionConfig(max_age_s=60.0, max_disk_used_ratio=1.0),
)
TRUNCATE = RecoveryConfig(truncate_corrupt_tail=True)
RECOVERY_LOGGER = "sluice.store.recovery"


def message(i: int) -> MessageRecord:
    return MessageRecord(TOPIC, 0, f"body-{i}|".encode() * 20, message_id=f"id-{i}", keys=(f"key-{i}",))


@dataclass
class Setup:
    data_dir: Path
    results: list[AppendResult]  # of every record written, dispatched or not

    def segments(self) -> list[Path]:
        return sorted((self.data_dir / "commitlog").glob("*.log"))

    def segment_of(self, i: int) -> tuple[Path, int]:
        """The segment file holding record `i` and the record's byte position in it."""
        phys = self.results[i].physical_offset
        base = max(int(p.stem) for p in self.segments() if int(p.stem) <= phys)
        return self.data_dir / "commitlog" / f"{base:020d}.log", phys - base

    def digest(self) -> dict[str, str]:
        return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in self.segments()}


def build(tmp_path: Path, dispatched: int, undispatched: int, config: StoreConfig = CONFIG) -> Setup:
    """`dispatched` + `undispatched` records in the CommitLog; only the first ones in the index."""
    data_dir = tmp_path / "store"
    snapshot = tmp_path / "index-snapshot"
    store = MessageStore(data_dir, config)
    results = store.append_blocking([message(i) for i in range(dispatched)])
    store.close()
    shutil.copytree(data_dir / "index", snapshot)
    store = MessageStore(data_dir, config)
    for i in range(dispatched, dispatched + undispatched):  # one append each: records of many rounds
        results += store.append_blocking([message(i)])
    store.close()
    shutil.rmtree(data_dir / "index")
    shutil.copytree(snapshot, data_dir / "index")
    return Setup(data_dir, results)


def assert_readable(store: MessageStore, count: int) -> None:
    assert store.queue_bounds(TOPIC, 0) == (0, count)
    result = store.read(TOPIC, 0, 0, max_messages=count + 1)
    assert result.status is ReadStatus.FOUND
    assert [(m.queue_offset, m.message_id, m.body) for m in result.messages] == [
        (i, f"id-{i}", message(i).body) for i in range(count)
    ]
    assert [m.message_id for m in store.find_by_key(TOPIC, f"key-{count - 1}")] == [f"id-{count - 1}"]


def assert_appends_continue(store: MessageStore, setup: Setup, count: int) -> None:
    """The next append takes the next queue offset, right where the kept records end."""
    last = setup.results[count - 1]
    result = store.append_blocking([message(count)])[0]
    assert (result.queue_offset, result.physical_offset) == (count, last.physical_offset + last.size)
    assert store.get(TOPIC, 0, count).message_id == f"id-{count}"


def logged(caplog: pytest.LogCaptureFixture, level: int, text: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == RECOVERY_LOGGER and r.levelno == level and text in r.getMessage()]


def flip(path: Path, pos: int, mask: int = 0xFF) -> None:
    data = bytearray(path.read_bytes())
    data[pos] ^= mask
    path.write_bytes(bytes(data))


def next_record_bytes(setup: Setup) -> bytes:
    """What the writer would have appended next, sealed at the end of the log."""
    last = setup.results[-1]
    buf = encode(message(len(setup.results)))
    seal(buf, len(setup.results), last.physical_offset + last.size, 1)
    return bytes(buf)


# -- torn tails ---------------------------------------------------------------------------------------

TORN_TAILS = {
    "half_record": lambda rec: rec[: len(rec) // 2],
    "header_only": lambda rec: rec[:HEADER_SIZE],
    "few_bytes": lambda rec: rec[:5],
    "crc_fails_at_end": lambda rec: rec[:-1] + bytes([rec[-1] ^ 0xFF]),
    "zeros": lambda rec: bytes(3000),
    "few_zeros": lambda rec: bytes(5),
}


@pytest.mark.parametrize("kind", TORN_TAILS)
def test_torn_tail_is_truncated_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture, kind: str) -> None:
    setup = build(tmp_path, dispatched=5, undispatched=5)
    segment = setup.segments()[-1]
    good_size = segment.stat().st_size
    tail = TORN_TAILS[kind](next_record_bytes(setup))
    with segment.open("ab") as fh:
        fh.write(tail)
    caplog.set_level(logging.INFO)

    store = MessageStore(setup.data_dir, CONFIG)
    try:
        assert segment.stat().st_size == good_size
        assert (store.recovery.records, store.recovery.truncated_bytes) == (5, len(tail))
        (warning,) = logged(caplog, logging.WARNING, "torn")
        assert segment.name in warning.kv["where"]  # type: ignore[attr-defined]
        assert not logged(caplog, logging.ERROR, "")
        assert_readable(store, 10)
        assert_appends_continue(store, setup, 10)
    finally:
        store.close()
    store = MessageStore(setup.data_dir, CONFIG)
    try:
        assert (store.recovery.records, store.recovery.truncated_bytes) == (0, 0)
        assert_readable(store, 11)
    finally:
        store.close()


# -- corruption in the middle ---------------------------------------------------------------------------


def _set_size(path: Path, pos: int, size: int) -> None:
    data = bytearray(path.read_bytes())
    struct.pack_into("<I", data, pos, size)
    path.write_bytes(bytes(data))


DAMAGE = {
    "magic": lambda path, pos, size: flip(path, pos + 4),
    "crc": lambda path, pos, size: flip(path, pos + 8, 0x01),
    "queue_offset": lambda path, pos, size: flip(path, pos + 20, 0x01),
    "body": lambda path, pos, size: flip(path, pos + size - 1),
    # A size field that claims more than the file holds looks like a torn write, but valid records
    # follow it, so it is corruption.
    "size_grown": lambda path, pos, size: _set_size(path, pos, size + (1 << 20)),
    "size_shrunk": lambda path, pos, size: _set_size(path, pos, size - 1),
    "size_impossible": lambda path, pos, size: _set_size(path, pos, 10),
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_corruption_followed_by_records_refuses_to_open(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: str
) -> None:
    setup = build(tmp_path, dispatched=5, undispatched=5)
    segment, pos = setup.segment_of(6)
    DAMAGE[damage](segment, pos, setup.results[6].size)
    before = setup.digest()
    caplog.set_level(logging.INFO)

    with pytest.raises(StoreCorrupted) as excinfo:
        MessageStore(setup.data_dir, CONFIG)
    text = str(excinfo.value)
    assert str(segment) in text and f"at byte {pos}" in text
    assert "truncate_corrupt_tail" in text and "backup" in text  # how to proceed
    assert setup.digest() == before, "a refused open must not touch the segments"
    assert not logged(caplog, logging.WARNING, "torn")

    # The operator accepts the loss: everything from the corrupt record on goes, loudly.
    store = MessageStore(setup.data_dir, StoreConfig(commitlog=CONFIG.commitlog, recovery=TRUNCATE))
    try:
        (error,) = logged(caplog, logging.ERROR, "DISCARDING")
        assert segment.name in error.kv["where"]  # type: ignore[attr-defined]
        assert segment.stat().st_size == pos
        assert_readable(store, 6)
        assert_appends_continue(store, setup, 6)
    finally:
        store.close()


def test_corrupt_last_record_of_a_sealed_segment_is_not_a_torn_tail(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    setup = build(tmp_path, dispatched=3, undispatched=40, config=SMALL_SEGMENTS)
    # The last record of the first sealed segment that lies wholly in the undispatched region.
    victim = next(
        i
        for i in range(4, len(setup.results) - 1)
        if setup.segment_of(i)[0] != setup.segment_of(i + 1)[0] and setup.segment_of(i - 1)[0] == setup.segment_of(i)[0]
        if setup.segment_of(3)[0] != setup.segment_of(i)[0]
    )
    segment, pos = setup.segment_of(victim)
    assert segment != setup.segments()[-1]
    flip(segment, pos + setup.results[victim].size - 1)  # its CRC fails right at the end of its file
    before = setup.digest()
    caplog.set_level(logging.INFO)

    with pytest.raises(StoreCorrupted, match=segment.name):
        MessageStore(setup.data_dir, SMALL_SEGMENTS)
    assert setup.digest() == before

    store = MessageStore(setup.data_dir, StoreConfig(commitlog=SMALL_SEGMENTS.commitlog, recovery=TRUNCATE))
    try:
        assert logged(caplog, logging.ERROR, "DISCARDING")
        assert setup.segments()[-1] == segment, "later segments are dropped with the corrupt tail"
        assert_readable(store, victim)
        assert_appends_continue(store, setup, victim)
    finally:
        store.close()


# -- corruption in dispatched records ------------------------------------------------------------------


def test_corrupt_dispatched_record_fails_only_its_reads(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    setup = build(tmp_path, dispatched=10, undispatched=0)
    segment, pos = setup.segment_of(4)
    flip(segment, pos + setup.results[4].size - 3)
    caplog.set_level(logging.INFO)

    store = MessageStore(setup.data_dir, CONFIG)  # nothing to scan: the damage is found on read
    try:
        assert store.recovery.records == 0
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
        with pytest.raises(MessageCorrupted, match=f"commitlog position {setup.results[4].physical_offset}"):
            store.get(TOPIC, 0, 4)
        with pytest.raises(MessageCorrupted):
            store.read(TOPIC, 0, 0, max_messages=10)
        for i in (0, 3, 5, 9):
            assert store.get(TOPIC, 0, i).body == message(i).body
        assert [m.message_id for m in store.read(TOPIC, 0, 0, max_messages=4).messages] == [f"id-{i}" for i in range(4)]
        assert [m.message_id for m in store.read(TOPIC, 0, 5, max_messages=10).messages] == [
            f"id-{i}" for i in range(5, 10)
        ]
        assert_appends_continue(store, setup, 10)
    finally:
        store.close()


# -- the index ahead of the log --------------------------------------------------------------------------

CUTS = {"at_a_record_boundary": 0, "inside_a_header": 3, "inside_a_record": 50}


@pytest.mark.parametrize("cut", CUTS)
def test_lost_log_tail_trims_the_index(tmp_path: Path, caplog: pytest.LogCaptureFixture, cut: str) -> None:
    """The log lost its tail after dispatch (an OS crash under the async policy): the index entries of
    every record that is not wholly in the log go, a partial record is truncated, and appends go on
    from the last whole record."""
    setup = build(tmp_path, dispatched=10, undispatched=0)
    segment, pos = setup.segment_of(6)
    with segment.open("r+b") as fh:
        fh.truncate(pos + CUTS[cut])
    caplog.set_level(logging.INFO)

    store = MessageStore(setup.data_dir, CONFIG)
    try:
        assert logged(caplog, logging.WARNING, "index is ahead")
        assert segment.stat().st_size == pos
        assert_readable(store, 6)
        with pytest.raises(OffsetNotFound):
            store.get(TOPIC, 0, 6)
        assert store.find_by_id("id-6") == []
        assert_appends_continue(store, setup, 6)
        assert [m.message_id for m in store.find_by_id("id-6")] == ["id-6"]  # the new one only
    finally:
        store.close()


def test_retention_after_an_index_trim_keeps_newer_entries(tmp_path: Path) -> None:
    """After a trim, the active segment's per-queue maxima must shrink too: otherwise deleting that
    segment later range-deletes offsets that newer segments reuse."""
    data_dir = tmp_path / "store"
    store = MessageStore(data_dir, SMALL_SEGMENTS)
    kept = store.append_blocking([MessageRecord("trimmed", 0, b"t" * 100, message_id=f"t{i}") for i in range(3)])
    store.append_blocking([MessageRecord("filler", 0, b"f" * 100)])
    store.close()
    (segment,) = sorted((data_dir / "commitlog").glob("*.log"))
    with segment.open("r+b") as fh:  # lose "trimmed" offsets 1 and 2 and the filler
        fh.truncate(kept[1].physical_offset)

    store = MessageStore(data_dir, SMALL_SEGMENTS)
    try:
        assert store.queue_bounds("trimmed", 0) == (0, 1)
        while len(store.segments.all()) < 2:  # roll without "trimmed" records in the old segment
            store.append_blocking([MessageRecord("filler", 0, b"f" * 500)])
        results = store.append_blocking([MessageRecord("trimmed", 0, b"n", message_id=f"n{i}") for i in range(3)])
        assert [r.queue_offset for r in results] == [1, 2, 3]
        assert store.run_retention(now_s=time.time() + 10**6) == 1
        assert store.queue_bounds("trimmed", 0) == (1, 4)
        assert [m.message_id for m in store.read("trimmed", 0, 1).messages] == ["n0", "n1", "n2"]
    finally:
        store.close()
