"""`BrokerApi.message_trace` against both implementations: the life of a message, as recorded.

A message that is delivered, nacked, redelivered and finally dead-lettered shows exactly that, in
order, with the producer's client id; an acknowledged one shows its ack; bad ids are BAD_REQUEST.
Trace events are written in the background (every flush interval), so tests wait for them.
"""

from __future__ import annotations

from broker.client.api import (
    BackoffKind,
    BrokerApi,
    CallContext,
    RetryPolicy,
    SendResult,
    TopicSpec,
    TraceEvent,
    TraceKind,
)
from common.errors import BadRequest
from common.model import MessageType, dlq_topic
from tests.contract.conftest import Scope
from tests.contract.test_broker_contract import (
    SHORT_INVISIBLE_MS,
    ack_all,
    dlq_messages,
    eventually,
    expect_error,
    new_group,
    new_topic,
    out,
    pop_n,
)
from tests.contract.test_lite_priority_contract import lite, prio


async def _trace_until(api: BrokerApi, message_id: str, kinds: list[TraceKind]) -> list[TraceEvent]:
    """The trace once it holds at least `kinds` (as a multiset)."""
    found: list[TraceEvent] = []

    async def complete() -> bool:
        found[:] = await api.message_trace(message_id)
        have = [e.kind for e in found]
        return all(have.count(k) >= kinds.count(k) for k in set(kinds))

    await eventually(complete, f"trace of {message_id} holding {[k.value for k in kinds]}")
    return found


async def _producer_traced(api: BrokerApi, message_id: str) -> list[TraceEvent]:
    """The trace once it holds the recorded send (until the trace is flushed, a lookup answers with
    the store's own "sent" event, without the producer's client id)."""
    found: list[TraceEvent] = []

    async def recorded() -> bool:
        found[:] = await api.message_trace(message_id)
        return any(e.client_id for e in found)

    await eventually(recorded, f"the recorded send of {message_id}")
    return found


async def test_trace_of_a_retried_and_dead_lettered_message(broker: BrokerApi, scope: Scope) -> None:
    topic = await new_topic(broker, scope, queues=2)
    group = await new_group(broker, scope, max_delivery_attempts=2,
                            retry_policy=RetryPolicy(BackoffKind.CUSTOMIZED, customized_ms=(50,)))  # fmt: skip
    msg = out(scope, "poison")
    [sent] = await broker.send(topic, 1, [msg], ctx=CallContext("req-7", "client-7"))
    [first] = await pop_n(broker, group, topic, 1, invisible_ms=SHORT_INVISIBLE_MS)
    await broker.nack(group, topic, first.receipt_handle)
    [second] = await pop_n(broker, group, topic, 1, invisible_ms=SHORT_INVISIBLE_MS)
    assert second.delivery_attempt == 2
    await broker.nack(group, topic, second.receipt_handle)
    [dead] = await dlq_messages(broker, scope, group, 1)
    assert "client-7" not in dead.system_properties.values(), "the client id is not stored"

    wanted = [TraceKind.SENT, TraceKind.DELIVERED, TraceKind.INVISIBLE, TraceKind.DELIVERED, TraceKind.INVISIBLE,
              TraceKind.DEAD_LETTERED]  # fmt: skip
    events = await _trace_until(broker, msg.message_id, wanted)
    own = [e for e in events if e.topic == topic]
    assert [e.kind for e in own] == wanted
    assert all(e.queue_id == 1 and e.queue_offset == sent.queue_offset for e in own)
    assert own[0].client_id == "client-7"
    assert [e.attempt for e in own if e.kind is TraceKind.DELIVERED] == [1, 2]
    assert {e.group for e in own[1:]} == {group}
    assert own[-1].detail["dlq_topic"] == dlq_topic(group)
    assert [e.time_ms for e in own] == sorted(e.time_ms for e in own)


async def test_trace_of_an_acknowledged_message(broker: BrokerApi, scope: Scope) -> None:
    topic = await new_topic(broker, scope)
    group = await new_group(broker, scope)
    msg = out(scope, "fine")
    await broker.send(topic, 0, [msg])
    got = await pop_n(broker, group, topic, 1)
    await ack_all(broker, group, topic, got)
    events = await _trace_until(broker, msg.message_id, [TraceKind.SENT, TraceKind.DELIVERED, TraceKind.ACKED])
    assert [e.kind for e in events] == [TraceKind.SENT, TraceKind.DELIVERED, TraceKind.ACKED]
    assert events[2].group == group


async def test_trace_of_unknown_and_bad_ids(broker: BrokerApi, scope: Scope) -> None:
    assert await broker.message_trace(scope.message_id()) == []
    with expect_error(BadRequest):
        await broker.message_trace("")
    with expect_error(BadRequest):
        await broker.message_trace("x" * 10_000)


async def test_trace_of_lite_and_priority_sends(broker: BrokerApi, scope: Scope) -> None:
    """A send whose messages go to queues of their own (lite topics, priority levels) is traced as
    one event for the whole append: each message's trace shows it, with the producer's client id,
    at the message's own queue and offset."""
    lite_topic = scope.topic()
    await broker.create_topic(TopicSpec(lite_topic, 1, frozenset({MessageType.LITE})))
    prio_topic = scope.topic()
    await broker.create_topic(TopicSpec(prio_topic, 1, frozenset({MessageType.PRIORITY}), max_priority=9))
    lite_msgs = [lite(scope, name, name) for name in ("a", "b", "c")]
    prio_msgs = [prio(scope, level) for level in (2, 7)]
    sent: list[tuple[bytes, SendResult]] = []
    for topic, msgs in ((lite_topic, lite_msgs), (prio_topic, prio_msgs)):
        sent += zip(msgs, await broker.send(topic, 0, msgs, ctx=CallContext(client_id="client-9")), strict=True)
    for msg, result in sent:
        [event] = await _producer_traced(broker, msg.message_id)
        assert (event.kind, event.client_id) == (TraceKind.SENT, "client-9"), event
        assert (event.queue_id, event.queue_offset) == (result.queue_id, result.queue_offset)
    lite_queues, prio_queues = ({r.queue_id for _, r in part} for part in (sent[:3], sent[3:]))
    assert (len(lite_queues), len(prio_queues)) == (3, 2), "each message in a queue of its own"
