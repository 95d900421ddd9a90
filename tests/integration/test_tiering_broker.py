"""Tiered storage wired into the broker: a real `LocalBroker` (and a `sluice broker` process) over moto S3.

- Cold replay: messages tiered with `tier_upload_now`, their local copies dropped with
  `tier_evict_local` (index entries and whole CommitLog segments), then popped by a new group from
  the start, pulled from offset 0, found by id and key and by time: identical to the hot copy, in order.
- Outage: with S3 stopped, produce and consume of hot data work, retention deletes nothing untiered,
  `upload_now` fails with a retriable error, and once S3 is back the backlog goes up on its own and
  retention resumes; a pop that needs S3 while it is down fails fast with `Unavailable`.
- Corruption: a damaged object fails reads of its range with an error naming the object; other
  segments stay readable.
- Crash: a broker process SIGKILLed while uploading restarts with consistent manifests (no gap, no
  overlapping range, every listed object present) and serves everything back.
- Redelivery and FIFO-held messages, and groups starting at a time, come from the bucket too.
- Tiered retention (per topic) runs in the broker's retention loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import pytest

from broker.client.api import (
    ConsumeFrom,
    FilterSpec,
    GroupSpec,
    OffsetPolicy,
    PopRequest,
    StoredMessage,
    TopicSpec,
)
from broker.client.remote import RemoteBroker
from broker.config import BrokerConfig
from broker.local import LocalBroker
from broker.store.config import CommitLogConfig, RetentionConfig, StoreConfig
from broker.tiering.config import TieringConfig
from common import record
from common.errors import MessageCorrupted, PreconditionFailed, Unavailable
from common.model import MessageType
from tests.helpers.broker_fixtures import start_broker_process

if TYPE_CHECKING:
    from tests.helpers.s3 import MotoS3Server

pytest_plugins = ["tests.helpers.s3"]

T = TypeVar("T")
TOPIC = "orders"
QUEUES = 2
WAIT_S = 60.0
SEGMENT_BYTES = 64 << 10


def run(coro: Awaitable[T]) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(coro, WAIT_S)

    return asyncio.run(bounded())


async def eventually(check: Callable[[], Awaitable[bool]], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


def broker_config(data_dir: Path, tiering: TieringConfig, *, retention_age_s: float = 7 * 86400.0) -> BrokerConfig:
    store = StoreConfig(
        commitlog=CommitLogConfig(segment_bytes=SEGMENT_BYTES),
        retention=RetentionConfig(max_age_s=retention_age_s, max_disk_used_ratio=1.0, check_interval_s=0.2),
    )
    return BrokerConfig(name="broker-t", cluster="tier-test", data_dir=data_dir, store=store, tiering=tiering)


@pytest.fixture
def tiering(s3_config: TieringConfig) -> TieringConfig:
    # min_age_s keeps the background uploader idle: the tests decide when data is tiered.
    return dataclasses.replace(
        s3_config, min_age_s=3600.0, segment_target_bytes=16 << 10, row_group_rows=16, row_group_bytes=8 << 10,
        mirror_interval_s=0.0, scan_interval_s=0.2,
    )  # fmt: skip


def outgoing(i: int, **fields: Any) -> bytes:
    return record.outgoing(
        body=(f"order {i} shipped to customer {i % 17}; " * 8).encode(), message_id=f"msg-{i:05d}",
        tag="even" if i % 2 == 0 else "odd", keys=(f"key-{i}", f"customer-{i % 17}"),
        properties={"n": str(i), "ключ": "значение"}, born_timestamp_ms=1_700_000_000_000 + i, born_host="10.1.1.1",
        **fields,
    )  # fmt: skip


async def produce(
    broker: LocalBroker | RemoteBroker, first: int, count: int, batch: int = 10, queues: int = QUEUES
) -> None:
    for start in range(first, first + count, batch):
        q = (start // batch) % queues
        await broker.send(TOPIC, q, [outgoing(i) for i in range(start, min(start + batch, first + count))])


def same(m: StoredMessage) -> tuple[Any, ...]:
    """Everything a consumer sees of a message except per-delivery fields."""
    return (m.topic, m.queue_id, m.queue_offset, m.body, m.message_id, m.message_type, m.tag, m.keys,
            m.message_group, m.properties, m.system_properties, m.born_timestamp_ms, m.born_host,
            m.store_timestamp_ms, m.store_host, m.body_gzip)  # fmt: skip


async def pull_all(broker: LocalBroker | RemoteBroker, queue_id: int, start: int = 0) -> list[StoredMessage]:
    out: list[StoredMessage] = []
    offset = start
    while True:
        res = await broker.pull("puller", TOPIC, queue_id, offset, 32, FilterSpec())
        out.extend(res.messages)
        if res.next_offset >= res.max_offset:
            return out
        assert res.next_offset > offset, f"pull did not advance at {offset}: {res}"
        offset = res.next_offset


async def pop_all(broker: LocalBroker, group: str, count: int) -> list[StoredMessage]:
    got: list[StoredMessage] = []
    deadline = time.monotonic() + WAIT_S / 2
    while len(got) < count:
        assert time.monotonic() < deadline, f"popped {len(got)} of {count}"
        batch = await broker.pop(PopRequest(group, TOPIC, max_messages=16, invisible_ms=60_000, long_poll_ms=200))
        if batch:
            await broker.ack(group, TOPIC, [m.receipt_handle for m in batch])
        got.extend(batch)
    return got


def test_cold_replay_lookups_and_offsets(tmp_path: Path, tiering: TieringConfig) -> None:
    async def body() -> None:
        broker = LocalBroker(broker_config(tmp_path / "b", tiering))
        await broker.start()
        try:
            await broker.create_topic(TopicSpec(TOPIC, QUEUES))
            await produce(broker, 0, 400)
            hot = {q: await pull_all(broker, q) for q in range(QUEUES)}
            assert sum(len(v) for v in hot.values()) == 400

            status = await broker.tier_upload_now(TOPIC, 30.0)
            assert status.lag_messages == 0 and status.objects > 1
            assert {q.queue_id: (q.tiered_min, q.tiered_end) for q in status.queues} == {0: (0, 200), 1: (0, 200)}
            evicted = await broker.tier_evict_local(TOPIC)
            assert evicted.messages == 400 and evicted.segments >= 1
            assert broker.store.queue_bounds(TOPIC, 0) == (200, 200)  # nothing of the topic is read locally

            # A new group from the start pops everything, from the bucket, identical and in order.
            await broker.create_group(GroupSpec("replay", consume_from=ConsumeFrom.EARLIEST))
            popped = await pop_all(broker, "replay", 400)
            for q in range(QUEUES):
                mine = [same(m) for m in popped if m.queue_id == q]
                assert mine == [same(m) for m in hot[q]]
            # Pull from offset 0 too, and offsets and lookups answer from the bucket.
            for q in range(QUEUES):
                assert [same(m) for m in await pull_all(broker, q)] == [same(m) for m in hot[q]]
            assert await broker.query_offset(TOPIC, 0, OffsetPolicy.BEGINNING) == 0
            mid = hot[1][50]
            assert await broker.query_offset(TOPIC, 1, OffsetPolicy.TIMESTAMP, mid.store_timestamp_ms) <= 50
            assert (await broker.topic_status(TOPIC)).queues[0].min_offset == 0
            found = await broker.get_message(TOPIC, "msg-00007")
            assert [same(m) for m in found] == [same(m) for m in hot[0] if m.message_id == "msg-00007"]
            by_key = await broker.find_messages_by_key(TOPIC, "customer-3")
            assert sorted(m.message_id for m in by_key) == [f"msg-{i:05d}" for i in range(400) if i % 17 == 3]

            # A group starting at a time inside the tiered range starts there.
            since = hot[0][100].store_timestamp_ms
            await broker.create_group(GroupSpec("since", consume_from=ConsumeFrom.TIMESTAMP,
                                                consume_from_timestamp_ms=since))  # fmt: skip
            expected = sorted((m.queue_id, m.queue_offset) for q in range(QUEUES) for m in hot[q]
                              if m.store_timestamp_ms >= since)  # fmt: skip
            timed = await pop_all(broker, "since", len(expected))
            assert sorted((m.queue_id, m.queue_offset) for m in timed) == expected
            # Queue 0 starts at its first message stored at or after `since`: offset 100, or an earlier
            # one appended in the same millisecond (one group-commit round stamps its records alike).
            first = next(m.queue_offset for m in hot[0] if m.store_timestamp_ms >= since)
            assert first <= 100 and min(m.queue_offset for m in timed if m.queue_id == 0) == first

            # New messages after the eviction are hot again and follow on without a gap.
            await produce(broker, 400, 20)
            tail = await pop_all(broker, "replay", 20)
            assert sorted(m.message_id for m in tail) == [f"msg-{i:05d}" for i in range(400, 420)]
            assert broker.store.queue_bounds(TOPIC, 0)[0] == 200
        finally:
            await broker.close()

    run(body())


def test_without_tiering_the_admin_calls_say_how_to_turn_it_on(tmp_path: Path) -> None:
    async def body() -> None:
        broker = LocalBroker(broker_config(tmp_path / "b", TieringConfig()))
        await broker.start()
        try:
            await broker.create_topic(TopicSpec(TOPIC, 1))
            assert (await broker.tier_status()).enabled is False
            with pytest.raises(PreconditionFailed, match="--s3-bucket"):
                await broker.tier_upload_now(TOPIC, 5.0)
            with pytest.raises(PreconditionFailed, match="not configured"):
                await broker.tier_evict_local(TOPIC)
        finally:
            await broker.close()

    run(body())


def test_s3_outage_hot_path_unaffected_backlog_uploads_after(
    tmp_path: Path, tiering: TieringConfig, s3_server: MotoS3Server, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    # Everything is due at once, and retention wants to delete every sealed segment immediately.
    cfg = dataclasses.replace(tiering, min_age_s=0.0, segment_max_age_s=0.0)

    async def body() -> None:
        broker = LocalBroker(broker_config(tmp_path / "b", cfg, retention_age_s=0.01))
        await broker.start()
        try:
            await broker.create_topic(TopicSpec(TOPIC, 1))
            await broker.create_group(GroupSpec("live", consume_from=ConsumeFrom.EARLIEST))
            s3_server.stop()
            await produce(broker, 0, 300, queues=1)
            segments_before = len(broker.store.segments.all())
            assert segments_before > 1
            live = await pop_all(broker, "live", 300)
            assert len({m.message_id for m in live}) == 300

            async def failing() -> bool:
                st = await broker.tier_status()
                return bool(st.topics) and st.topics[0].failures > 0

            await eventually(failing, "the uploader to report S3 failures")
            st = (await broker.tier_status()).topics[0]
            assert st.lag_messages == 300 and st.last_error
            await asyncio.sleep(1.0)  # several retention rounds
            assert len(broker.store.segments.all()) == segments_before, "untiered data was deleted"
            assert "local deletion of untiered data is paused and the disk keeps filling" in caplog.text
            assert broker.store.queue_bounds(TOPIC, 0)[0] == 0
            with pytest.raises(Unavailable):
                await broker.tier_upload_now(TOPIC, 0.5)

            s3_server.start()

            async def uploaded() -> bool:
                st = await broker.tier_status()
                return st.topics[0].lag_messages == 0 and st.topics[0].failures == 0

            await eventually(uploaded, "the backlog to be uploaded")

            async def trimmed() -> bool:
                return broker.store.queue_bounds(TOPIC, 0)[0] > 0

            await eventually(trimmed, "retention to resume once data is tiered")

            # A replay from the start reads the bucket; with S3 down it fails fast, hot consumers don't.
            await broker.create_group(GroupSpec("replay", consume_from=ConsumeFrom.EARLIEST))
            s3_server.stop()
            started = time.monotonic()
            with pytest.raises(Unavailable) as err:
                await broker.pop(PopRequest("replay", TOPIC, max_messages=16, invisible_ms=60_000))
            assert err.value.retriable and time.monotonic() - started < 20.0
            await produce(broker, 300, 5, batch=5, queues=1)
            fresh = await pop_all(broker, "live", 5)
            assert sorted(m.message_id for m in fresh) == [f"msg-{i:05d}" for i in range(300, 305)]
            s3_server.start()
            replay = await pop_all(broker, "replay", 305)
            assert [m.message_id for m in replay] == [f"msg-{i:05d}" for i in range(305)]
        finally:
            if not s3_server.running:
                s3_server.start()
            await broker.close()

    run(body())


def test_corrupt_object_fails_only_its_range(tmp_path: Path, tiering: TieringConfig, s3_server: MotoS3Server) -> None:
    async def body() -> None:
        broker = LocalBroker(broker_config(tmp_path / "b", tiering))
        await broker.start()
        try:
            await broker.create_topic(TopicSpec(TOPIC, 1))
            await produce(broker, 0, 300, queues=1)
            await broker.tier_upload_now(TOPIC, 30.0)
            await broker.tier_evict_local(TOPIC)
            tier = broker.tiering
            assert tier is not None
            first, second = tier.manifest.segments(TOPIC)[:2]
            data = s3_server.client().get_object(Bucket=tiering.bucket, Key=first.key)["Body"].read()
            s3_server.client().put_object(Bucket=tiering.bucket, Key=first.key, Body=data[: len(data) // 2])
            with pytest.raises(MessageCorrupted, match=first.key):
                await broker.pull("g", TOPIC, 0, 0, 8, FilterSpec())
            start = second.queues[0][0]
            res = await broker.pull("g", TOPIC, 0, start, 8, FilterSpec())
            assert [m.queue_offset for m in res.messages] == list(range(start, start + 8))
        finally:
            await broker.close()

    run(body())


def _check_mirror(client: Any, bucket: str, prefix: str) -> dict[int, int]:
    """The bucket's manifest.json of the topic: contiguous queue ranges, every object present."""
    keys = {o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])}
    mirror_key = next(k for k in keys if k.endswith(f"/{TOPIC}/manifest.json"))
    doc = json.loads(client.get_object(Bucket=bucket, Key=mirror_key)["Body"].read())
    nxt: dict[int, int] = {}
    for seg in doc["segments"]:
        assert seg["key"] in keys, f"manifest lists missing object {seg['key']}"
        for q, (first, last) in seg["queues"].items():
            assert first == nxt.get(int(q), 0), f"queue {q}: segment {seg['seq']} starts at {first}, expected {nxt}"
            nxt[int(q)] = last + 1
    assert {int(q): e for q, e in doc["tiered_end"].items()} == nxt
    return nxt


