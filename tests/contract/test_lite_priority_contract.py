"""The `BrokerApi` contract for lite topics and priority messages (LocalBroker and RemoteBroker).

Waits are bounded; nothing here asserts how fast.
"""

from __future__ import annotations

import asyncio
import time

from broker.client.api import (
    BrokerApi,
    ConsumeFrom,
    GroupSpec,
    LiteAction,
    LiteOffset,
    LiteOffsetPolicy,
    LiteSync,
    PopRequest,
    StoredMessage,
    TopicSpec,
)
from common.errors import (
    BadRequest,
    ClientIdRequired,
    IllegalLiteTopic,
    LiteSubscriptionQuotaExceeded,
    LiteTopicQuotaExceeded,
    MessageTypeConflict,
)
from common.model import MessageType
from common.record import SYSPROP_LITE_TOPIC, SYSPROP_PRIORITY
from tests.contract.conftest import Elapse, Scope
from tests.contract.test_broker_contract import expect_error
from tests.helpers.records import outgoing

LITE = frozenset({MessageType.LITE})
PRIORITY = frozenset({MessageType.PRIORITY})
WAIT_S = 10.0


def lite(scope: Scope, name: str, body: str) -> bytes:
    return outgoing(body.encode(), scope.message_id(), MessageType.LITE, system_properties={SYSPROP_LITE_TOPIC: name})


def prio(scope: Scope, level: int | str, body: str = "p") -> bytes:
    return outgoing(body.encode(), scope.message_id(), MessageType.PRIORITY,
                           system_properties={SYSPROP_PRIORITY: str(level)})  # fmt: skip


async def lite_setup(broker: BrokerApi, scope: Scope, **spec: int) -> tuple[str, str]:
    topic, group = scope.topic(), scope.group()
    await broker.create_topic(TopicSpec(topic, 1, LITE, **spec))
    await broker.create_group(GroupSpec(group))
    return topic, group


def pop(group: str, topic: str, client: str, n: int = 32, wait_ms: int = 0) -> PopRequest:
    return PopRequest(group, topic, None, n, 30_000, long_poll_ms=wait_ms, lite_client=client)


async def drain(broker: BrokerApi, group: str, topic: str, client: str, want: int) -> list[StoredMessage]:
    got: list[StoredMessage] = []
    deadline = time.monotonic() + WAIT_S
    while len(got) < want and time.monotonic() < deadline:
        batch = await broker.pop(pop(group, topic, client, wait_ms=300))
        got += batch
        if batch:
            await broker.ack(group, topic, [m.receipt_handle for m in batch])
    return got


async def test_lite_consumer_gets_only_subscribed_lite_topics_in_order_and_fairly(
    broker: BrokerApi, scope: Scope
) -> None:
    topic, group = await lite_setup(broker, scope)
    await broker.sync_lite_subscription(LiteSync(group, topic, "c1", LiteAction.PARTIAL_ADD, ("hot", "cold")))
    await broker.send(topic, 0, [lite(scope, "hot", f"h{i}") for i in range(20)])
    await broker.send(topic, 0, [lite(scope, "cold", "c0"), lite(scope, "other", "o0")])
    first = await broker.pop(pop(group, topic, "c1"))
    assert sorted(m.body for m in first) == [b"c0", b"h0"], "one per lite topic: the hot one does not starve cold"
    assert {m.system_properties[SYSPROP_LITE_TOPIC] for m in first} == {"hot", "cold"}
    assert await broker.pop(pop(group, topic, "c1")) == [], "nothing more until the heads are acknowledged"
    await broker.ack(group, topic, [m.receipt_handle for m in first])
    rest = await drain(broker, group, topic, "c1", 19)
    assert [m.body for m in rest] == [f"h{i}".encode() for i in range(1, 20)]
    listed = await broker.list_lite_topics(topic, group)
    assert listed.count == 3
    assert {t.name: t.backlog for t in listed.topics} == {"hot": 0, "cold": 0, "other": 1}


async def test_lite_long_poll_wakes_on_a_subscribed_lite_topic(broker: BrokerApi, scope: Scope) -> None:
    topic, group = await lite_setup(broker, scope)
    await broker.sync_lite_subscription(LiteSync(group, topic, "c1", LiteAction.COMPLETE_ADD, ("a", "b")))
    waiting = asyncio.create_task(broker.pop(pop(group, topic, "c1", wait_ms=8_000)))
    await asyncio.sleep(0.3)
    started = time.monotonic()
    await broker.send(topic, 0, [lite(scope, "b", "wake")])
    got = await asyncio.wait_for(waiting, WAIT_S)
    assert [m.body for m in got] == [b"wake"] and time.monotonic() - started < 7.0


