"""The bind topics MQTT topics live in (docs/mqtt.md, "Mapping" and "Bind topics"): made on first
use, their brokers, the consumer groups of sessions on those brokers, and the namespace's bind
topics for filters whose first level is a wildcard.

A bind topic is a LITE topic, and its definition is the cluster's (docs/shards.md, "Topics, groups
and admin"). MQTT has no request that creates a topic, so the gateway makes the bind topics its
clients use (`[proxy.mqtt] create_bind_topics`, on by default whatever RocketMQ's auto-create says;
off: only bind topics an operator created are used, 0x83 otherwise). A topic no route names is made
only when no broker holds it (every broker asked, as proxy/firstuse.py asks: a NameServer that
restarted moments ago may not list it), as `sluice admin topic create --type lite` makes one: on
every broker, one queue each; a broker that does not answer stops it (no second definition). A
topic a route lookup created on first use, whose type no message decided yet, is decided LITE once
for every copy (`BrokerDirectory.decide`). A topic of that name that is not a LITE topic is refused
(0x90 Topic Name invalid: it is a RocketMQ topic of another type).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from broker.client.api import ConsumeFrom, GroupSpec, TopicSpec
from common.errors import ConsumerGroupNotFound, SluiceError, TopicNotFound, Unavailable
from common.logs import kv
from common.model import MessageType
from proxy import firstuse
from proxy.core.routing import writable_brokers
from proxy.directory import BrokerDirectory, BrokerRoute
from proxy.mqtt.codes import IMPLEMENTATION_SPECIFIC_ERROR, TOPIC_NAME_INVALID, MqttError
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


def _not_lite(bind: str) -> MqttError:
    return MqttError(TOPIC_NAME_INVALID, f"topic {bind} exists and is not a LITE topic: MQTT topics under it cannot "
                     "be stored (docs/mqtt.md, Mapping)")  # fmt: skip


class BindTopics:
    def __init__(
        self, directory: BrokerDirectory, broker_names: Callable[[], list[str]], queues: int, *, create: bool = True
    ) -> None:
        """`create`: make the bind topics clients use (`[proxy.mqtt] create_bind_topics`)."""
        self._dir = directory
        self._names = broker_names
        self._queues = queues
        self._create_allowed = create
        self._groups: set[tuple[str, str]] = set()
        self._listed: dict[str, tuple[float, list[str]]] = {}  # namespace -> (when, bind topics)

    async def brokers(self, bind: str) -> list[str]:
        """The writable brokers of a bind topic, creating it when it does not exist yet."""
        try:
            routes = await self._dir.route(bind)
        except TopicNotFound:
            routes = await self._create(bind)
        kinds = frozenset(t for r in routes for t in r.message_types)
        if kinds == _UNDECIDED:  # created on first use by the route lookup: decided LITE for every copy
            routes = await self._dir.decide(bind, MessageType.LITE)
            kinds = frozenset(t for r in routes for t in r.message_types)
        if kinds != LITE:
            raise _not_lite(bind)
        return writable_brokers(routes)

    async def _create(self, bind: str) -> list[BrokerRoute]:
        """Make `bind` a LITE topic on every broker, unless a broker holds it already (its
        definition is then the cluster's: waited for in the route) or did not answer."""
        if not self._create_allowed:
            raise MqttError(IMPLEMENTATION_SPECIFIC_ERROR, f"no topic {bind} holds these MQTT topics, and this server "
                            f"does not create them: an operator creates it (sluice admin topic create {bind} --type "
                            "lite; docs/mqtt.md, Bind topics)")  # fmt: skip
        names = sorted(self._names())
        found, unanswered = await firstuse.held(bind, {n: self._dir.broker(n) for n in names})
        kinds = frozenset(t for spec in found.values() for t in spec.message_types)
        if found and kinds not in (LITE, _UNDECIDED):
            raise _not_lite(bind)
        if not found:
            if unanswered:
                raise Unavailable(f"broker(s) {', '.join(unanswered)} did not say whether they hold topic {bind}: it "
                                  "is not created now (it could be a second definition); publish again")  # fmt: skip
            spec = TopicSpec(bind, self._queues, LITE)
            for name in names:
                await self._dir.broker(name).create_topic(spec)
            log.info("MQTT bind topic created", extra=kv(topic=bind, brokers=len(names)))
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
