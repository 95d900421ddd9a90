"""What the MQTT gateway needs of a broker, against both implementations (docs/mqtt.md): filter
subscriptions to lite topics (matched when a message is stored, from that message on) and the
MQTT state store (atomic writes with compare-and-set, scans by prefix).

Waits are bounded; nothing here asserts how fast.
"""

from __future__ import annotations

from broker.client.api import (
    BrokerApi,
    GroupSpec,
    LiteAction,
    LiteSync,
    PopRequest,
    StoredMessage,
    TopicSpec,
    lite_scope,
)
from broker.client.mqttstate import MqttStateApi
from common.errors import BadRequest, IllegalLiteTopic, PreconditionFailed
from tests.contract.conftest import Scope
from tests.contract.test_broker_contract import expect_error
from tests.contract.test_lite_priority_contract import LITE, drain, lite, lite_setup, pop


def bodies(messages: list[StoredMessage]) -> list[str]:
    return [m.body.decode() for m in messages]


async def test_a_filter_subscribes_to_lite_topics_it_matches_from_their_next_message(
    broker: BrokerApi, scope: Scope
) -> None:
    topic, group = await lite_setup(broker, scope)
    await broker.send(topic, 0, [lite(scope, "a/old/t", "before")])  # exists before the filter
    count = await broker.sync_lite_subscription(
        LiteSync(group, topic, "c1", LiteAction.PARTIAL_ADD, ("a/+/t", "b/#"), filters=True)
    )
    assert count == 2
    await broker.send(topic, 0, [lite(scope, "a/old/t", "o1"), lite(scope, "a/new/t", "n1"),
                                 lite(scope, "a/new/x", "no"), lite(scope, "b", "b0"), lite(scope, "b/c/d", "b1"),
                                 lite(scope, "=24SYS/t", "sys")])  # fmt: skip
    got = await drain(broker, group, topic, "c1", 4)
    assert sorted(bodies(got)) == ["b0", "b1", "n1", "o1"]
    assert all(m.system_properties.get("LITE_TOPIC") != "a/new/x" for m in got)
    await broker.send(topic, 0, [lite(scope, "a/old/t", "o2")])  # now an ordinary subscription
    assert bodies(await drain(broker, group, topic, "c1", 1)) == ["o2"]


async def test_removing_a_filter_unsubscribes_what_only_it_matched(broker: BrokerApi, scope: Scope) -> None:
    topic, group = await lite_setup(broker, scope)
    await broker.sync_lite_subscription(
        LiteSync(group, topic, "c1", LiteAction.PARTIAL_ADD, ("x/#", "x/keep"), filters=True)
    )
    await broker.send(topic, 0, [lite(scope, "x/keep", "k1"), lite(scope, "x/drop", "d1")])
    assert sorted(bodies(await drain(broker, group, topic, "c1", 2))) == ["d1", "k1"]
    left = await broker.sync_lite_subscription(
        LiteSync(group, topic, "c1", LiteAction.PARTIAL_REMOVE, ("x/#",), filters=True)
    )
    assert left == 1
    await broker.send(topic, 0, [lite(scope, "x/keep", "k2"), lite(scope, "x/drop", "d2")])
    assert bodies(await drain(broker, group, topic, "c1", 1)) == ["k2"]
    assert await broker.pop(pop(group, topic, "c1", wait_ms=200)) == [], "d2 was stored with k2: no longer matched"
    # Subscribing again starts at the lite topic's next message, not where the group left off.
    await broker.sync_lite_subscription(LiteSync(group, topic, "c1", LiteAction.PARTIAL_ADD, ("x/+",), filters=True))
    await broker.send(topic, 0, [lite(scope, "x/drop", "d3")])
    assert bodies(await drain(broker, group, topic, "c1", 1)) == ["d3"]
    assert await broker.pop(pop(group, topic, "c1", wait_ms=200)) == []
    await broker.sync_lite_subscription(LiteSync(group, topic, "c1", LiteAction.COMPLETE_REMOVE, (), filters=True))
    await broker.send(topic, 0, [lite(scope, "x/keep", "k3")])
    assert await broker.pop(pop(group, topic, "c1", wait_ms=200)) == []


async def test_two_clients_of_one_group_share_a_filter_and_two_groups_each_get_all(
    broker: BrokerApi, scope: Scope
) -> None:
    topic, group = await lite_setup(broker, scope)
    other = scope.group()
    await broker.create_group(GroupSpec(other))
    for g, c in ((group, "c1"), (group, "c2"), (other, "c3")):
        await broker.sync_lite_subscription(LiteSync(g, topic, c, LiteAction.PARTIAL_ADD, ("s/+",), filters=True))
    await broker.send(topic, 0, [lite(scope, f"s/{i}", f"m{i}") for i in range(6)])
    first = await drain(broker, group, topic, "c1", 3)
    second = await drain(broker, group, topic, "c2", 6 - len(first))
    assert sorted(bodies(first + second)) == [f"m{i}" for i in range(6)]
    assert sorted(bodies(await drain(broker, other, topic, "c3", 6))) == [f"m{i}" for i in range(6)]


