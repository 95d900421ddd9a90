"""The `BrokerApi` contract for DELAY messages and recall (LocalBroker and RemoteBroker, conftest.py).

Waits are bounded; timing assertions only say "not before the delivery time". The first test waits
for a delivery time on the real clock (both implementations); the others make the time pass with
`elapse` (the local broker's clock jumps: the timer service's next tick, at most `precision_ms`
later, finds the timers due) and read "now" on the test's `clock`, which is the broker's.
"""

from __future__ import annotations

import asyncio
import time

from broker.client.api import BrokerApi, GroupSpec, PopRequest, StoredMessage, TopicSpec
from common.errors import BadRequest, IllegalDeliveryTime, MessageTypeConflict, NotFound
from common.model import MessageType
from tests.contract.conftest import TIMER_MAX_DELAY_MS, Elapse, Scope
from tests.contract.test_broker_contract import expect_error
from tests.helpers.clock import JumpClock
from tests.helpers.records import outgoing

DELAY_TYPES = frozenset({MessageType.DELAY})
WAIT_S = 15.0
DELAY_MS = 1_500


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def delayed(scope: Scope, body: str, at_ms: int) -> bytes:
    return outgoing(body=body.encode(), message_id=scope.message_id(), message_type=MessageType.DELAY,
                           delivery_timestamp_ms=at_ms)  # fmt: skip


async def setup(broker: BrokerApi, scope: Scope) -> tuple[str, str]:
    topic, group = scope.topic(), scope.group()
    await broker.create_topic(TopicSpec(topic, 1, DELAY_TYPES | {MessageType.NORMAL}))
    await broker.create_group(GroupSpec(group))
    return topic, group


async def pop_until(
    broker: BrokerApi, topic: str, group: str, want: int, timeout_s: float = WAIT_S
) -> list[StoredMessage]:
    got: list[StoredMessage] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < want and time.monotonic() < deadline:
        got += await broker.pop(PopRequest(group, topic, max_messages=32, invisible_ms=60_000, long_poll_ms=500))
    return got


async def test_delay_message_is_delivered_at_its_time_not_before(broker: BrokerApi, scope: Scope) -> None:
    topic, group = await setup(broker, scope)
    at = now_ms() + DELAY_MS
    [res] = await broker.send(topic, 0, [delayed(scope, "later", at)])
    assert res.recall_handle
    early = await broker.pop(PopRequest(group, topic, max_messages=1, invisible_ms=60_000))
    assert early == [] or now_ms() >= at
    [msg] = await pop_until(broker, topic, group, 1)
    assert now_ms() >= at, "delivered before its delivery time"
    assert msg.store_timestamp_ms >= at
    assert msg.body == b"later" and msg.message_type is MessageType.DELAY
    assert msg.delivery_timestamp_ms == at
    await no_pending(broker, topic)  # the count drops just after the copy becomes visible


async def no_pending(broker: BrokerApi, topic: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while (await broker.topic_status(topic)).pending_timers:
        assert time.monotonic() < deadline, f"{topic} still has pending timers"
        await asyncio.sleep(0.05)


async def test_timers_due_in_order_and_past_due_at_once(
    broker: BrokerApi, scope: Scope, clock: JumpClock, elapse: Elapse
) -> None:
    topic, group = await setup(broker, scope)
    base = clock.now_ms()
    msgs = [delayed(scope, "b", base + 900), delayed(scope, "a", base - 5_000), delayed(scope, "c", base + 1_800)]
    await broker.send(topic, 0, msgs)
    got = await pop_until(broker, topic, group, 1)  # past due: at once
    await elapse(0.9)
    got += await pop_until(broker, topic, group, 1)
    await elapse(0.9)
    got += await pop_until(broker, topic, group, 1)
    assert [m.body for m in got] == [b"a", b"b", b"c"]
    assert clock.now_ms() >= base + 1_800


async def test_a_delay_message_is_delivered_in_the_queue_it_was_sent_to(
    broker: BrokerApi, scope: Scope, clock: JumpClock
) -> None:
    """The timer record names the message's queue (and keeps its properties): its copy lands there."""
    topic, group = scope.topic(), scope.group()
    await broker.create_topic(TopicSpec(topic, 4, DELAY_TYPES))
    await broker.create_group(GroupSpec(group))
    message = outgoing(body=b"q2", message_id=scope.message_id(), message_type=MessageType.DELAY,
                       delivery_timestamp_ms=clock.now_ms() - 5_000, properties={"k": "v"})  # fmt: skip
    await broker.send(topic, 2, [message])
    [msg] = await pop_until(broker, topic, group, 1)  # past due: at once
    assert (msg.body, msg.queue_id, msg.properties) == (b"q2", 2, {"k": "v"})


async def test_recall_cancels_a_pending_timer(
    broker: BrokerApi, scope: Scope, clock: JumpClock, elapse: Elapse
) -> None:
    topic, group = await setup(broker, scope)
    at = clock.now_ms() + DELAY_MS
    keep, drop = delayed(scope, "keep", at), delayed(scope, "drop", at)
    results = await broker.send(topic, 0, [keep, drop])
    assert await broker.recall(topic, results[1].recall_handle) == drop.message_id
    with expect_error(NotFound):  # a second recall: already recalled
        await broker.recall(topic, results[1].recall_handle)
    await elapse(DELAY_MS / 1000)
    got = await pop_until(broker, topic, group, 1)
    await asyncio.sleep(0.5)  # a recalled timer would be due together with `keep`
    got += await broker.pop(PopRequest(group, topic, max_messages=32, invisible_ms=60_000))
    assert [m.body for m in got] == [b"keep"]
    with expect_error(NotFound):  # already delivered
        await broker.recall(topic, results[0].recall_handle)


async def test_bad_delivery_times_and_recalls(broker: BrokerApi, scope: Scope) -> None:
    topic, _ = await setup(broker, scope)
    with expect_error(IllegalDeliveryTime):
        await broker.send(topic, 0, [delayed(scope, "x", now_ms() + TIMER_MAX_DELAY_MS + 60_000)])
    with expect_error(IllegalDeliveryTime):  # milliseconds given where seconds are expected
        await broker.send(topic, 0, [delayed(scope, "x", (now_ms() + 10_000) * 1000)])
    with expect_error(IllegalDeliveryTime):
        await broker.send(topic, 0, [delayed(scope, "x", 0)])
    normal_only = scope.topic()
    await broker.create_topic(TopicSpec(normal_only, 1))
    with expect_error(MessageTypeConflict):
        await broker.send(normal_only, 0, [delayed(scope, "x", now_ms() + 1_000)])
    with expect_error(MessageTypeConflict):
        await broker.recall(normal_only, "x")
    with expect_error(BadRequest):
        await broker.recall(topic, "not-a-handle")
    [res] = await broker.send(topic, 0, [delayed(scope, "x", now_ms() + 60_000)])
    other = scope.topic()
    await broker.create_topic(TopicSpec(other, 1, DELAY_TYPES))
    with expect_error(BadRequest):  # the handle of another topic's message
        await broker.recall(other, res.recall_handle)
    assert (await broker.topic_status(topic)).pending_timers == 1
    await broker.recall(topic, res.recall_handle)
    assert (await broker.topic_status(topic)).pending_timers == 0
