"""A broker that creates topics on first use (`LocalBroker.ensure_topic`, docs/shards.md "Topics,
groups and admin"): a copy is created as the cluster's definition when one is given, a system
topic's name is never created by a client's lookup, and the types a first message decides, here or
on another broker, never change afterwards. The same over the internal service (`like` on the
wire), for topics and consumer groups. Only a proxy's lookup creates: a send never creates its
topic (a deleted one included), a pop never its consumer group."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.client.api import GroupSpec, PopRequest, TopicSpec
from broker.client.remote import RemoteBroker
from broker.config import BrokerConfig
from broker.local import LocalBroker
from common.errors import ConsumerGroupNotFound, MessageTypeConflict, PreconditionFailed, TopicNotFound
from common.model import ALL_MESSAGE_TYPES, UNDECIDED_TYPES, MessageType
from tests.helpers.broker_fixtures import start_broker_process
from tests.helpers.records import outgoing


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[tuple[asyncio.AbstractEventLoop, LocalBroker]]:
    loop = asyncio.new_event_loop()
    local = LocalBroker(BrokerConfig(name="b1", data_dir=tmp_path, auto_create=True, auto_create_queue_count=8))
    loop.run_until_complete(local.start())
    try:
        yield loop, local
    finally:
        loop.run_until_complete(local.close())
        loop.close()


def test_a_copy_is_created_as_the_cluster_defines_it(broker: tuple[asyncio.AbstractEventLoop, LocalBroker]) -> None:
    loop, local = broker

    async def run() -> None:
        own = await local.get_topic("own", auto_create=True)
        assert own == TopicSpec("own", 8, UNDECIDED_TYPES)  # this broker decides: its default
        like = TopicSpec("copy", 3, UNDECIDED_TYPES)
        assert await local.get_topic("copy", auto_create=True, like=like) == like
        assert local.held_topic("copy") == like
        assert local.held_topic("never") is None and "never" not in local.metadata.topics

    loop.run_until_complete(run())


def test_system_topic_names_are_not_created_by_a_lookup(broker: tuple[asyncio.AbstractEventLoop, LocalBroker]) -> None:
    loop, local = broker

    async def run() -> None:
        with pytest.raises(TopicNotFound):  # it was ILLEGAL_TOPIC: a client reading a DLQ before it exists
            await local.ensure_topic("%DLQ%g")
        with pytest.raises(TopicNotFound):
            await local.get_topic("%DLQ%g", auto_create=True)

    loop.run_until_complete(run())


def test_a_decided_copy_keeps_its_types(broker: tuple[asyncio.AbstractEventLoop, LocalBroker]) -> None:
    loop, local = broker

    async def run() -> None:
        await local.get_topic("t", auto_create=True)
        lite = frozenset({MessageType.LITE})
        decided = await local.get_topic("t", like=TopicSpec("t", 1, lite))  # another broker's first message
        assert (decided.queue_count, decided.message_types) == (8, lite)
        again = await local.get_topic("t", like=TopicSpec("t", 1, ALL_MESSAGE_TYPES))
        assert again.message_types == lite
        with pytest.raises(MessageTypeConflict):
            await local.send("t", 0, [outgoing(b"plain", "M-1")])
        await local.get_topic("u", auto_create=True)
        await local.send("u", 0, [outgoing(b"plain", "M-2")])  # its first message decides
        assert local.held_topic("u") == TopicSpec("u", 8, ALL_MESSAGE_TYPES)

    loop.run_until_complete(run())


def test_a_send_never_creates_its_topic_nor_a_pop_its_group(
    broker: tuple[asyncio.AbstractEventLoop, LocalBroker],
) -> None:
    """Even where the broker creates on first use: a send to a topic it does not hold (never made,
    or just deleted: a proxy's stale route) is TOPIC_NOT_FOUND and creates nothing; a pop of a group
    it does not hold is CONSUMER_GROUP_NOT_FOUND and creates nothing."""
    loop, local = broker

    async def run() -> None:
        with pytest.raises(TopicNotFound):
            await local.send("never", 0, [outgoing(b"x", "M-1")])
        await local.create_topic(TopicSpec("gone", 2))
        await local.send("gone", 1, [outgoing(b"old", "M-2")])
        await local.delete_topic("gone")
        with pytest.raises(TopicNotFound):
            await local.send("gone", 1, [outgoing(b"stale", "M-3")])
        assert local.held_topic("never") is None and local.held_topic("gone") is None
        await local.create_topic(TopicSpec("t", 1))
        with pytest.raises(ConsumerGroupNotFound):
            await local.pop(PopRequest("nobody", "t", max_messages=1))
        assert "nobody" not in local.metadata.groups

    loop.run_until_complete(run())


def test_a_creation_never_changes_a_copy_of_another_definition(
    broker: tuple[asyncio.AbstractEventLoop, LocalBroker],
) -> None:
    """`sluice admin topic create` racing a proxy's first use of the same name: the broker that
    holds the first-use copy refuses the creation (PRECONDITION_FAILED, naming both definitions)
    instead of changing it under the copies on the other nodes; the same creation again is
    idempotent, and an update (`--update`) changes it."""
    loop, local = broker
    lite = frozenset({MessageType.LITE})

    async def run() -> None:
        made = await local.get_topic("raced", auto_create=True)
        with pytest.raises(PreconditionFailed, match=r"another definition .*8 queue.*any type"):
            await local.create_topic(TopicSpec("raced", 8, lite))
        assert local.held_topic("raced") == made
        assert await local.create_topic(made) == made
        assert (await local.update_topic(TopicSpec("raced", 8, lite))).message_types == lite

    loop.run_until_complete(run())


def test_the_cluster_s_definitions_cross_the_internal_service(tmp_path: Path) -> None:
    proc = start_broker_process(tmp_path, settings={"name": "b-remote", "auto_create": True})

    async def run() -> None:
        remote = RemoteBroker("b-remote", proc.address)
        try:
            like = TopicSpec("copied", 2, UNDECIDED_TYPES)
            assert await remote.get_topic("copied", auto_create=True, like=like) == like
            lite = TopicSpec("copied", 8, frozenset({MessageType.LITE}))
            assert (await remote.get_topic("copied", like=lite)).message_types == lite.message_types
            fifo = GroupSpec("g", fifo=True, max_delivery_attempts=3)
            assert (await remote.get_group("g", auto_create=True, like=fifo)).spec == fifo
            with pytest.raises(ConsumerGroupNotFound):
                await remote.get_group("other", like=fifo)  # without auto_create nothing is created
            with pytest.raises(ConsumerGroupNotFound):  # nor by a pop
                await remote.pop(PopRequest("other", "copied", max_messages=1))
            with pytest.raises(TopicNotFound):  # nor a topic by a send
                await remote.send("unmade", 0, [outgoing(b"x", "M-1")])
        finally:
            await remote.close()

    try:
        asyncio.run(run())
    finally:
        proc.stop()
