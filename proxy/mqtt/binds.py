"""The bind topics MQTT topics live in (docs/mqtt.md, "Mapping"): made on first use, their brokers,
the consumer groups of sessions on those brokers, and the namespace's bind topics for filters whose
first level is a wildcard.

A bind topic is a LITE topic. One that no NameServer knows is created on every broker the proxy
knows (as `sluice admin topic create --type lite` does), and its route waited for; in the merged
topology the route lookup creates it (the first LITE message decides its type). A topic of that name
that is not a LITE topic is refused (0x90 Topic Name invalid: it is a RocketMQ topic of another type).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from broker.client.api import ConsumeFrom, GroupSpec, TopicSpec
from common.errors import ConsumerGroupNotFound, SluiceError, TopicNotFound
from common.logs import kv
from common.model import MessageType
from proxy.core.routing import writable_brokers
from proxy.directory import BrokerDirectory, BrokerRoute
from proxy.mqtt.codes import TOPIC_NAME_INVALID, MqttError
from proxy.names import SEPARATOR

log = logging.getLogger("sluice.proxy.mqtt")

LITE = frozenset({MessageType.LITE})
_UNDECIDED = frozenset(MessageType)  # an auto-created topic before its first message
ROUTE_WAIT_S = 5.0  # a bind topic just created: how long its route is waited for
ROUTE_POLL_S = 0.1
# Session groups: redelivered as often as MQTT retries (a session that never acknowledges keeps
# its message); never dead-lettered before 1000 attempts.
MAX_ATTEMPTS = 1000
KNOWN_MAX = 100_000  # (broker, group) pairs known to exist, remembered at once


class BindTopics:
    def __init__(self, directory: BrokerDirectory, broker_names: Callable[[], list[str]], queues: int) -> None:
        self._dir = directory
        self._names = broker_names
        self._queues = queues
        self._groups: set[tuple[str, str]] = set()
        self._made_lite: set[str] = set()
        self._listed: dict[str, tuple[float, list[str]]] = {}  # namespace -> (when, bind topics)

    async def brokers(self, bind: str) -> list[str]:
        """The writable brokers of a bind topic, creating it when it does not exist yet."""
        try:
            routes = await self._dir.route(bind)
        except TopicNotFound:
            routes = await self._create(bind)
        kinds = frozenset(t for r in routes for t in r.message_types)
        if kinds != LITE and bind not in self._made_lite:
            if kinds != _UNDECIDED:
                raise MqttError(TOPIC_NAME_INVALID, f"topic {bind} exists and is not a LITE topic: MQTT topics under "
                                "it cannot be stored (docs/mqtt.md, Mapping)")  # fmt: skip
            # Auto-created by the route lookup, its type not decided by a first message yet: LITE now,
            # so that subscriptions can be made before anything is published. Decided as a first
            # LITE message decides it, on every copy (`like`: an undecided copy takes the types,
            # its queues stay; a decided one never changes), not created again over it.
            await self._decide_lite(bind, [r.broker for r in routes])
            if len(self._made_lite) >= KNOWN_MAX:
                self._made_lite.clear()
            self._made_lite.add(bind)
        return writable_brokers(routes)

    async def _decide_lite(self, bind: str, brokers: list[str]) -> None:
        lite = TopicSpec(bind, 1, LITE)
        for name in sorted(brokers):
            try:
                await self._dir.broker(name).get_topic(bind, like=lite)
            except SluiceError as exc:
                log.warning("bind topic not made LITE", extra=kv(topic=bind, broker=name, error=exc.message))

    async def _create(self, bind: str) -> list[BrokerRoute]:
        spec = TopicSpec(bind, self._queues, LITE)
        for name in sorted(self._names()):
            try:  # a broker that holds it already (made meanwhile, by another proxy) refuses: its copy stays
                await self._dir.broker(name).create_topic(spec)
            except SluiceError as exc:
                log.warning("bind topic not created on a broker", extra=kv(topic=bind, broker=name, error=exc.message))
        log.info("MQTT bind topic created", extra=kv(topic=bind))
        deadline = time.monotonic() + ROUTE_WAIT_S
        while True:  # the NameServer learns of it from the brokers' next report
            try:
                return await self._dir.route(bind)
            except TopicNotFound:
                if time.monotonic() >= deadline:
                    raise
                await asyncio.sleep(ROUTE_POLL_S)

    async def ensure_group(self, broker: str, group: str) -> None:
        if (broker, group) in self._groups:
            return
        api = self._dir.broker(broker)
        try:
            await api.get_group(group)
        except ConsumerGroupNotFound:
            await api.create_group(GroupSpec(group, max_delivery_attempts=MAX_ATTEMPTS,
                                             consume_from=ConsumeFrom.EARLIEST))  # fmt: skip
        if len(self._groups) >= KNOWN_MAX:
            self._groups.clear()
        self._groups.add((broker, group))

    async def all_binds(self, namespace: str, max_age_s: float) -> list[str]:
        """The namespace's LITE topics (bind topics), as one broker lists them, at most `max_age_s` old."""
        held = self._listed.get(namespace)
        if held is not None and time.monotonic() - held[0] < max_age_s:
            return held[1]
        names = self._names()
        found: set[str] = set()
        prefix = f"{namespace}{SEPARATOR}" if namespace else ""
        for name in sorted(names):
            try:
                specs = await self._dir.broker(name).list_topics()
            except SluiceError:
                continue
            for spec in specs:
                if spec.message_types != LITE or not spec.name.startswith(prefix):
                    continue
                if not namespace and SEPARATOR in spec.name:
                    continue  # another namespace's
                found.add(spec.name)
        binds = sorted(found)
        self._listed[namespace] = (time.monotonic(), binds)
        return binds
