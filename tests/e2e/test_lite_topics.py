"""Lite topics with the official Python client, in both topologies (docs/lite-topics.md).

LiteSimpleConsumer and LitePushConsumer subscribe to lite topics of a LITE bind topic and receive
only those, each lite topic in order; unsubscribing stops delivery; subscriptions survive a
restart without the client re-sending them; quotas and bad names are refused with their codes;
an expired lite topic is announced on the subscriber's Telemetry stream.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from google.protobuf.duration_pb2 import Duration
from rocketmq import ConsumeResult, LitePushConsumer, LiteSimpleConsumer
from rocketmq.grpc_protocol import MessageType
from rocketmq.v5.model import Message

from tests.e2e.support import raw
from tests.e2e.support.clients import configuration, message, producer, receive_until
from tests.e2e.support.cluster import Cluster, start_merged

WAIT_S = 30.0
RESTART_WAIT_S = 90.0  # bounded; generous for a loaded machine


def lite_message(topic: str, lite_topic: str, body: bytes) -> Message:
    msg = message(topic, body)
    msg.lite_topic = lite_topic
    return msg


def lite_topic_of(m: Message) -> str:
    return str(m.lite_topic)


def create_lite_topic(cluster: Cluster, name: str, *extra: str) -> str:
    cluster.admin("topic", "create", name, "--type", "lite", "--queues", str(len(cluster.brokers)), *extra)
    return name


def lite_consumer(cluster: Cluster, topic: str, group: str) -> LiteSimpleConsumer:
    consumer = LiteSimpleConsumer(topic, configuration(cluster.endpoints), group, await_duration=3)
    consumer.startup()
    settled(consumer)
    return consumer


def settled(consumer: object) -> None:
    """Wait for the server's settings: a lite simple consumer's startup does not, and its
    subscribe_lite refuses everything (quota 0) until they arrive."""
    deadline = time.monotonic() + 10
    manager = next(v for k, v in vars(consumer).items() if k.endswith("__subscription_manager"))
    while manager.lite_subscription_quota == 0:
        assert time.monotonic() < deadline, "no lite settings from the server within 10 s"
        time.sleep(0.05)


def test_lite_simple_consumer_receives_only_its_lite_topics_in_order(
    cluster: Cluster, unique: Callable[[str], str]
) -> None:
    topic = create_lite_topic(cluster, unique("t"))
    group = cluster.create_group(unique("g"))
    consumer = lite_consumer(cluster, topic, group)
    try:
        consumer.subscribe_lite("chat-a")
        consumer.subscribe_lite("chat-b")
        with producer(cluster.endpoints, topic) as p:
            for i in range(5):
                for lite in ("chat-a", "chat-b", "chat-c"):
                    receipt = p.send(lite_message(topic, lite, f"{lite}:{i}".encode()))
                    assert receipt.message_id
        got = receive_until(consumer, lambda g: len(g) >= 10, timeout_s=WAIT_S)  # type: ignore[arg-type]
        assert {m.message_type for m in got} == {MessageType.LITE}
        for lite in ("chat-a", "chat-b"):
            bodies = [m.body.decode() for m in got if lite_topic_of(m) == lite]
            assert bodies == [f"{lite}:{i}" for i in range(5)], f"{lite} out of order or incomplete: {bodies}"
        assert not [m for m in got if lite_topic_of(m) == "chat-c"], "a lite topic nobody subscribed to was delivered"

        consumer.unsubscribe_lite("chat-b")
        with producer(cluster.endpoints, topic) as p:
            p.send(lite_message(topic, "chat-b", b"after-unsubscribe"))
            p.send(lite_message(topic, "chat-a", b"still-subscribed"))
        got = receive_until(consumer, lambda g: any(m.body == b"still-subscribed" for m in g), timeout_s=WAIT_S)  # type: ignore[arg-type]
        assert not [m for m in got if m.body == b"after-unsubscribe"]
    finally:
        consumer.shutdown()
    listed = cluster.admin("lite", "list", topic, "--group", group)
    assert listed["lite_topics"] == 3, listed
    names = {row["lite_topic"]: row for row in listed["largest"]}
    assert set(names) == {"chat-a", "chat-b", "chat-c"}
    assert names["chat-c"]["backlog"] == 5 and names["chat-a"]["backlog"] == 0


def test_lite_order_holds_across_a_retry(cluster: Cluster, unique: Callable[[str], str]) -> None:
    """The next message of a lite topic waits for the one in flight (here: not acked, redelivered)."""
    topic = create_lite_topic(cluster, unique("t"))
    group = cluster.create_group(unique("g"))
    consumer = lite_consumer(cluster, topic, group)
    try:
        consumer.subscribe_lite("task-1")
        with producer(cluster.endpoints, topic) as p:
            for i in range(3):
                p.send(lite_message(topic, "task-1", f"step-{i}".encode()))
        first = receive_until(consumer, lambda g: len(g) >= 1, ack=False, invisible_s=2, timeout_s=WAIT_S)  # type: ignore[arg-type]
        assert [m.body for m in first] == [b"step-0"]
        again = receive_until(consumer, lambda g: len(g) >= 1, timeout_s=WAIT_S)  # type: ignore[arg-type]
        assert again[0].body == b"step-0" and again[0].delivery_attempt == 2, "the retry comes before step-1"
        rest = receive_until(consumer, lambda g: len(g) >= 2, timeout_s=WAIT_S)  # type: ignore[arg-type]
        assert [m.body for m in rest] == [b"step-1", b"step-2"]
    finally:
        consumer.shutdown()


def test_lite_push_consumer_consumes_its_lite_topics(cluster: Cluster, unique: Callable[[str], str]) -> None:
    topic = create_lite_topic(cluster, unique("t"))
    group = cluster.create_group(unique("g"))
    seen: queue.Queue[tuple[str, bytes]] = queue.Queue()

    class Listener:
        def consume(self, msg: Message) -> ConsumeResult:
            seen.put((lite_topic_of(msg), msg.body))
            return ConsumeResult.SUCCESS

    consumer = LitePushConsumer(configuration(cluster.endpoints), group, topic, Listener(), consumption_thread_count=2)
    consumer.startup()
    settled(consumer)
    try:
        consumer.subscribe_lite("device-1")
        with producer(cluster.endpoints, topic) as p:
            for i in range(4):
                p.send(lite_message(topic, "device-1", f"d1-{i}".encode()))
                p.send(lite_message(topic, "device-2", f"d2-{i}".encode()))
        got = [seen.get(timeout=WAIT_S) for _ in range(4)]
        assert got == [("device-1", f"d1-{i}".encode()) for i in range(4)]
        time.sleep(1.0)
        assert seen.empty(), "device-2 is not subscribed"
    finally:
        consumer.shutdown()


def test_lite_bad_input_and_quotas(cluster: Cluster, unique: Callable[[str], str]) -> None:
    topic = create_lite_topic(cluster, unique("t"), "--max-lite-topics", "3")
    normal = cluster.create_topic(unique("n"))
    group = cluster.create_group(unique("g"))

    def sync(names: list[str], *, bind: str = topic, action: int = raw.pb.PARTIAL_ADD, grp: str = group) -> str:
        request = raw.spb.SyncLiteSubscriptionRequest(action=action, topic=raw.resource(bind), group=raw.resource(grp),
                                                      lite_topic_set=names)  # fmt: skip
        with raw.stub(cluster.first_proxy) as s:
            response = s.SyncLiteSubscription(request, metadata=raw.headers(), timeout=raw.RPC_TIMEOUT_S)
        return raw.code_name(response.status.code)

    assert sync([""]) == "ILLEGAL_LITE_TOPIC"
    assert sync(["x" * 65]) == "ILLEGAL_LITE_TOPIC"
    assert sync(["has space"]) == "ILLEGAL_LITE_TOPIC"
    assert sync(["ok"], bind=normal) == "BAD_REQUEST"
    assert sync(["ok"], grp="") == "ILLEGAL_CONSUMER_GROUP"
    assert sync([f"s{i}" for i in range(10_001)], action=raw.pb.COMPLETE_ADD) == "LITE_SUBSCRIPTION_QUOTA_EXCEEDED"
    listed = cluster.admin("lite", "list", topic)
    assert listed["lite_topics"] == 0, f"nothing refused was stored: {listed}"
    # Each broker holds at most 3; 7 lite topics cannot fit on the brokers of either topology.
    assert sync([f"q{i}" for i in range(7)]) == "LITE_TOPIC_QUOTA_EXCEEDED"
    with raw.stub(cluster.first_proxy) as s:
        bad = raw.message(topic, b"x", message_type=raw.pb.LITE)
        bad.system_properties.lite_topic = "bad name"
        assert raw.code_name(raw.send(s, bad).status.code) == "ILLEGAL_LITE_TOPIC"
        missing = raw.message(topic, b"x", message_type=raw.pb.NORMAL)
        assert raw.code_name(raw.send(s, missing).status.code) == "MESSAGE_PROPERTY_CONFLICT_WITH_TYPE"
        to_normal = raw.message(normal, b"x", message_type=raw.pb.LITE)
        to_normal.system_properties.lite_topic = "ok"
        assert raw.code_name(raw.send(s, to_normal).status.code) == "MESSAGE_PROPERTY_CONFLICT_WITH_TYPE"


def test_subscription_quota_counts_every_broker(cluster: Cluster, unique: Callable[[str], str]) -> None:
    """A client's lite subscriptions are held to the proxy's quota (10,000) across the brokers of its
    bind topic: two PARTIAL_ADDs of 6,000 each cannot both succeed, however the names spread."""
    topic = create_lite_topic(cluster, unique("t"))
    group = cluster.create_group(unique("g"))
    client_id = f"e2e-quota-{unique('c')}"

    def add(names: list[str]) -> str:
        request = raw.spb.SyncLiteSubscriptionRequest(action=raw.pb.PARTIAL_ADD, topic=raw.resource(topic),
                                                      group=raw.resource(group), lite_topic_set=names)  # fmt: skip
        with raw.stub(cluster.first_proxy) as s:
            response = s.SyncLiteSubscription(request, metadata=raw.headers(client_id=client_id), timeout=WAIT_S)
        return raw.code_name(response.status.code)

    assert add([f"a{i}" for i in range(6_000)]) == "OK"
    assert add([f"b{i}" for i in range(6_000)]) == "LITE_SUBSCRIPTION_QUOTA_EXCEEDED"
    assert add(["a1", "a2"]) == "OK", "names the client holds already are no growth"


def test_expired_lite_topic_is_announced_to_its_subscriber(cluster: Cluster, unique: Callable[[str], str]) -> None:
    topic = create_lite_topic(cluster, unique("t"), "--lite-expiration", "2s")
    group = cluster.create_group(unique("g"))
    client_id = f"e2e-lite-{unique('c')}"
    settings = raw.pb.Settings(client_type=raw.pb.LITE_SIMPLE_CONSUMER, request_timeout=Duration(seconds=3))
    settings.subscription.group.name = group
    settings.subscription.subscriptions.add().topic.name = topic
    outbox: queue.Queue[raw.spb.TelemetryCommand | None] = queue.Queue()
    outbox.put(raw.spb.TelemetryCommand(settings=settings))

    def commands() -> Iterator[raw.spb.TelemetryCommand]:
        while (cmd := outbox.get()) is not None:
            yield cmd

    with raw.stub(cluster.first_proxy) as s:
        call = s.Telemetry(commands(), metadata=raw.headers(client_id=client_id), timeout=WAIT_S)
        replies = iter(call)
        first = next(replies)
        assert first.settings.subscription.lite_subscription_quota > 0
        assert first.settings.subscription.max_lite_topic_size == 64
        request = raw.spb.SyncLiteSubscriptionRequest(
            action=raw.pb.PARTIAL_ADD, topic=raw.resource(topic), group=raw.resource(group),
            lite_topic_set=["short-lived"],
        )  # fmt: skip
        response = s.SyncLiteSubscription(request, metadata=raw.headers(client_id=client_id), timeout=raw.RPC_TIMEOUT_S)
        assert raw.code_name(response.status.code) == "OK"
        try:
            notice = next(replies)  # expiry after 2 s, swept within 1 s, polled by the proxy within 1 s
        finally:
            outbox.put(None)
            call.cancel()
    assert notice.WhichOneof("command") == "notify_unsubscribe_lite_command"
    assert notice.notify_unsubscribe_lite_command.lite_topic == "short-lived"
    assert cluster.admin("lite", "list", topic)["lite_topics"] == 0


def test_lite_subscriptions_survive_a_restart(tmp_path: Path, unique: Callable[[str], str]) -> None:
    """Merged: the whole process restarts; the consumer's subscriptions are the broker's, so it keeps
    receiving without re-subscribing (its COMPLETE_ADD resync comes only every 30 s). Also: merged
    auto-create makes a topic of the type of its first message."""
    cluster = start_merged(tmp_path, auto_create=True)
    try:
        auto_lite, auto_priority = unique("auto-l"), unique("auto-p")
        with producer(cluster.endpoints, auto_lite, auto_priority) as p:
            p.send(lite_message(auto_lite, "first", b"creates a lite topic"))
            urgent = message(auto_priority, b"creates a priority topic")
            urgent.priority = 3
            p.send(urgent)
        assert cluster.admin("lite", "list", auto_lite)["lite_topics"] == 1
        assert {row["types"] for row in cluster.admin("topic", "describe", auto_priority)} == {"priority"}
        topic = create_lite_topic(cluster, unique("t"))
        group = cluster.create_group(unique("g"))
        consumer = lite_consumer(cluster, topic, group)
        try:
            consumer.subscribe_lite("session-9")
            cluster.restart(next(iter(cluster.processes)))
            deadline = time.monotonic() + RESTART_WAIT_S
            while True:
                try:
                    with producer(cluster.endpoints, topic) as p:
                        p.send(lite_message(topic, "session-9", b"after-restart"))
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.5)
            deadline = time.monotonic() + RESTART_WAIT_S
            got: list[Message] = []
            while not got:  # the consumer's channel reconnects on its own backoff: retry until it has
                try:
                    got = consumer.receive(16, 30)
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.5)
                assert time.monotonic() < deadline, "nothing received after the restart"
            assert [m.body for m in got] == [b"after-restart"]
        finally:
            consumer.shutdown()
    finally:
        assert not cluster.stop()