async def test_namespace_wide_filters_apply_to_lite_topics_made_later(broker: BrokerApi, scope: Scope) -> None:
    """Filters synced with a namespace's scope (`ns%*`) subscribe to matching lite topics of every
    LITE topic of that namespace, those created after the filter too; removing them unsubscribes."""
    ns = scope.topic().replace("-", "_")
    group = scope.group()
    await broker.create_group(GroupSpec(group))
    every = lite_scope(f"{ns}%any")
    assert every == f"{ns}%*"
    add = LiteSync(group, every, "c1", LiteAction.PARTIAL_ADD, ("+/t",), filters=True)
    assert await broker.sync_lite_subscription(add) == 1
    bind, elsewhere = f"{ns}%b1", f"{ns}x%b1"  # the second in another namespace
    for name in (bind, elsewhere):
        await broker.create_topic(TopicSpec(name, 1, LITE))
    await broker.send(bind, 0, [lite(scope, "b1/t", "yes"), lite(scope, "b1/u", "no"), lite(scope, "b1/x/t", "no")])
    await broker.send(elsewhere, 0, [lite(scope, "b1/t", "other namespace")])
    assert bodies(await drain(broker, group, bind, "c1", 1)) == ["yes"]
    assert await broker.pop(pop(group, bind, "c1", wait_ms=200)) == [], "the others were stored with it: not matched"
    assert await broker.pop(pop(group, elsewhere, "c1", wait_ms=200)) == []
    await broker.sync_lite_subscription(LiteSync(group, every, "c1", LiteAction.PARTIAL_REMOVE, ("+/t",), filters=True))
    await broker.send(bind, 0, [lite(scope, "b1/t", "after removal")])
    assert await broker.pop(pop(group, bind, "c1", wait_ms=200)) == []
    with expect_error(BadRequest):  # a scope takes filters only
        await broker.sync_lite_subscription(LiteSync(group, every, "c1", LiteAction.PARTIAL_ADD, ("b1/t",)))


async def test_bad_filters_are_refused(broker: BrokerApi, scope: Scope) -> None:
    topic, group = await lite_setup(broker, scope)
    for bad in ("a/#/b", "a+/b", "", "a b"):
        with expect_error(IllegalLiteTopic):
            await broker.sync_lite_subscription(
                LiteSync(group, topic, "c1", LiteAction.PARTIAL_ADD, (bad,), filters=True)
            )


async def test_mqtt_state_writes_are_atomic_and_conditional(broker: BrokerApi, scope: Scope) -> None:
    assert isinstance(broker, MqttStateApi)
    prefix = f"t/{scope.topic()}/".encode()
    a, b, c = prefix + b"a", prefix + b"b", prefix + b"c"
    await broker.mqtt_write([(a, b"1"), (b, b"2")], expect=[(a, None)])
    assert await broker.mqtt_get([a, b, c]) == [b"1", b"2", None]
    with expect_error(PreconditionFailed):
        await broker.mqtt_write([(c, b"3")], [a], expect=[(a, b"stale")])
    assert await broker.mqtt_get([a, c]) == [b"1", None]  # nothing of a refused write is applied
    await broker.mqtt_write([(c, b"3")], [a], expect=[(a, b"1"), (c, None)])
    assert await broker.mqtt_get([a, b, c]) == [None, b"2", b"3"]
    with expect_error(BadRequest):
        await broker.mqtt_write([(b"", b"x")])


async def test_mqtt_state_scans_pages_of_a_prefix(broker: BrokerApi, scope: Scope) -> None:
    assert isinstance(broker, MqttStateApi)
    prefix = f"s/{scope.topic()}/".encode()
    keys = [prefix + f"{i:03d}".encode() for i in range(25)]
    await broker.mqtt_write([(k, k[-3:]) for k in keys])
    await broker.mqtt_write([(prefix[:-1] + b"0", b"outside")])
    first = await broker.mqtt_scan(prefix, limit=10)
    assert [k for k, _ in first] == keys[:10]
    rest = await broker.mqtt_scan(prefix, after=first[-1][0], limit=100)
    assert [k for k, _ in rest] == keys[10:] and rest[0][1] == b"010"
    assert await broker.mqtt_scan(prefix + b"9") == []


async def test_a_lite_window_hands_out_several_messages_of_one_lite_topic(broker: BrokerApi, scope: Scope) -> None:
    """`lite_window` 1 keeps the lite order (one in flight per lite topic); above it, up to that many."""
    topic, group = await lite_setup(broker, scope)
    await broker.sync_lite_subscription(LiteSync(group, topic, "c1", LiteAction.PARTIAL_ADD, ("w/#",), filters=True))
    await broker.send(topic, 0, [lite(scope, "w/1", f"m{i}") for i in range(8)])
    one = await broker.pop(pop(group, topic, "c1"))
    assert bodies(one) == ["m0"]
    request = PopRequest(group, topic, None, 32, 30_000, lite_client="c1", lite_window=5)
    more = await broker.pop(request)
    assert bodies(more) == ["m1", "m2", "m3", "m4"]  # five in flight with m0
    await broker.ack(group, topic, [m.receipt_handle for m in one + more])
    rest = await broker.pop(request)
    assert bodies(rest) == ["m5", "m6", "m7"]