async def test_lite_ack_wakes_a_poll_waiting_for_the_next_message(broker: BrokerApi, scope: Scope) -> None:
    """An acknowledgement frees its lite topic's next message: a long poll of another client of the
    group, waiting behind the message in flight, wakes (a spent handle in the same ack changes nothing)."""
    topic, group = await lite_setup(broker, scope)
    for client in ("c1", "c2"):
        await broker.sync_lite_subscription(LiteSync(group, topic, client, LiteAction.COMPLETE_ADD, ("a",)))
    await broker.send(topic, 0, [lite(scope, "a", "first"), lite(scope, "a", "second")])
    (head,) = await broker.pop(pop(group, topic, "c1"))
    assert head.body == b"first"
    waiting = asyncio.create_task(broker.pop(pop(group, topic, "c2", wait_ms=8_000)))
    await asyncio.sleep(0.3)
    assert not waiting.done(), "the next message waits for the first one"
    started = time.monotonic()
    results = await broker.ack(group, topic, [head.receipt_handle, head.receipt_handle])
    assert [r.error is None for r in results] == [True, False]
    got = await asyncio.wait_for(waiting, WAIT_S)
    assert [m.body for m in got] == [b"second"] and time.monotonic() - started < 7.0


async def test_lite_subscription_actions_and_offset_option(broker: BrokerApi, scope: Scope) -> None:
    topic, group = await lite_setup(broker, scope)
    await broker.send(topic, 0, [lite(scope, "x", f"x{i}") for i in range(5)])
    tail = LiteOffset(tail_n=2)
    await broker.sync_lite_subscription(LiteSync(group, topic, "c1", LiteAction.PARTIAL_ADD, ("x",), offset=tail))
    got = await drain(broker, group, topic, "c1", 2)
    assert [m.body for m in got] == [b"x3", b"x4"]
    await broker.sync_lite_subscription(LiteSync(group, topic, "c1", LiteAction.PARTIAL_ADD, ("x",),
                                                 offset=LiteOffset(LiteOffsetPolicy.MIN)))  # fmt: skip
    assert [m.body for m in await drain(broker, group, topic, "c1", 5)] == [f"x{i}".encode() for i in range(5)]
    await broker.sync_lite_subscription(LiteSync(group, topic, "c1", LiteAction.COMPLETE_REMOVE, ()))
    await broker.send(topic, 0, [lite(scope, "x", "late")])
    assert await broker.pop(pop(group, topic, "c1")) == []
    assert await broker.sync_lite_subscription(LiteSync(group, topic, "c1", LiteAction.COMPLETE_ADD, ("x",),
                                                        version=5)) == 1, "answers its count"  # fmt: skip
    assert await broker.sync_lite_subscription(LiteSync(group, topic, "c1", LiteAction.COMPLETE_REMOVE, (),
                                                        version=4)) == 1, "an older one: no change"  # fmt: skip
    assert [m.body for m in await drain(broker, group, topic, "c1", 1)] == [b"late"], "an older version is ignored"


async def test_lite_quotas_and_bad_input(broker: BrokerApi, scope: Scope) -> None:
    topic, group = await lite_setup(broker, scope, max_lite_topics=2)
    with expect_error(LiteSubscriptionQuotaExceeded):
        await broker.sync_lite_subscription(LiteSync(group, topic, "c1", LiteAction.COMPLETE_ADD, ("a", "b"), quota=1))
    with expect_error(LiteTopicQuotaExceeded):
        await broker.send(topic, 0, [lite(scope, n, n) for n in ("a", "b", "c")])
    with expect_error(IllegalLiteTopic):
        await broker.send(topic, 0, [lite(scope, "bad name", "x")])
    with expect_error(IllegalLiteTopic):
        await broker.send(topic, 0, [outgoing(b"x", scope.message_id(), MessageType.LITE)])
    with expect_error(IllegalLiteTopic):
        await broker.sync_lite_subscription(LiteSync(group, topic, "c1", LiteAction.PARTIAL_ADD, ("",)))
    with expect_error(MessageTypeConflict):
        await broker.send(topic, 0, [outgoing(b"x", scope.message_id())])
    with expect_error(ClientIdRequired):
        await broker.sync_lite_subscription(LiteSync(group, topic, "", LiteAction.PARTIAL_ADD, ("a",)))
    normal = scope.topic()
    await broker.create_topic(TopicSpec(normal, 1))
    with expect_error(BadRequest):
        await broker.sync_lite_subscription(LiteSync(group, normal, "c1", LiteAction.PARTIAL_ADD, ("a",)))
    with expect_error(BadRequest):
        await broker.pop(PopRequest(group, topic, None, 1, 30_000))  # a normal consumer of a lite topic
    assert (await broker.list_lite_topics(topic)).count == 0, "nothing refused was stored"


