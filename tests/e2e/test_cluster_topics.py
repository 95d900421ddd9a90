"""Topic definitions belong to the cluster (docs/shards.md, "Topics, groups and admin"), with the
official Python client, on clusters that create topics on first use: `sluice up` with its
default two shards and the separated topology (brokers with `auto_create`, proxies with
`auto_create_topics`).

- A topic a broker creates by itself (a dead-letter topic) is routable from every endpoint as soon
  as its first message is stored: a SimpleConsumer bootstrapped at the first endpoint reads the
  dead letters a topic living on the second broker only produced.
- A topic that exists on some brokers is never created on first use on the others: a one-queue
  LITE or PRIORITY topic on the first broker stays one queue there, so lite consumers bind to it
  and a priority backlog comes back in priority order.
- A topic created on first use has one definition: the type its first message decides holds on
  every broker that has a copy.
- A send over a route of before a topic's deletion recreates it nowhere: creating on first use is
  the proxies' decision, never a broker's on a send.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest
from rocketmq import FilterExpression, LiteSimpleConsumer

from tests.e2e.support.clients import configuration, message, producer, receive_count, simple_consumer
from tests.e2e.support.cluster import Cluster, start_merged, start_separated

WAIT_S = 30.0
# The first delivery of a message of a group with max attempts 1 is its last: once it is visible
# again (this long after the receive) the broker dead-letters it.
INVISIBLE_S = 1


@pytest.fixture(scope="module", params=["merged", "separated"])
def autocreating(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A cluster that creates topics and groups on first use: `sluice up` with two shards, or
    the separated topology configured to (both proxies and both brokers)."""
    root = tmp_path_factory.mktemp(f"autocreate-{request.param}")
    if request.param == "merged":
        cluster = start_merged(root, auto_create=True, shards=2)
    else:
        config = root / "sluice.toml"
        config.write_text("[broker]\nauto_create = true\n\n[proxy]\nauto_create_topics = true\n")
        cluster = start_separated(root, config=config)
    try:
        yield cluster
    finally:
        problems = cluster.stop()
        assert not problems, "\n".join(problems)


def _holders(cluster: Cluster, topic: str) -> dict[str, str]:
    """Broker -> the types its copy of `topic` accepts (from `topic describe`; a LITE topic's
    queue rows come with its lite topics)."""
    described = cluster.admin("topic", "describe", topic)
    rows = described["queues"] if isinstance(described, dict) else described
    return {row["broker"]: row["types"] for row in rows}


def _listed(cluster: Cluster, topic: str) -> dict[str, object] | None:
    return next((row for row in cluster.admin("topic", "list") if row["topic"] == topic), None)


def test_dead_letters_of_a_topic_on_the_second_broker_are_read_through_the_first_endpoint(
    autocreating: Cluster, unique: Callable[[str], str]
) -> None:
    cluster = autocreating
    first, second = cluster.brokers[0], cluster.brokers[1]
    topic, group, reader = unique("t"), unique("g"), unique("dlq")
    cluster.admin("topic", "create", topic, "--queues", "1", "--brokers", second)
    cluster.create_group(group, max_attempts=1)
    cluster.create_group(reader, consume_from="earliest")
    with producer(cluster.endpoints, topic) as p:
        sent = p.send(message(topic, b"poison")).message_id
    with simple_consumer(cluster.endpoints, group, {topic: FilterExpression()}) as c:
        (got,) = receive_count(c, 1, ack=False, invisible_s=INVISIBLE_S)
        assert got.message_id == sent
        dlq = f"%DLQ%{group}"
        deadline = time.monotonic() + WAIT_S
        while (row := _listed(cluster, dlq)) is None:  # dead-lettered by the next pop or the redelivery scan
            assert time.monotonic() < deadline, f"{dlq} did not appear within {WAIT_S} s"
            assert c.receive(1, INVISIBLE_S) == [], "a message past its last attempt was delivered again"
    assert row["brokers"] == [second], row
    assert first not in row["brokers"]
    # Bootstrapped at the first endpoint only (the first shard's port, the first proxy).
    with simple_consumer(cluster.first_proxy, reader, {dlq: FilterExpression()}) as c:
        (dead,) = receive_count(c, 1, timeout_s=WAIT_S)
    assert (dead.message_id, dead.body) == (sent, b"poison")
    assert _listed(cluster, dlq) == row, "reading a dead-letter topic created it nowhere else"