def test_sigkill_mid_upload_restart_is_consistent(
    tmp_path: Path, tiering: TieringConfig, s3_server: MotoS3Server
) -> None:
    cfg = dataclasses.replace(tiering, min_age_s=0.0, segment_max_age_s=0.0, segment_target_bytes=4 << 10,
                              scan_interval_s=0.05)  # fmt: skip
    settings = {
        "name": "broker-k", "cluster": "tier-test",
        "store": {"commitlog": {"segment_bytes": SEGMENT_BYTES}},
        "tiering": {k: v for k, v in dataclasses.asdict(cfg).items() if k != "topic_retention_s"},
    }  # fmt: skip
    total = 1500

    async def produce_and_kill() -> None:
        proc = await asyncio.to_thread(start_broker_process, tmp_path, settings=settings)
        try:
            async with RemoteBroker(proc.name, proc.address, timeout_s=10.0) as remote:
                await remote.create_topic(TopicSpec(TOPIC, QUEUES))
                await produce(remote, 0, total, batch=50)

                async def uploading() -> bool:
                    st = (await remote.tier_status()).topics
                    return bool(st) and st[0].objects >= 3 and st[0].lag_messages > 0

                await eventually(uploading, "uploads to be under way")
                proc.child.signal(signal.SIGKILL)
                proc.child.popen.wait(timeout=10)
        finally:
            proc.stop()

    async def restart_and_check() -> None:
        proc = await asyncio.to_thread(start_broker_process, tmp_path, settings=settings)
        try:
            async with RemoteBroker(proc.name, proc.address, timeout_s=10.0) as remote:
                st = await remote.tier_upload_now(TOPIC, 30.0)
                assert st.lag_messages == 0
                ends = _check_mirror(s3_server.client(), cfg.bucket, cfg.prefix)
                assert sum(ends.values()) == total
                await remote.tier_evict_local(TOPIC)
                ids: list[str] = []
                for q in range(QUEUES):
                    ids += [m.message_id for m in await pull_all(remote, q)]
                assert sorted(ids) == [f"msg-{i:05d}" for i in range(total)]
        finally:
            assert proc.stop() == 0

    run(produce_and_kill())
    run(restart_and_check())


