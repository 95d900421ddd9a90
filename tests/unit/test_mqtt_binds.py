"""The bind topics the MQTT gateway makes (proxy/mqtt/binds.py; docs/mqtt.md, "Bind topics"): made
only when no broker holds the topic and every broker answered, as one definition on every broker;
a copy a broker holds (the NameServer not listing it yet) is never overwritten; a topic created on
first use is decided LITE once; with `create_bind_topics` off nothing is made."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, cast

import pytest

from broker.client.api import TopicSpec
from common.errors import TopicNotFound, Unavailable
from common.model import UNDECIDED_TYPES, MessageType, Permission
from proxy.directory import BrokerRoute
from proxy.mqtt.binds import LITE, BindTopics
from proxy.mqtt.codes import IMPLEMENTATION_SPECIFIC_ERROR, TOPIC_NAME_INVALID, MqttError

NORMAL = frozenset({MessageType.NORMAL})


@dataclass
class Broker:
    name: str
    held: dict[str, TopicSpec] = field(default_factory=dict)
    silent: bool = False
    created: list[TopicSpec] = field(default_factory=list)

    async def get_topic(self, name: str) -> TopicSpec:
        if self.silent:
            raise Unavailable(f"{self.name} does not answer")
        if name not in self.held:
            raise TopicNotFound(name)
        return self.held[name]

    async def create_topic(self, spec: TopicSpec) -> TopicSpec:
        self.created.append(spec)
        self.held[spec.name] = spec
        return spec


class Directory:
    """Routes from what the brokers hold, once `listed` (the NameServer learnt of it)."""

    def __init__(self, brokers: list[Broker]) -> None:
        self.brokers = {b.name: b for b in brokers}
        self.listed: set[str] = set()
        self.decided: list[tuple[str, MessageType]] = []

    async def route(self, topic: str) -> list[BrokerRoute]:
        holders = [b for b in self.brokers.values() if topic in b.held]
        if not holders or (topic not in self.listed and not any(b.created for b in holders)):
            raise TopicNotFound(topic)
        return [BrokerRoute(b.name, b.held[topic].queue_count, Permission.READ_WRITE, b.held[topic].message_types)
                for b in holders]  # fmt: skip

    async def decide(self, topic: str, first: MessageType) -> list[BrokerRoute]:
        self.decided.append((topic, first))
        for b in self.brokers.values():
            if topic in b.held:
                b.held[topic] = TopicSpec(topic, b.held[topic].queue_count, frozenset({first}))
        return await self.route(topic)

    def broker(self, name: str) -> Broker:
        return self.brokers[name]

    def broker_names(self) -> list[str]:
        return sorted(self.brokers)


def binds(directory: Directory, *, create: bool = True) -> BindTopics:
    return BindTopics(cast(Any, directory), directory.broker_names, queues=1, create=create)


def test_a_bind_topic_no_broker_holds_is_made_on_every_broker() -> None:
    d = Directory([Broker("a"), Broker("b")])
    assert asyncio.run(binds(d).brokers("sensors")) == ["a", "b"]
    assert [s.message_types for b in d.brokers.values() for s in b.created] == [LITE, LITE]


def test_a_copy_a_broker_holds_is_never_overwritten() -> None:
    """The NameServer does not list it yet (it restarted): the broker's definition stands."""
    a = Broker("a", held={"orders": TopicSpec("orders", 4, NORMAL)})
    d = Directory([a, Broker("b")])
    with pytest.raises(MqttError) as refused:
        asyncio.run(binds(d).brokers("orders"))
    assert refused.value.reason == TOPIC_NAME_INVALID
    assert a.held["orders"].message_types == NORMAL
    assert not any(b.created for b in d.brokers.values())


def test_a_broker_that_does_not_answer_stops_the_creation() -> None:
    d = Directory([Broker("a"), Broker("b", silent=True)])
    with pytest.raises(Unavailable):
        asyncio.run(binds(d).brokers("sensors"))
    assert not any(b.created for b in d.brokers.values())


def test_without_create_bind_topics_only_existing_ones_are_used() -> None:
    d = Directory([Broker("a", held={"made": TopicSpec("made", 1, LITE)}), Broker("b")])
    d.listed.add("made")
    gateway = binds(d, create=False)
    with pytest.raises(MqttError) as refused:
        asyncio.run(gateway.brokers("sensors"))
    assert refused.value.reason == IMPLEMENTATION_SPECIFIC_ERROR and "sluice admin topic create" in str(refused.value)
    assert asyncio.run(gateway.brokers("made")) == ["a"]


def test_a_topic_created_on_first_use_is_decided_lite_once() -> None:
    d = Directory([Broker("a", held={"auto": TopicSpec("auto", 2, UNDECIDED_TYPES)})])
    d.listed.add("auto")
    assert asyncio.run(binds(d).brokers("auto")) == ["a"]
    assert d.decided == [("auto", MessageType.LITE)]
    assert not d.brokers["a"].created
