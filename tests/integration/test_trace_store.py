"""The message trace on real RocksDB: events written in batches, found by position, sent and tiered
ranges, bounded buffer, age-based expiry, and survival across a broker restart."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from broker import tracekeys as K
from broker.client.api import CallContext, TopicSpec, TraceKind
from broker.config import BrokerConfig, TraceConfig
from broker.local import LocalBroker
from broker.store.index import Index
from broker.trace import CF_TRACE, FLUSH_BATCH_EVENTS, TraceRecorder
from common.clock import SYSTEM_CLOCK
from tests.helpers.records import outgoing

HOUR_MS = 3_600_000


@pytest.fixture
def index(tmp_path: Path) -> Iterator[Index]:
    idx = Index(tmp_path / "index", extra_cfs=(CF_TRACE,))
    try:
        yield idx
    finally:
        idx.close()


def recorder(index: Index, **config: object) -> TraceRecorder:
    cfg = TraceConfig(**config)  # type: ignore[arg-type]
    return TraceRecorder("b1", cfg, index.cf(CF_TRACE), index.handle(CF_TRACE), index.batch, index.write)


def test_events_are_found_by_position(index: Index) -> None:
    rec = recorder(index)
    rec.sent("orders", 3, 30, 41, "client-b", "10.0.0.2")  # the batch before: ends before 41
    rec.sent("orders", 3, 41, 43, "client-a", "10.0.0.1")
    rec.delivered("orders", 3, 41, "g1", 1)
    rec.invisible("orders", 3, 41, "g1", 1, 5000)
    rec.delivered("orders", 3, 41, "g1", 2)
    rec.acked("orders", 3, 41, "g1")
    rec.delivered("orders", 3, 42, "g1", 1)  # another message: not in ID-1's trace
    rec.tiered("orders", 3, 0, 41, "seg-a")  # ends before 41
    rec.tiered("orders", 3, 41, 100, "seg-b")
    assert rec.pending == 9
    rec.flush(rec.take())
    assert rec.pending == 0

    events = rec.position_events("orders", 3, 41, "ID-1")
    sent = events[0]
    assert (sent.kind, sent.topic, sent.queue_id, sent.queue_offset, sent.client_id) == (
        TraceKind.SENT, "orders", 3, 41, "client-a",
    )  # fmt: skip
    assert sent.detail["host"] == "10.0.0.1"
    kinds = [(e.kind, e.attempt) for e in events[1:] if e.kind is not TraceKind.TIERED]
    assert kinds == [(TraceKind.DELIVERED, 1), (TraceKind.INVISIBLE, 1), (TraceKind.DELIVERED, 2), (TraceKind.ACKED, 0)]
    [tiered] = [e for e in events if e.kind is TraceKind.TIERED]
    assert tiered.detail["object"] == "seg-b"
    assert {e.message_id for e in events} == {"ID-1"}
    assert [e.kind for e in rec.position_events("orders", 3, 42, "ID-2")] == [
        TraceKind.SENT, TraceKind.DELIVERED, TraceKind.TIERED,
    ]  # fmt: skip
    assert rec.position_events("orders", 3, 100, "ID-3") == []  # past every range
    assert rec.position_events("orders", 2, 41, "ID-4") == []  # another queue


def test_a_send_to_queues_of_their_own_is_one_event_for_its_commitlog_range(index: Index) -> None:
    """A lite or priority send (each message in a queue of its own) is one `sent` event keyed by
    the CommitLog positions the append took; a lookup finds it by the message's position. A store
    written before holds one compact `sent` position event per message: still read."""
    rec = recorder(index)
    rec.sent_append("chats", 1000, 1300, "client-a", "10.0.0.1")  # records at 1000, 1100 and 1200
    assert rec.pending == 1
    rec.delivered("chats", 65537, 0, "g1", 1)
    rec.flush(rec.take())
    [sent] = rec.position_events("chats", 65536, 1, "ID-1", 1200)
    assert (sent.kind, sent.queue_id, sent.queue_offset, sent.client_id, sent.detail["host"]) == (
        TraceKind.SENT, 65536, 1, "client-a", "10.0.0.1",
    )  # fmt: skip
    events = rec.position_events("chats", 65537, 0, "ID-2", 1000)
    assert [(e.kind, e.client_id, e.group) for e in events] == [
        (TraceKind.SENT, "client-a", ""), (TraceKind.DELIVERED, "", "g1"),
    ]  # fmt: skip
    assert rec.position_events("chats", 65538, 0, "ID-3", 1300) == [], "past the append"
    assert rec.position_events("chats", 65538, 0, "ID-3", 999) == [], "before it"
    assert rec.position_events("chats", 65536, 1, "ID-1") == [], "a position is needed to find it"
    # The earlier layout: one compact `sent` position event per message.
    t = SYSTEM_CLOCK.now_ms()
    bucket = t // int(TraceConfig().bucket_s * 1000)
    key = K.position_key(bucket, "chats", 65539, 4, t, 1)
    index.cf(CF_TRACE)[key] = K.encode_compact("sent", 0, b"client-old\0host-old")
    [old] = rec.position_events("chats", 65539, 4, "ID-4", 5000)
    assert (old.kind, old.client_id, old.detail["host"]) == (TraceKind.SENT, "client-old", "host-old")


def test_a_full_buffer_drops_and_counts(index: Index) -> None:
    rec = recorder(index, max_pending_events=2)
    before = REGISTRY.get_sample_value("sluice_trace_events_dropped_total", {"broker": "b1"}) or 0.0
    for offset in range(5):
        rec.acked("t", 0, offset, "g")
    assert rec.pending == 2
    assert REGISTRY.get_sample_value("sluice_trace_events_dropped_total", {"broker": "b1"}) == before + 3


def test_runs_of_a_pop_and_an_ack_are_stored_as_single_events(index: Index) -> None:
    """A pop's deliveries and a request's acks wait as one item each; flushed, they are the same
    events `delivered` and `acked` record one by one (topic `a` one by one, topic `b` as runs)."""
    rec = recorder(index)
    for offset, attempt in ((5, 1), (6, 2)):
        rec.delivered("a", 1, offset, "g1", attempt)
    rec.acked("a", 1, 5, "g1")
    rec.delivered_many("b", "g1", [(1, 5, 1), (1, 6, 2)])
    rec.acked_many("b", "g1", [(1, 5)])
    assert rec.pending == 6
    rec.flush(rec.take())

    def events(topic: str, offset: int) -> list[tuple[TraceKind, int, str]]:
        return [(e.kind, e.attempt, e.group) for e in rec.position_events(topic, 1, offset, "ID")]

    assert events("a", 5) == events("b", 5) == [(TraceKind.DELIVERED, 1, "g1"), (TraceKind.ACKED, 0, "g1")]
    assert events("a", 6) == events("b", 6) == [(TraceKind.DELIVERED, 2, "g1")]


def test_a_large_flush_is_written_in_bounded_batches(index: Index) -> None:
    """Each batch is one replicated state change (one frame to the replicas): a flush of many
    events is cut into batches of at most FLUSH_BATCH_EVENTS, and every event is stored."""
    written: list[int] = []

    def write(batch: object) -> None:
        written.append(len(batch))  # type: ignore[arg-type]
        index.write(batch)  # type: ignore[arg-type]

    cfg = TraceConfig(max_pending_events=10 * FLUSH_BATCH_EVENTS)
    rec = TraceRecorder("b1", cfg, index.cf(CF_TRACE), index.handle(CF_TRACE), index.batch, write)
    n = 2 * FLUSH_BATCH_EVENTS + 7
    rec.delivered_many("t", "g1", [(0, offset, 1) for offset in range(n)])
    rec.flush(rec.take())
    assert len(written) == 3 and max(written) <= FLUSH_BATCH_EVENTS and sum(written) == n
    assert [e.attempt for e in rec.position_events("t", 0, n - 1, "ID")] == [1]


def test_a_full_buffer_drops_the_rest_of_a_run(index: Index) -> None:
    rec = recorder(index, max_pending_events=3)
    before = REGISTRY.get_sample_value("sluice_trace_events_dropped_total", {"broker": "b1"}) or 0.0
    rec.acked("t", 0, 0, "g")
    rec.acked_many("t", "g", [(0, 1), (0, 2), (0, 3)])  # room for two of three
    rec.delivered_many("t", "g", [(0, 4, 1)])  # no room
    assert rec.pending == 3
    assert REGISTRY.get_sample_value("sluice_trace_events_dropped_total", {"broker": "b1"}) == before + 2
    rec.flush(rec.take())
    assert rec.pending == 0
    assert [len(rec.position_events("t", 0, o, "X")) for o in range(5)] == [1, 1, 1, 0, 0]


def test_disabled_trace_records_nothing(index: Index) -> None:
    rec = recorder(index, enabled=False)
    rec.sent("t", 0, 0, 1, "c", "h")
    rec.delivered("t", 0, 0, "g", 1)
    assert rec.pending == 0


def test_old_buckets_expire(index: Index) -> None:
    rec = recorder(index, max_age_s=3600.0, bucket_s=60.0)
    rec.sent("t", 0, 7, 8, "c", "h")
    rec.acked("t", 0, 7, "g")
    rec.flush(rec.take())
    assert len(rec.position_events("t", 0, 7, "OLD")) == 2
    rec.expire(now=SYSTEM_CLOCK.now_ms() + 2 * HOUR_MS)  # two hours from now, everything recorded now is too old
    assert rec.position_events("t", 0, 7, "OLD") == []


def test_trace_survives_a_broker_restart(tmp_path: Path) -> None:
    config = BrokerConfig(name="trace-broker", data_dir=tmp_path / "broker")

    async def send_and_close() -> str:
        broker = LocalBroker(config)
        await broker.start()
        await broker.create_topic(TopicSpec("restart-topic", 1))
        msg = outgoing(body=b"kept", message_id="ID-RESTART")
        await broker.send("restart-topic", 0, [msg], ctx=CallContext(client_id="c9"))
        await broker.close()  # the trace writer flushes what is pending before the store closes
        return msg.message_id

    async def trace_after_restart(message_id: str) -> list[tuple[TraceKind, str]]:
        broker = LocalBroker(config)
        await broker.start()
        try:
            return [(e.kind, e.client_id) for e in await broker.message_trace(message_id)]
        finally:
            await broker.close()

    message_id = asyncio.run(send_and_close())
    assert asyncio.run(trace_after_restart(message_id)) == [(TraceKind.SENT, "c9")]