def test_redelivery_and_fifo_order_from_the_bucket(tmp_path: Path, tiering: TieringConfig) -> None:
    """In-flight and FIFO-held messages whose local copy is gone come back from the bucket."""

    async def body() -> None:
        cfg = broker_config(tmp_path / "b", tiering)
        cfg = dataclasses.replace(cfg, pop=dataclasses.replace(cfg.pop, min_invisible_ms=200))
        broker = LocalBroker(cfg)
        await broker.start()
        try:
            await broker.create_topic(TopicSpec(TOPIC, 1, frozenset({MessageType.NORMAL, MessageType.FIFO})))
            fifo = [outgoing(i, message_type=MessageType.FIFO, message_group=f"g{i % 3}") for i in range(60)]
            for start in range(0, 60, 10):
                await broker.send(TOPIC, 0, fifo[start : start + 10])
            await broker.tier_upload_now(TOPIC, 30.0)
            assert (await broker.tier_evict_local(TOPIC)).messages == 60

            # Not acked: redelivered (attempt 2) from the bucket once invisible time is over.
            await broker.create_group(GroupSpec("plain", consume_from=ConsumeFrom.EARLIEST))
            first = await broker.pop(PopRequest("plain", TOPIC, max_messages=5, invisible_ms=200))
            assert [m.queue_offset for m in first] == [0, 1, 2, 3, 4]
            await asyncio.sleep(0.4)
            again = await broker.pop(PopRequest("plain", TOPIC, max_messages=5, invisible_ms=60_000))
            assert [(m.queue_offset, m.delivery_attempt) for m in again] == [(o, 2) for o in range(5)]
            assert [m.body for m in again] == [m.body for m in first]

            # FIFO: one message per message group in flight; the held ones come from the bucket in order.
            await broker.create_group(GroupSpec("ordered", fifo=True, consume_from=ConsumeFrom.EARLIEST))
            seen: dict[str, list[int]] = {}
            deadline = time.monotonic() + WAIT_S / 2
            while sum(len(v) for v in seen.values()) < 60:
                assert time.monotonic() < deadline, f"FIFO replay stalled at {seen}"
                batch = await broker.pop(
                    PopRequest("ordered", TOPIC, max_messages=16, invisible_ms=60_000, long_poll_ms=200)
                )
                groups = [m.message_group for m in batch]
                assert len(groups) == len(set(groups)), "two messages of one group in flight"
                for m in batch:
                    seen.setdefault(m.message_group or "", []).append(int(m.properties["n"]))
                if batch:
                    await broker.ack("ordered", TOPIC, [m.receipt_handle for m in batch])
            assert seen == {f"g{k}": [i for i in range(60) if i % 3 == k] for k in range(3)}
        finally:
            await broker.close()

    run(body())


