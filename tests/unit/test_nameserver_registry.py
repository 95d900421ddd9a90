"""The NameServer registry on its own: registration, replacement, routes, expiry, listings, bad input.

A fake clock drives expiry; nothing here touches the network.
"""

from __future__ import annotations

import dataclasses

import pytest

from common.config import ConfigError
from common.errors import BadRequest, IllegalTopic, PreconditionFailed, TooManyRequests, TopicNotFound
from common.model import MessageType, Permission, TopicInfo
from nameserver.client import parse_addresses
from nameserver.convert import registration_from_pb, registration_to_pb
from nameserver.model import BrokerQueues, BrokerRegistration, RegisterOutcome, TopicRoute, merge_routes, split_address
from nameserver.registry import Registry

EXPIRY_S = 10.0


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def topic(name: str, queues: int = 4, **kwargs: object) -> TopicInfo:
    return TopicInfo(name=name, queue_count=queues, **kwargs)  # type: ignore[arg-type]


def broker(
    name: str, *topics: TopicInfo, cluster: str = "c1", port: int = 10911, **kwargs: object
) -> BrokerRegistration:
    return BrokerRegistration(
        cluster_name=cluster,
        broker_name=name,
        address=f"127.0.0.1:{port}",
        topics=topics,
        **kwargs,  # type: ignore[arg-type]
    )


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def registry(clock: FakeClock) -> Registry:
    return Registry(broker_expiry_s=EXPIRY_S, clock=clock)


# -- registration -------------------------------------------------------------------------------


def test_register_makes_route(registry: Registry) -> None:
    outcome = registry.register(broker("b1", topic("orders", 8, permission=Permission.READ)))
    assert outcome is RegisterOutcome.NEW
    route = registry.route("orders")
    assert route.topic == "orders"
    [queues] = route.brokers
    assert (queues.broker_name, queues.address, queues.cluster_name) == ("b1", "127.0.0.1:10911", "c1")
    assert queues.queue_count == 8
    assert queues.permission is Permission.READ
    assert queues.message_types == frozenset({MessageType.NORMAL})


def test_reregister_replaces_topic_list(registry: Registry) -> None:
    registry.register(broker("b1", topic("a"), topic("b")))
    outcome = registry.register(broker("b1", topic("b", 2), topic("c")))
    assert outcome is RegisterOutcome.CHANGED
    with pytest.raises(TopicNotFound):
        registry.route("a")
    assert registry.route("b").brokers[0].queue_count == 2
    assert [t.name for t in registry.topics()] == ["b", "c"]


def test_same_registration_is_a_heartbeat(registry: Registry) -> None:
    registry.register(broker("b1", topic("a")))
    assert registry.register(broker("b1", topic("a"))) is RegisterOutcome.HEARTBEAT
    assert registry.register(broker("b1", topic("a"), port=10999)) is RegisterOutcome.CHANGED
    assert registry.route("a").brokers[0].address == "127.0.0.1:10999"


def test_route_merges_brokers_sorted_by_name(registry: Registry) -> None:
    registry.register(broker("b3", topic("t", 2), port=3))
    registry.register(broker("b1", topic("t", 4, message_types=frozenset({MessageType.FIFO})), port=1))
    registry.register(broker("b2", topic("other"), port=2))
    route = registry.route("t")
    assert [b.broker_name for b in route.brokers] == ["b1", "b3"]
    assert [b.queue_count for b in route.brokers] == [4, 2]
    assert route.brokers[0].message_types == frozenset({MessageType.FIFO})


def test_older_sequence_of_same_instance_keeps_newer_topics(registry: Registry, clock: FakeClock) -> None:
    registry.register(broker("b1", topic("new"), instance_id="i1", sequence=5))
    clock.advance(EXPIRY_S - 1)
    assert registry.register(broker("b1", topic("old"), instance_id="i1", sequence=4)) is RegisterOutcome.STALE
    assert registry.route("new").brokers[0].broker_name == "b1"
    with pytest.raises(TopicNotFound):
        registry.route("old")
    clock.advance(2)  # the stale heartbeat still proved the broker alive
    assert registry.route("new")


def test_new_instance_replaces_regardless_of_sequence(registry: Registry) -> None:
    registry.register(broker("b1", topic("a"), instance_id="i1", sequence=50))
    assert registry.register(broker("b1", topic("b"), instance_id="i2", sequence=1)) is RegisterOutcome.CHANGED
    assert registry.route("b")