def test_a_lite_topic_on_one_broker_is_not_created_on_the_others(
    autocreating: Cluster, unique: Callable[[str], str]
) -> None:
    cluster = autocreating
    first = cluster.brokers[0]
    topic, group = unique("chats"), unique("g")
    cluster.admin("topic", "create", topic, "--type", "lite", "--queues", "1", "--brokers", first)
    consumer = LiteSimpleConsumer(topic, configuration(cluster.endpoints), group, await_duration=3)
    consumer.startup()
    try:
        _settled(consumer)
        consumer.subscribe_lite("room-1")
        with producer(cluster.endpoints, topic) as p:
            for i in range(6):
                msg = message(topic, f"room-1:{i}".encode())
                msg.lite_topic = "room-1"
                p.send(msg)
        got = receive_count(consumer, 6, timeout_s=WAIT_S)  # type: ignore[arg-type]
    finally:
        consumer.shutdown()
    assert [m.body.decode() for m in got] == [f"room-1:{i}" for i in range(6)]
    assert _holders(cluster, topic) == {first: "lite"}
    row = _listed(cluster, topic)
    assert row is not None and (row["queues"], row["brokers"]) == (1, [first]), row


def test_a_priority_topic_on_one_broker_keeps_one_global_order(
    autocreating: Cluster, unique: Callable[[str], str]
) -> None:
    cluster = autocreating
    first = cluster.brokers[0]
    topic, group = unique("p"), unique("g")
    cluster.admin("topic", "create", topic, "--type", "priority", "--max-priority", "9", "--queues", "1",
                  "--brokers", first)  # fmt: skip
    cluster.create_group(group, consume_from="earliest")
    levels = [4, 1, 9, 9, 8, 7, 0, 3, 5, 2, 6, 1]
    with producer(cluster.endpoints, topic) as p:
        for i, level in enumerate(levels):
            msg = message(topic, f"m{i}".encode())
            msg.priority = level
            p.send(msg)
    with simple_consumer(cluster.endpoints, group, {topic: FilterExpression()}) as c:
        got = receive_count(c, len(levels), max_messages=32, timeout_s=WAIT_S)
    assert [m.priority for m in got] == sorted(levels, reverse=True)
    assert _holders(cluster, topic) == {first: "priority"}


def test_a_topic_created_by_its_first_message_has_one_type_on_every_broker(
    autocreating: Cluster, unique: Callable[[str], str]
) -> None:
    cluster = autocreating
    topic = unique("auto")
    with producer(cluster.endpoints, topic) as p:
        for i in range(4):  # one lite topic: its messages reach one broker of the topic
            msg = message(topic, f"lite-{i}".encode())
            msg.lite_topic = "session-1"
            p.send(msg)
    holders = _holders(cluster, topic)
    assert set(holders.values()) == {"lite"}, holders
    if cluster.kind == "merged":  # created on first use on every shard
        assert sorted(holders) == cluster.brokers


STALE_SENDS = 8  # sends after the delete, over the producer's (and the proxies') routes of before it
AUTO_QUEUES = 8  # a topic created on first use: `[broker] auto_create_queue_count`, per broker


def test_a_send_on_a_stale_route_does_not_recreate_a_deleted_topic(
    autocreating: Cluster, unique: Callable[[str], str]
) -> None:
    """A topic on every broker is deleted while a producer holds its route (and the proxies theirs:
    they serve cached routes). A send over such a route reaches a broker that no longer holds the
    topic and is refused TOPIC_NOT_FOUND; that proxy routes the topic afresh for the next send, which
    creates it on first use as the cluster does (on every shard merged, on the first broker
    separated, the default queue count). No broker makes it from a send: before, a broker did, with
    its defaults, a twin only on the brokers the sends reached (docs/shards.md)."""
    cluster = autocreating
    topic = unique("t")
    cluster.admin("topic", "create", topic, "--queues", str(2 * len(cluster.brokers)))
    with producer(cluster.endpoints, topic) as p:
        p.send(message(topic, b"before"))
        cluster.admin("topic", "delete", topic)
        refused: list[str] = []
        for i in range(STALE_SENDS):
            try:
                p.send(message(topic, f"after-{i}".encode()))
            except Exception as exc:  # the client raises its own exception types
                refused.append(str(exc))
    assert all("TOPIC_NOT_FOUND" in e for e in refused), refused
    row = _listed(cluster, topic)
    first_use = cluster.brokers if cluster.kind == "merged" else cluster.brokers[:1]
    assert row is None or (row["brokers"], row["queues"]) == (first_use, AUTO_QUEUES * len(first_use)), (
        f"a send recreated the deleted topic: {row}"
    )


def _settled(consumer: LiteSimpleConsumer) -> None:
    """Until the server's settings arrived (a lite consumer refuses subscriptions before)."""
    deadline = time.monotonic() + 10
    manager = next(v for k, v in vars(consumer).items() if k.endswith("__subscription_manager"))
    while manager.lite_subscription_quota == 0:
        assert time.monotonic() < deadline, "no lite settings from the server within 10 s"
        time.sleep(0.05)
