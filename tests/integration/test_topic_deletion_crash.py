"""A `sluice broker` SIGKILLed right after a topic was deleted and created again (async flush, so the
deletion record and the new messages were acknowledged before any fsync): restarted on the same
data, it serves nothing of the old topic and everything acknowledged since, through `RemoteBroker`.

Before the kill: messages of the topic, some popped and held un-acked (in flight), and a DELAY
message due after the restart; then `delete_topic`, `create_topic`, new messages. After the
restart: a pull from offset 0 and a new group from the earliest message see exactly the new
messages; the group that held old messages gets the new ones and never its old ones (their
invisibility passes), whose acks are refused as of a deleted topic; the timer never fires; the
queues' offsets went on where the old topic ended.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from broker.client.api import ConsumeFrom, FilterSpec, GroupSpec, PopRequest, StoredMessage, TopicSpec
from broker.client.remote import RemoteBroker
from common.errors import InvalidReceiptHandle
from common.model import MessageType
from tests.helpers.records import outgoing
from tests.integration.test_broker_crash import BROKER_NAME, INVISIBLE_MS, BrokerProcess

pytestmark = pytest.mark.slow

TOPIC = "deleted-then-killed"
TYPES = frozenset({MessageType.NORMAL, MessageType.DELAY})
QUEUES = 2
OLD, NEW = 40, 20
DELAY_S = 3.0
WATCH_S = 1.5  # how long a group is watched for what it is handed
BOUND_S = 60.0


async def pop_all(broker: RemoteBroker, group: str, until: float) -> list[StoredMessage]:
    """Everything the group is handed (and acks) until the monotonic time `until`."""
    got: list[StoredMessage] = []
    while time.monotonic() < until:
        batch = await broker.pop(PopRequest(group, TOPIC, max_messages=32, invisible_ms=INVISIBLE_MS, long_poll_ms=300))
        got += batch
        if batch:
            assert all(r.ok for r in await broker.ack(group, TOPIC, [m.receipt_handle for m in batch]))
    return got


async def pulled_from_zero(broker: RemoteBroker, queue_id: int) -> list[str]:
    """The ids a pull consumer starting at offset 0 reads (told where the queue starts, it goes on there)."""
    ids: list[str] = []
    offset = 0
    while True:
        res = await broker.pull("puller", TOPIC, queue_id, offset, 64, FilterSpec())
        ids += [m.message_id for m in res.messages]
        if res.next_offset >= res.max_offset:
            return ids
        offset = res.next_offset


def test_a_deletion_survives_a_sigkill_right_after(tmp_path: Path) -> None:
    process = BrokerProcess(tmp_path)
    process.start()

    async def before() -> tuple[list[str], list[str], list[StoredMessage]]:
        broker = RemoteBroker(BROKER_NAME, process.address)
        try:
            await broker.create_topic(TopicSpec(TOPIC, QUEUES, TYPES))
            await broker.create_group(GroupSpec("held", consume_from=ConsumeFrom.EARLIEST))
            old = [outgoing(body=f"old-{i}".encode(), message_id=f"old-{i}") for i in range(OLD)]
            for q in range(QUEUES):
                await broker.send(TOPIC, q, old[q::QUEUES])
            due = int(time.time() * 1000 + DELAY_S * 1000)
            timer = outgoing(body=b"old-timer", message_id="old-timer", message_type=MessageType.DELAY,
                             delivery_timestamp_ms=due)  # fmt: skip
            await broker.send(TOPIC, 0, [timer])
            held: list[StoredMessage] = []
            while len(held) < OLD // 2:
                held += await broker.pop(PopRequest("held", TOPIC, max_messages=8, invisible_ms=INVISIBLE_MS))
            await broker.delete_topic(TOPIC)
            await broker.create_topic(TopicSpec(TOPIC, QUEUES, TYPES))
            new = [outgoing(body=f"new-{i}".encode(), message_id=f"new-{i}") for i in range(NEW)]
            for q in range(QUEUES):
                await broker.send(TOPIC, q, new[q::QUEUES])  # acknowledged: each must survive the kill
            return [m.message_id for m in old], [m.message_id for m in new], held
        finally:
            await broker.close()

    async def after(new: list[str], held: list[StoredMessage]) -> None:
        broker = RemoteBroker(BROKER_NAME, process.address)
        try:
            status = await broker.topic_status(TOPIC)
            assert [(q.min_offset, q.max_offset) for q in status.queues] == [(OLD // QUEUES, (OLD + NEW) // QUEUES)] * 2
            assert status.pending_timers == 0
            assert sorted([m for q in range(QUEUES) for m in await pulled_from_zero(broker, q)]) == sorted(new)
            results = await broker.ack("held", TOPIC, [m.receipt_handle for m in held])
            assert all(isinstance(r.error, InvalidReceiptHandle) and "deleted" in r.error.message for r in results)
            await broker.create_group(GroupSpec("fresh", consume_from=ConsumeFrom.EARLIEST))
            until = time.monotonic() + max(DELAY_S, INVISIBLE_MS / 1000) + 1.0  # the timer's due, the invisibility past
            held_got = await pop_all(broker, "held", until)
            assert sorted(m.message_id for m in held_got) == sorted(new), "the group that held old messages"
            fresh_got = await pop_all(broker, "fresh", time.monotonic() + WATCH_S)
            assert sorted(m.message_id for m in fresh_got) == sorted(new), "a new group from the earliest"
        finally:
            await broker.close()

    try:
        _, new, held = asyncio.run(asyncio.wait_for(before(), BOUND_S))
        process.kill()
        process.start()
        asyncio.run(asyncio.wait_for(after(new, held), BOUND_S))
    finally:
        process.stop()