def test_a_deposed_primary_s_late_registration_does_not_take_the_route_back(registry: Registry) -> None:
    """Issue 43 item 4: a primary cut off from etcd and its replicas is replaced (epoch 4); its own
    registration, sent during the cut and delivered after the heal, flipped the route back to it."""
    registry.register(dataclasses.replace(broker("g1", topic("t"), instance_id="old", sequence=9, epoch=3),
                                          address="10.0.0.1:10911"))  # fmt: skip
    registry.register(dataclasses.replace(broker("g1", topic("t"), instance_id="new", sequence=1, epoch=4),
                                          address="10.0.0.2:10911"))  # fmt: skip
    with pytest.raises(PreconditionFailed, match="epoch 3 came after one of epoch 4"):
        registry.register(dataclasses.replace(broker("g1", topic("t"), instance_id="old", sequence=10, epoch=3),
                                              address="10.0.0.1:10911"))  # fmt: skip
    assert registry.route("t").brokers[0].address == "10.0.0.2:10911"
    # A later primary's takes over; a broker that is no group member (epoch 0) is ordered as before.
    registry.register(dataclasses.replace(broker("g1", topic("t"), instance_id="third", epoch=5), address="h3:1"))
    assert registry.route("t").brokers[0].address == "h3:1"
    registry.register(dataclasses.replace(broker("g1", topic("t"), instance_id="plain"), address="h4:1"))
    assert registry.route("t").brokers[0].address == "h4:1"


# -- expiry -------------------------------------------------------------------------------------


def test_broker_expires_after_timeout(registry: Registry, clock: FakeClock) -> None:
    registry.register(broker("b1", topic("t")))
    registry.register(broker("b2", topic("t"), port=2))
    clock.advance(EXPIRY_S / 2)
    registry.register(broker("b2", topic("t"), port=2))  # heartbeat
    clock.advance(EXPIRY_S / 2)
    # b1 is invisible at once, before any sweep ...
    assert [b.broker_name for b in registry.route("t").brokers] == ["b2"]
    assert [b.broker_name for b in registry.brokers()] == ["b2"]
    # ... and the sweep reclaims it, reporting how long it was silent.
    [gone] = registry.expire()
    assert gone.broker_name == "b1"
    assert gone.last_heartbeat_age_s == pytest.approx(EXPIRY_S)
    assert registry.expire() == []
    clock.advance(EXPIRY_S)
    with pytest.raises(TopicNotFound):
        registry.route("t")
    assert registry.topics() == []


def test_expired_broker_registers_as_new(registry: Registry, clock: FakeClock) -> None:
    registry.register(broker("b1", topic("t")))
    clock.advance(EXPIRY_S)
    assert registry.register(broker("b1", topic("t"))) is RegisterOutcome.NEW


def test_unregister(registry: Registry) -> None:
    registry.register(broker("b1", topic("t"), instance_id="i1"))
    assert registry.unregister("b1", instance_id="someone-else") is False
    assert registry.route("t")
    assert registry.unregister("b1", instance_id="i1") is True
    assert registry.unregister("b1") is False
    with pytest.raises(TopicNotFound):
        registry.route("t")
    assert registry.brokers() == []


# -- listings -----------------------------------------------------------------------------------


def test_list_brokers(registry: Registry, clock: FakeClock) -> None:
    registry.register(broker("b2", topic("x"), topic("y"), cluster="c2", port=2))
    registry.register(broker("b1", topic("x"), cluster="c2", port=1))
    registry.register(broker("a9", cluster="c1", port=9))
    clock.advance(3)
    registry.register(broker("b1", topic("x"), cluster="c2", port=1))
    statuses = registry.brokers()
    assert [(s.cluster_name, s.broker_name) for s in statuses] == [("c1", "a9"), ("c2", "b1"), ("c2", "b2")]
    assert [s.topic_count for s in statuses] == [0, 1, 2]
    assert [s.last_heartbeat_age_s for s in statuses] == [3, 0, 3]
    assert [s.broker_name for s in registry.brokers("c2")] == ["b1", "b2"]
    assert registry.brokers("nope") == []


def test_list_topics(registry: Registry) -> None:
    registry.register(broker("b2", topic("t", 2, message_types=frozenset({MessageType.DELAY})), port=2))
    registry.register(broker("b1", topic("t", 4), topic("%RETRY%g"), port=1))
    summaries = registry.topics()
    assert [s.name for s in summaries] == ["%RETRY%g", "t"]
    t = summaries[1]
    assert t.broker_names == ("b1", "b2")
    assert t.queue_count == 6
    assert t.message_types == frozenset({MessageType.NORMAL, MessageType.DELAY})