async def test_expired_lite_topic_is_removed_and_announced(broker: BrokerApi, scope: Scope, elapse: Elapse) -> None:
    topic, group = await lite_setup(broker, scope, lite_expiration_s=1)
    await broker.sync_lite_subscription(LiteSync(group, topic, "c-exp", LiteAction.PARTIAL_ADD, ("brief",)))
    await broker.send(topic, 0, [lite(scope, "brief", "b")])
    await elapse(1.0)  # the lite topic's expiration: removed by the broker's next sweep
    removals = []
    deadline = time.monotonic() + WAIT_S
    while not removals and time.monotonic() < deadline:
        await asyncio.sleep(0.3)
        removals = await broker.claim_lite_removals(["c-exp"])
    assert [(r.client_id, r.group, r.topic, r.lite_topic) for r in removals] == [("c-exp", group, topic, "brief")]
    assert (await broker.list_lite_topics(topic)).count == 0
    assert await broker.claim_lite_removals(["c-exp"]) == [], "claimed once"


async def test_priority_backlog_is_popped_highest_first(broker: BrokerApi, scope: Scope) -> None:
    topic, group = scope.topic(), scope.group()
    await broker.create_topic(TopicSpec(topic, 2, PRIORITY, max_priority=4))
    await broker.create_group(GroupSpec(group))
    levels = [0, 3, 1, 4, 2, 4, 0, 3]
    await broker.send(topic, 1, [prio(scope, lv, f"m{i}") for i, lv in enumerate(levels)])
    got: list[StoredMessage] = []
    while len(got) < len(levels):
        batch = await broker.pop(PopRequest(group, topic, None, 3, 30_000, long_poll_ms=300))
        assert batch, "the backlog drains"
        got += batch
        await broker.ack(group, topic, [m.receipt_handle for m in batch])
    seen = [int(m.system_properties[SYSPROP_PRIORITY]) for m in got]
    assert seen == sorted(levels, reverse=True)
    assert {m.message_type for m in got} == {MessageType.PRIORITY}
    assert [m.body for m in got if m.system_properties[SYSPROP_PRIORITY] == "4"] == [b"m3", b"m5"], "FIFO per level"


async def test_priority_retry_keeps_its_priority_and_bad_input_is_refused(broker: BrokerApi, scope: Scope) -> None:
    topic, group = scope.topic(), scope.group()
    await broker.create_topic(TopicSpec(topic, 1, PRIORITY, max_priority=3))
    await broker.create_group(GroupSpec(group))
    await broker.send(topic, 0, [prio(scope, 2, "urgent")])
    [first] = await broker.pop(PopRequest(group, topic, None, 1, 30_000))
    await broker.change_invisible_duration(group, topic, first.receipt_handle, 0)
    await broker.send(topic, 0, [prio(scope, 1, "later")])
    got = await broker.pop(PopRequest(group, topic, None, 2, 30_000, long_poll_ms=2_000))
    head = got[0]
    assert (head.body, head.system_properties[SYSPROP_PRIORITY], head.delivery_attempt) == (b"urgent", "2", 2)
    for bad in (prio(scope, 4), prio(scope, -1), prio(scope, "high")):
        with expect_error(BadRequest):
            await broker.send(topic, 0, [bad])
    with expect_error(MessageTypeConflict):
        await broker.send(topic, 0, [outgoing(b"x", scope.message_id(), MessageType.PRIORITY, message_group="g",
                                                     system_properties={SYSPROP_PRIORITY: "1"})])  # fmt: skip
    with expect_error(MessageTypeConflict):
        await broker.create_topic(TopicSpec(scope.topic(), 1, PRIORITY | {MessageType.NORMAL}))
    status = await broker.topic_status(topic)
    assert sum(q.max_offset - q.min_offset for q in status.queues) == 2, "nothing refused was stored"


async def test_a_drained_priority_level_is_read_again_after_a_send(broker: BrokerApi, scope: Scope) -> None:
    """Pops skip the levels a group drained until a dispatch writes to them: an urgent message sent
    after the urgent level ran dry still comes before the lower backlog; a group created again
    starts over."""
    topic, group = scope.topic(), scope.group()
    await broker.create_topic(TopicSpec(topic, 1, PRIORITY, max_priority=3))
    await broker.create_group(GroupSpec(group))
    await broker.send(topic, 0, [prio(scope, 3, "u0")] + [prio(scope, 0, f"low{i}") for i in range(4)])

    async def pop_ack(n: int) -> list[bytes]:
        got = await broker.pop(PopRequest(group, topic, None, n, 30_000, long_poll_ms=2_000))
        await broker.ack(group, topic, [m.receipt_handle for m in got])
        return [m.body for m in got]

    assert await pop_ack(2) == [b"u0", b"low0"], "level 3 is drained after this pop"
    await broker.send(topic, 0, [prio(scope, 3, "u1")])
    assert await pop_ack(2) == [b"u1", b"low1"]
    await broker.delete_group(group)
    await broker.create_group(GroupSpec(group, consume_from=ConsumeFrom.EARLIEST))
    assert await pop_ack(1) == [b"u0"], "a group created again starts over"
