"""Deleting a topic, in the `BrokerApi` contract (LocalBroker and RemoteBroker, conftest.py): a topic
deleted and created again starts empty for every reader, whatever the old one left behind.

Nothing of the old topic is served again: not to a new group consuming from the earliest message,
not to a group that consumed the old topic (its in-flight messages, cursor and committed offset are
gone), not to a pull from offset 0, a lookup by id or key, a DELAY message due later, a half
message committed later, or a repeat of a deduplicated id. An old receipt handle is refused with
INVALID_RECEIPT_HANDLE saying the topic was deleted; the queues' offsets go on where the old topic
ended, so no old handle or offset ever names a new message.
"""

from __future__ import annotations

import pytest

from broker.client.api import BrokerApi, ConsumeFrom, FilterSpec, OffsetPolicy, TopicSpec, TransactionResolution
from common.errors import InvalidReceiptHandle, InvalidTransactionId, OffsetNotFound
from common.model import MessageType
from tests.contract.conftest import Elapse, Scope
from tests.contract.test_broker_contract import (
    bodies,
    expect_error,
    new_group,
    out,
    pop_n,
    pop_none,
    wait_stored,
)
from tests.contract.test_transaction_contract import CLIENT, FAR_MS, half, send_half
from tests.helpers.clock import JumpClock
from tests.helpers.records import outgoing

QUEUES = 2
TYPES = frozenset({MessageType.NORMAL, MessageType.DELAY, MessageType.TRANSACTION})
DELAY_MS = 1_000


async def recreate(api: BrokerApi, topic: str) -> TopicSpec:
    spec = TopicSpec(topic, QUEUES, TYPES)
    await api.delete_topic(topic)
    return await api.create_topic(spec)


async def test_a_recreated_topic_starts_empty_for_every_reader(broker: BrokerApi, scope: Scope) -> None:
    topic = scope.topic()
    await broker.create_topic(TopicSpec(topic, QUEUES, TYPES))
    old = [out(scope, f"old-{i}", keys=(f"k{i}",)) for i in range(6)]
    for q in range(QUEUES):
        await broker.send(topic, q, old[q::QUEUES])
    await wait_stored(broker, topic, {q: 3 for q in range(QUEUES)})
    consumer = await new_group(broker, scope, consume_from=ConsumeFrom.EARLIEST)
    held = await pop_n(broker, consumer, topic, 2)  # in flight when the topic goes
    puller = scope.group()
    await broker.update_offset(puller, topic, 0, 2)

    await recreate(broker, topic)

    status = await broker.topic_status(topic)
    assert [(q.min_offset, q.max_offset) for q in status.queues] == [(3, 3)] * QUEUES, "offsets go on, none left"
    newcomer = await new_group(broker, scope, consume_from=ConsumeFrom.EARLIEST)
    await pop_none(broker, newcomer, topic)
    await pop_none(broker, consumer, topic)
    for q in range(QUEUES):
        pulled = await broker.pull(puller, topic, q, 0, 32, FilterSpec())
        assert (pulled.messages, pulled.next_offset) == ([], 3), f"queue {q}: {bodies(pulled.messages)}"
        assert await broker.query_offset(topic, q, OffsetPolicy.BEGINNING) == 3
    with expect_error(OffsetNotFound):
        await broker.get_offset(puller, topic, 0)
    assert await broker.get_message(topic, old[0].message_id) == []
    assert await broker.find_messages_by_key(topic, "k0") == []
    results = await broker.ack(consumer, topic, [m.receipt_handle for m in held])
    assert all(isinstance(r.error, InvalidReceiptHandle) and "deleted" in r.error.message for r in results), results

    new = out(scope, "new", keys=("k0",))
    [sent] = await broker.send(topic, 0, [new])
    assert sent.queue_offset == 3, "a new message never takes an old message's offset"
    for group in (newcomer, consumer):
        assert bodies(await pop_n(broker, group, topic, 1)) == [b"new"]
    assert [m.message_id for m in await broker.find_messages_by_key(topic, "k0")] == [new.message_id]


async def test_a_delay_message_of_the_deleted_topic_never_fires(
    broker: BrokerApi, scope: Scope, clock: JumpClock, elapse: Elapse
) -> None:
    topic, group = scope.topic(), await new_group(broker, scope, consume_from=ConsumeFrom.EARLIEST)
    await broker.create_topic(TopicSpec(topic, QUEUES, TYPES))
    due = clock.now_ms() + DELAY_MS
    await broker.send(topic, 0, [outgoing(body=b"old-timer", message_id=scope.message_id(),
                                          message_type=MessageType.DELAY, delivery_timestamp_ms=due)])  # fmt: skip
    assert (await broker.topic_status(topic)).pending_timers == 1

    await recreate(broker, topic)

    assert (await broker.topic_status(topic)).pending_timers == 0
    await elapse(2 * DELAY_MS / 1000)
    await broker.send(topic, 0, [out(scope, "after")])  # its delivery shows the timer's tick has passed
    assert bodies(await pop_n(broker, group, topic, 1)) == [b"after"]
    await pop_none(broker, group, topic)


async def test_a_half_message_of_the_deleted_topic_cannot_be_committed_into_the_new_one(
    broker: BrokerApi, scope: Scope
) -> None:
    topic, group = scope.topic(), await new_group(broker, scope, consume_from=ConsumeFrom.EARLIEST)
    await broker.create_topic(TopicSpec(topic, QUEUES, TYPES))
    msg = half(scope, "old-half", FAR_MS)
    sent = await send_half(broker, topic, msg)

    await recreate(broker, topic)

    assert (await broker.topic_status(topic)).half_messages == 0
    with pytest.raises(InvalidTransactionId, match="deleted"):
        await broker.end_transaction(topic, msg.message_id, sent.transaction_id, TransactionResolution.COMMIT, CLIENT)
    await pop_none(broker, group, topic)


async def test_a_deduplicated_id_of_the_deleted_topic_is_stored_again(broker: BrokerApi, scope: Scope) -> None:
    topic, group = scope.topic(), await new_group(broker, scope, consume_from=ConsumeFrom.EARLIEST)
    await broker.create_topic(TopicSpec(topic, QUEUES, TYPES))
    msg = out(scope, "once", dedup=True)
    await broker.send(topic, 0, [msg])

    await recreate(broker, topic)

    [again] = await broker.send(topic, 0, [msg])
    assert again.queue_offset == 1, "stored in the new topic, not answered with the old copy"
    assert bodies(await pop_n(broker, group, topic, 1)) == [b"once"]