def test_tiered_retention_per_topic_runs_in_the_broker(
    tmp_path: Path, tiering: TieringConfig, s3_server: MotoS3Server
) -> None:
    """The retention loop applies tiered retention: the short-lived topic's objects go, the other stays."""
    cfg = dataclasses.replace(tiering, retention_s=0.0, topic_retention_s={TOPIC: 1.0})

    async def body() -> None:
        broker = LocalBroker(broker_config(tmp_path / "b", cfg))
        await broker.start()
        try:
            for name in (TOPIC, "kept"):
                await broker.create_topic(TopicSpec(name, 1))
                await broker.send(name, 0, [outgoing(i) for i in range(20)])
                await broker.tier_upload_now(name, 30.0)
                await broker.tier_evict_local(name)
            client, prefix = s3_server.client(), cfg.prefix

            def objects(topic: str) -> list[str]:
                listed = client.list_objects_v2(Bucket=cfg.bucket, Prefix=prefix).get("Contents", [])
                return [o["Key"] for o in listed if f"/{topic}/" in o["Key"] and o["Key"].endswith(".parquet")]

            assert objects(TOPIC) and objects("kept")

            async def expired() -> bool:
                return not objects(TOPIC)

            await eventually(expired, "tiered retention of the short-lived topic")
            assert objects("kept")
            status = {t.topic: t for t in (await broker.tier_status()).topics}
            assert status[TOPIC].objects == 0 and status["kept"].objects >= 1
            # Nothing of the topic is readable any more: its first offset is where the local copy starts.
            assert await broker.query_offset(TOPIC, 0, OffsetPolicy.BEGINNING) == 20
            assert await broker.query_offset("kept", 0, OffsetPolicy.BEGINNING) == 0
        finally:
            await broker.close()

    run(body())
