"""FIFO order on a replicated primary (docs/replication.md, "FIFO message groups"): a message group's
next message is handed out only once every in-sync member holds the ack of the one before it; so is
a lite topic's (docs/lite-topics.md: a lite topic is consumed in order, as one lane).

Three real `sluice broker` processes on a real etcd, `min_insync` 2; both replicas paused (SIGSTOP:
their connections stay open, they stop acknowledging), so the primary cannot make an ack durable:

- while the ack waits for the replicas, a second consumer's pop must not get the group's next
  message (before: the ack was applied on the primary before the wait, and the next message went
  out at once, to a consumer other than the one still holding the first); for a lite topic too, its
  two subscribers being two clients of one group (before: the same);
- once they left the in-sync set the ack is refused (HA_NOT_AVAILABLE: "fewer than min_insync"),
  and the next message still waits until the replicas are back and hold that ack (before: it went
  out at once, though a failover to a replica would have delivered the first message again).

Each test runs its own etcd and group (~15 s each on a loaded machine).
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.client.api import GroupSpec, LiteAction, LiteSync, PopRequest, TopicSpec
from broker.client.remote import RemoteBroker
from common.errors import Unavailable
from common.model import MessageType
from common.record import SYSPROP_LITE_TOPIC
from tests.helpers.broker_fixtures import ServerProcess
from tests.helpers.etcd import EtcdProcess, start_etcd
from tests.helpers.records import outgoing
from tests.integration.test_replication_failover import GROUP, TIMEOUT_S, _etcd_json, _in_sync, _start_group, _wait_for

TOPIC = "fifo-orders"
CONSUMERS = "fifo-consumers"
MESSAGE_GROUP = "order-7"
INVISIBLE_MS = 60_000  # no redelivery within a test: what a pop returns is the group's next message
POLL_MS = 1_000
LITE_TOPIC = "chat-7"
# The two consumers of the group: lite consumers are clients with subscriptions of their own.
FIRST, SECOND = "client-1", "client-2"


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdProcess]:
    proc = start_etcd(tmp_path)
    yield proc
    proc.stop()


async def _group_of_two_messages(etcd: EtcdProcess, kind: str = "fifo") -> tuple[dict[str, Any], RemoteBroker]:
    """The primary (its etcd leader record) and a client of it, once all three members are in sync,
    with two messages stored in order: of one message group in a one-queue FIFO topic (`kind`
    "fifo"), or of one lite topic both clients of the group subscribe to ("lite")."""
    leader = await _wait_for("a leader", lambda: _etcd_json(etcd, "leader"))
    await _wait_for("three members in sync", lambda: _in_sync(etcd, 3))
    remote = RemoteBroker(GROUP, leader["address"], timeout_s=30)
    lite = kind == "lite"
    await remote.create_topic(TopicSpec(TOPIC, 1, frozenset({MessageType.LITE if lite else MessageType.FIFO})))
    await remote.create_group(GroupSpec(CONSUMERS, fifo=not lite))
    for client in (FIRST, SECOND) if lite else ():
        await remote.sync_lite_subscription(LiteSync(CONSUMERS, TOPIC, client, LiteAction.PARTIAL_ADD, (LITE_TOPIC,)))
    for i in range(2):
        body, msg_id = f"m{i}".encode(), f"id-{i}"
        sent = (outgoing(body, msg_id, MessageType.LITE, system_properties={SYSPROP_LITE_TOPIC: LITE_TOPIC}) if lite
                else outgoing(body, msg_id, message_type=MessageType.FIFO, message_group=MESSAGE_GROUP))  # fmt: skip
        await remote.send(TOPIC, 0, [sent])
    return leader, remote


async def _pop(remote: RemoteBroker, long_poll_ms: int = POLL_MS, client: str = "") -> list[bytes]:
    """Bodies a pop of the group gets (a lite pop for `client`)."""
    got = await remote.pop(PopRequest(CONSUMERS, TOPIC, None, 16, INVISIBLE_MS, long_poll_ms=long_poll_ms,
                                      lite_client=client))  # fmt: skip
    return [m.body for m in got]


def _pause_replicas(procs: dict[str, ServerProcess], leader: dict[str, Any], sig: signal.Signals) -> None:
    for name, proc in procs.items():
        if name != leader["name"]:
            proc.child.signal(sig)


def _run(body: Any, procs: dict[str, ServerProcess]) -> None:
    try:
        asyncio.run(asyncio.wait_for(body(), TIMEOUT_S))
    finally:
        for proc in procs.values():
            proc.child.signal(signal.SIGCONT)
            proc.stop()


@pytest.mark.parametrize("kind", ["fifo", "lite"])
def test_the_next_message_waits_while_the_ack_before_it_waits_for_the_replicas(
    etcd: EtcdProcess, tmp_path: Path, kind: str
) -> None:
    procs: dict[str, ServerProcess] = {}
    first_client, second_client = (FIRST, SECOND) if kind == "lite" else ("", "")

    async def body() -> None:
        # max_lag_ms 20 s: the paused replicas stay in the in-sync set, so the ack waits for them.
        await asyncio.to_thread(_start_group, tmp_path, etcd, procs, max_lag_ms=20_000)
        leader, remote = await _group_of_two_messages(etcd, kind)
        first = await remote.pop(PopRequest(CONSUMERS, TOPIC, None, 16, INVISIBLE_MS, lite_client=first_client))
        assert [m.body for m in first] == [b"m0"]
        _pause_replicas(procs, leader, signal.SIGSTOP)
        ack = asyncio.create_task(remote.ack(CONSUMERS, TOPIC, [first[0].receipt_handle]))
        await asyncio.sleep(0.3)  # the ack reached the primary and waits for the replicas
        assert not ack.done(), "the ack should wait for the paused replicas"
        # Another consumer, while the first one's ack is not answered: nothing of the group.
        assert await _pop(remote, client=second_client) == [], (
            f"the {kind} group's next message went out while the ack before it waited"
        )
        _pause_replicas(procs, leader, signal.SIGCONT)
        results = await ack
        assert [r.error for r in results] == [None]
        assert await _pop(remote, long_poll_ms=5_000, client=second_client) == [b"m1"]
        await remote.close()

    _run(body, procs)


def test_the_next_message_waits_for_the_replicas_after_an_ack_refused_below_min_insync(
    etcd: EtcdProcess, tmp_path: Path
) -> None:
    procs: dict[str, ServerProcess] = {}

    async def body() -> None:
        await asyncio.to_thread(_start_group, tmp_path, etcd, procs)  # max_lag_ms 1.5 s
        leader, remote = await _group_of_two_messages(etcd)
        first = await remote.pop(PopRequest(CONSUMERS, TOPIC, None, 16, INVISIBLE_MS))
        assert [m.body for m in first] == [b"m0"]
        _pause_replicas(procs, leader, signal.SIGSTOP)

        async def alone() -> bool:
            insync = await _etcd_json(etcd, "insync")
            return insync is not None and insync["members"] == [leader["name"]]

        await _wait_for("the paused replicas out of the in-sync set", alone)
        with pytest.raises(Unavailable, match="min_insync"):
            await remote.ack(CONSUMERS, TOPIC, [first[0].receipt_handle])
        # The primary applied the ack, the replicas do not hold it: a failover now would deliver m0
        # again, so m1 must not go out yet.
        assert await _pop(remote) == [], "the group's next message went out on an ack no replica holds"
        _pause_replicas(procs, leader, signal.SIGCONT)
        await _wait_for("the replicas back in sync", lambda: _in_sync(etcd, 3))
        assert await _pop(remote, long_poll_ms=5_000) == [b"m1"]
        await remote.close()

    _run(body, procs)