# -- bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("registration", "error"),
    [
        (broker(""), BadRequest),
        (broker("bad name!"), BadRequest),
        (broker("b1", cluster=""), BadRequest),
        (dataclasses.replace(broker("b1"), address="nohost"), BadRequest),
        (dataclasses.replace(broker("b1"), address="h:0"), BadRequest),
        (dataclasses.replace(broker("b1"), address="::1:80"), BadRequest),
        # A broker listening on 0.0.0.0 that registered that: every reader would dial its own machine.
        (dataclasses.replace(broker("b1"), address="0.0.0.0:10911"), BadRequest),
        (dataclasses.replace(broker("b1"), client_endpoint="0.0.0.0:8081"), BadRequest),
        (broker("b1", topic("")), IllegalTopic),
        (broker("b1", topic("a b")), IllegalTopic),
        (broker("b1", topic("t", 0)), BadRequest),
        (broker("b1", topic("t", 1_000_000)), BadRequest),
        (broker("b1", topic("t"), topic("t")), BadRequest),
        (broker("b1", topic("t", message_types=frozenset())), BadRequest),
        (broker("b1", sequence=-1), BadRequest),
        (broker("b1", epoch=-1), BadRequest),
    ],
)
def test_bad_registration_is_refused_and_changes_nothing(
    registry: Registry, registration: BrokerRegistration, error: type[Exception]
) -> None:
    registry.register(broker("b1", topic("kept")))
    with pytest.raises(error):
        registry.register(registration)
    assert registry.route("kept").brokers[0].address == "127.0.0.1:10911"
    assert len(registry.brokers()) == 1


def test_bad_lookups(registry: Registry) -> None:
    with pytest.raises(IllegalTopic):
        registry.route("")
    with pytest.raises(TopicNotFound):
        registry.route("unknown")
    with pytest.raises(BadRequest):
        registry.unregister("")


def test_broker_limit(clock: FakeClock) -> None:
    registry = Registry(broker_expiry_s=EXPIRY_S, max_brokers=2, clock=clock)
    registry.register(broker("b1", port=1))
    registry.register(broker("b2", port=2))
    with pytest.raises(TooManyRequests):
        registry.register(broker("b3", port=3))
    registry.register(broker("b2", topic("t"), port=2))  # known brokers still update
    clock.advance(EXPIRY_S)
    registry.register(broker("b3", port=3))  # expired ones make room


def test_registry_rejects_nonsense_settings() -> None:
    with pytest.raises(ValueError):
        Registry(broker_expiry_s=0)


# -- addresses ----------------------------------------------------------------------------------


def test_parse_addresses() -> None:
    assert parse_addresses("a:1;b:2; a:1 ;") == ["a:1", "b:2"]
    assert parse_addresses("[::1]:9876") == ["[::1]:9876"]
    assert split_address("[::1]:9876") == ("[::1]", 9876)


@pytest.mark.parametrize("text", ["", ";", "a", "a:", "a:x", "a:70000", "a:1,b:2", "::1:9876", "[::1:9876"])
def test_parse_addresses_rejects_malformed(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_addresses(text)


# -- young: a NameServer that started moments ago (issue 30) -----------------------------------


def test_routes_are_young_for_young_s_after_start(clock: FakeClock) -> None:
    reg = Registry(broker_expiry_s=EXPIRY_S, young_s=EXPIRY_S / 2, clock=clock)
    reg.register(broker("b1", topic("orders")))
    assert reg.young and reg.route("orders").young
    clock.advance(EXPIRY_S / 2 - 0.1)
    assert reg.route("orders").young
    clock.advance(0.1)
    assert not reg.young and not reg.route("orders").young
    assert not Registry(broker_expiry_s=EXPIRY_S, clock=clock).young  # young_s 0: never young


def test_young_s_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="young_s"):
        Registry(broker_expiry_s=EXPIRY_S, young_s=-1)


def test_merged_routes_hold_every_broker_any_nameserver_holds_and_are_young_only_if_all_are() -> None:
    a = BrokerQueues("a", "127.0.0.1:1", "c", 4, Permission.READ_WRITE, frozenset())
    b = BrokerQueues("b", "127.0.0.1:2", "c", 4, Permission.READ_WRITE, frozenset())
    young = TopicRoute("t", (b,), young=True)
    mature = TopicRoute("t", (a,))
    merged = merge_routes([young, mature])
    assert [x.broker_name for x in merged.brokers] == ["a", "b"] and not merged.young
    assert merge_routes([young, TopicRoute("t", (a, b), young=True)]).young


def test_a_stalled_nameserver_is_young_again_until_young_s_after_it_wakes(clock: FakeClock) -> None:
    reg = Registry(broker_expiry_s=EXPIRY_S, young_s=2.0, stall_s=1.5, clock=clock)
    clock.advance(1.0)
    assert not reg.tick() and reg.young
    clock.advance(1.0)
    assert not reg.tick() and not reg.young  # swept every second: not young any more
    clock.advance(5.0)  # stopped for 5 s: no sweep ran
    assert reg.young  # asked before the sweep noticed
    assert reg.tick() and reg.young
    clock.advance(1.0)
    assert not reg.tick() and reg.young
    clock.advance(1.1)
    assert not reg.tick() and not reg.young


def test_the_epoch_crosses_the_wire() -> None:
    reg = BrokerRegistration("c1", "g1", "10.0.0.2:10911", (topic("t"),), instance_id="i", sequence=3, epoch=7)
    assert registration_from_pb(registration_to_pb(reg)) == reg
