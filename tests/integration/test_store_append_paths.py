"""The writer's and dispatcher's append paths write the same log and index as record by record.

One-queue appends of `writer.RUN_MIN` records or more are runs of their own, which the dispatcher
indexes with C-level maps (`writer.Run`, `dispatcher.index_runs`); smaller ones (single sends)
share a run; an append to several queues (a lite or priority send) is a run of its own whose
results are columns too, and a segment roll inside an append splits it into one run per segment,
record by record. Recovery re-dispatches with the per-record path
(`index_records`). So: append a mix of all shapes, dump every index entry, rebuild the index from
the CommitLog alone, and the dumps must be equal; every record must read back, by queue, id, key
and tag, with bytes equal to `encode` + `seal`. All of it three ways: every append written by the
event loop (the default for appends this small), every append handed to the writer thread, and
both at once (appends above a small inline limit go to the thread while the loop writes the rest).
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import shutil
from collections.abc import Sequence
from pathlib import Path

import pytest

from broker.store import keys as K
from broker.store import writer as writer_module
from broker.store.config import CommitLogConfig, StoreConfig
from broker.store.store import MessageStore
from broker.store.writer import AppendResult
from broker.tags import tag_hash
from common.errors import StoreClosed, Unavailable
from common.record import MessageRecord, encode, seal

SEGMENT_BYTES = 64 << 10  # small: some appends roll the segment in their middle
CONFIG = StoreConfig(commitlog=CommitLogConfig(segment_bytes=SEGMENT_BYTES))


def message(n: int, topic: str, queue_id: int, *, id_len: int = 32, keys: tuple[str, ...] = ()) -> MessageRecord:
    return MessageRecord(
        topic=topic,
        queue_id=queue_id,
        body=(f"body-{n}-".encode() * 40)[: 200 + n % 900],
        message_id=f"{n:0{id_len}x}"[-id_len:] if id_len else "",
        tag=("a", "b", None)[n % 3],
        keys=keys,
        born_timestamp_ms=1_700_000_000_000 + n,
        born_host="10.0.0.1:7",
    )


def shapes() -> list[list[MessageRecord]]:
    """Appends of every shape the writer distinguishes, in a fixed order."""
    n = 0

    def nxt(topic: str, queue_id: int, **kw: object) -> MessageRecord:
        nonlocal n
        n += 1
        return message(n, topic, queue_id, **kw)  # type: ignore[arg-type]

    out: list[list[MessageRecord]] = []
    for rnd in range(12):
        out.append([nxt("orders", rnd % 3) for _ in range(40)])  # one queue, vectored
        out.append([nxt("orders", 0)])  # single sends share a run
        out.append([nxt("pay-ü", 1, keys=("k1", f"k-{rnd}"))])
        out.append([nxt("orders", 2) for _ in range(3)])  # below RUN_MIN: shares the round's run
        out.append([nxt("orders", rnd % 2, id_len=24 + i % 3) for i in range(8)])  # ids of several lengths
        out.append([nxt("pay-ü", 0, id_len=0) for _ in range(5)])  # no message ids
        out.append([nxt("pay-ü", 3, keys=("k1",)) for _ in range(6)])  # keys on the vectored path
        out.append([nxt(("orders", "pay-ü", "日志")[i % 3], i % 4) for i in range(9)])  # mixed queues
        # One topic, several queues, some twice (a lite send), with keys on some.
        out.append([nxt("orders", 65536 + i % 5, keys=("k2",) if i % 2 else ()) for i in range(12)])
    return out


def dump(store: MessageStore) -> dict[str, list[tuple[bytes, bytes]]]:
    out = {cf: list(store.index.cf(cf).items()) for cf in (K.CF_MSGID, K.CF_KEYIDX, K.CF_META)}
    # `segq` lists each queue of a segment with an offset of it there, put once per process (the
    # live dispatch) or per record (recovery): compare the highest offset each one leads to.
    ends = {seg.base: seg.end for seg in store.segments.all()}
    out[K.CF_SEGQ] = []
    for key, value in store.index.cf(K.CF_SEGQ).items():
        base, tid, qid = K.segq_key_parse(key)
        highest = store.index.segment_queue_max(tid, qid, K.U64.unpack(value)[0], ends[base])
        out[K.CF_SEGQ].append((key, K.U64.pack(highest)))
    # ConsumeQueue blocks are cut where rounds (or recovery's batches) end, so compare entries:
    # every block expanded to one (key, entry) per offset, as stores kept them before blocks.
    entries = []
    for key, value in store.index.cf(K.CF_CQ).items():
        tid, qid, first = K.cq_key_parse(key)
        assert value and len(value) % K.CQ_ENTRY == 0 and len(value) // K.CQ_ENTRY <= K.CQ_BLOCK_MAX
        for i in range(len(value) // K.CQ_ENTRY):
            entries.append((K.cq_key(tid, qid, first + i), value[i * K.CQ_ENTRY : (i + 1) * K.CQ_ENTRY]))
    out[K.CF_CQ] = entries
    return out


async def append_concurrently(store: MessageStore, appends: list[list[MessageRecord]]) -> list[Sequence[AppendResult]]:
    # All at once: the writer group-commits many appends of different shapes per round.
    return list(await asyncio.gather(*(store.append(a) for a in appends)))


@pytest.mark.parametrize("inline_bytes", [64 << 10, 0, 4 << 10], ids=["loop", "thread", "both"])
def test_fast_paths_write_what_record_by_record_writes(tmp_path: Path, inline_bytes: int) -> None:
    appends = shapes()
    config = dataclasses.replace(
        CONFIG, commitlog=dataclasses.replace(CONFIG.commitlog, inline_append_max_bytes=inline_bytes)
    )
    store = MessageStore(tmp_path / "s", config)
    try:
        results = asyncio.run(append_concurrently(store, appends))
        assert store.wait_dispatched(30)
        assert len(store.segments.all()) > 3, "the test needs segment rolls"
        before = dump(store)
        per_queue: dict[tuple[str, int], list[int]] = {}
        for batch, res in zip(appends, results, strict=True):
            assert len(res) == len(batch)
            for rec, r in zip(batch, res, strict=True):
                per_queue.setdefault((rec.topic, rec.queue_id), []).append(r.queue_offset)
                # The log holds exactly encode + seal of the record (format v1 bytes).
                expected = encode(dataclasses.replace(rec))
                seal(expected, r.queue_offset, r.physical_offset, r.store_timestamp_ms)
                assert store.segments.read(r.physical_offset, r.size) == bytes(expected)
                got = store.get(rec.topic, rec.queue_id, r.queue_offset)
                assert (got.body, got.message_id, got.tag) == (rec.body, rec.message_id, rec.tag)
                if rec.message_id:
                    assert [m.physical_offset for m in store.find_by_id(rec.message_id)] == [r.physical_offset]
        for queue, offsets in per_queue.items():
            assert sorted(offsets) == list(range(len(offsets))), f"queue offsets of {queue} are not 0..n-1"
            assert store.queue_bounds(*queue) == (0, len(offsets))
        assert len(store.find_by_key("pay-ü", "k1", limit=1000)) == 12 + 12 * 6
        assert len(store.find_by_key("orders", "k2", limit=1000)) == 12 * 6
        read = store.read("orders", 0, 0, max_messages=1000, tag_hashes=frozenset({tag_hash("a")}))
        assert read.messages and all(m.tag == "a" for m in read.messages)
    finally:
        store.close()

    # Rebuild the index from the CommitLog alone: recovery dispatches record by record.
    shutil.rmtree(tmp_path / "s" / "index")
    store = MessageStore(tmp_path / "s", CONFIG)
    try:
        assert store.recovery is not None and store.recovery.records == sum(map(len, appends))
        after = dump(store)
    finally:
        store.close()
    assert after == before


def test_an_append_left_for_the_loop_when_the_store_closes_fails_with_store_closed(tmp_path: Path) -> None:
    async def run() -> None:
        store = MessageStore(tmp_path / "s", CONFIG)
        first = await store.append([message(1, "orders", 0)])
        pending = asyncio.ensure_future(store.append([message(2, "orders", 0)]))
        await asyncio.sleep(0)  # the append is made and waits for the loop's round
        store.close()  # before that round runs
        with pytest.raises(StoreClosed):
            await pending
        reopened = MessageStore(tmp_path / "s", CONFIG)
        try:
            assert reopened.queue_bounds("orders", 0) == (0, 1)
            assert reopened.get("orders", 0, first[0].queue_offset).message_id == message(1, "orders", 0).message_id
        finally:
            reopened.close()

    asyncio.run(run())


def test_a_failed_round_gives_its_queue_offsets_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A round whose write fails is rolled back: the next appends take the offsets it had taken,
    for one queue and for several alike."""
    store = MessageStore(tmp_path / "s", CONFIG)
    try:
        store.append_blocking([message(i, "orders", 0) for i in range(5)])
        store.append_blocking([message(10 + i, "orders", 65536 + i % 3) for i in range(6)])
        real = writer_module.os.pwritev

        def disk_full(*args: object) -> int:
            monkeypatch.setattr(writer_module.os, "pwritev", real)  # once
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(writer_module.os, "pwritev", disk_full)
        with pytest.raises(Unavailable):
            store.append_blocking([message(20 + i, "orders", 65536 + i % 3) for i in range(6)])
        mixed = store.append_blocking([message(30 + i, "orders", 65536 + i % 3) for i in range(6)])
        one = store.append_blocking([message(40 + i, "orders", 0) for i in range(5)])
        assert [r.queue_offset for r in mixed] == [2, 2, 2, 3, 3, 3]
        assert [r.queue_offset for r in one] == [5, 6, 7, 8, 9]
        assert store.wait_dispatched(30)
        assert [store.queue_bounds("orders", q) for q in (0, 65536, 65537, 65538)] == [(0, 10), (0, 4), (0, 4), (0, 4)]
        assert store.get("orders", 65537, 2).body == message(31, "orders", 0).body
    finally:
        store.close()
