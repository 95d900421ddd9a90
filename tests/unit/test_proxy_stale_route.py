"""A send refused TOPIC_NOT_FOUND by the broker a cached route named (the topic was deleted since)
makes the proxy route the topic afresh (`BrokerDirectory.forget`): the next lookup asks the
NameServer again instead of serving the stale route until the refresh loop and
UNKNOWN_TOPIC_GRACE_S let it go. A broker never recreates the topic from the send (docs/shards.md)."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from broker.client.api import NO_CONTEXT
from common.errors import TopicNotFound
from common.model import ALL_MESSAGE_TYPES, Permission
from nameserver.model import BrokerQueues, TopicRoute
from proxy.core.producer import ProducerService
from proxy.directory import ClusterDirectory
from tests.helpers.records import outgoing


class _NameServer:
    def __init__(self) -> None:
        self.known = True
        self.asked = 0

    async def get_route(self, topic: str) -> TopicRoute:
        self.asked += 1
        if not self.known:
            raise TopicNotFound(f"topic {topic} does not exist")
        return TopicRoute(topic, (BrokerQueues("b1", "127.0.0.1:1", "c", 1, Permission.READ_WRITE, ALL_MESSAGE_TYPES),))


class _Deleted:
    """A broker that no longer holds the topic."""

    async def send(self, topic: str, queue_id: int, records: list[bytes], *, ctx: object = NO_CONTEXT) -> list[Any]:
        raise TopicNotFound(f"topic {topic} does not exist on this broker")

    async def close(self) -> None:
        return None


def test_a_send_refused_topic_not_found_drops_the_cached_route() -> None:
    async def scenario() -> None:
        ns = _NameServer()
        directory = ClusterDirectory(cast(Any, ns), refresh_s=60.0, remote=lambda *_, **__: cast(Any, _Deleted()))
        assert [r.broker for r in await directory.route("t")] == ["b1"]
        ns.known = False  # deleted: the NameServer forgot it, this proxy's route did not
        assert [r.broker for r in await directory.route("t")] == ["b1"]  # served from the cache
        service = ProducerService(directory, topics_max=8)
        (outcome,) = await service.send(NO_CONTEXT, [("t", outgoing(b"x", "M-1"))])
        assert isinstance(outcome, TopicNotFound)
        with pytest.raises(TopicNotFound):  # asked afresh: the NameServer knows no such topic
            await directory.route("t")
        assert ns.asked == 2

    asyncio.run(asyncio.wait_for(scenario(), 10.0))
