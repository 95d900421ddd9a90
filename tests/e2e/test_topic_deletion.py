"""A topic deleted and created again while both protocols' producers and consumers run: no message of
the old topic reaches any reader afterwards, merged (`sluice up --shards 2`) and separated, with the
old messages tiered to S3 (moto) and evicted from local disk before the deletion.

The traffic: the official Python client's Producer sends `r-<n>` to the topic and a SimpleConsumer
of a group that started at the earliest message receives and acks throughout; pika publishes
`a-<n>` with confirms to an exchange mapped to the topic (`x-sluice-topic`, docs/amqp.md), and
another pika client consumes a queue bound to that exchange. A message is *old* when its send or
publish was acknowledged before `sluice admin topic delete` started, *new* when after the topic was
created again; the ones in between may be in either.

Readers afterwards: the consumer that stayed connected, a new group from the earliest message, a
browse of the topic (`sluice admin message range` and `message list` from offset 0), the same after
the new messages were tiered and evicted too, and a queue bound to the exchange after the topic came
back (what the exchange's bridge carries from the topic): none of them gets an old message, and the
new groups get every new one.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import pika
import pytest
from rocketmq import FilterExpression, Producer, SimpleConsumer

from tests.e2e.support.amqp import connect, endpoints, params
from tests.e2e.support.clients import configuration, message, receive_until, simple_consumer
from tests.e2e.support.cluster import Cluster, start_merged, start_separated
from tests.e2e.support.moto import Moto, tiering_flags

QUEUES = 4
PAUSE_S = 0.05  # between two sends of one producer
ERROR_PAUSE_S = 0.2
INVISIBLE_S = 30
TRAFFIC_S = 60.0  # bounds each wait for traffic
PER_PHASE = 15  # acknowledged sends of each protocol before the deletion, and after the topic is back
QUIET_S = 2.0  # a queue is drained once nothing came for this long


@pytest.fixture(scope="module", params=["merged", "separated"])
def deleting(request: pytest.FixtureRequest, moto: Moto, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A cluster tiering to the module's moto S3, serving AMQP; merged with two shards."""
    kind: str = request.param
    root = tmp_path_factory.mktemp(f"deleting-{kind}")
    flags = tiering_flags(moto, root, f"sluice-delete-{kind}-{uuid.uuid4().hex[:8]}", f"e2e-{kind}")
    started = (start_merged(root, extra_args=flags, shards=2, amqp=True) if kind == "merged"
               else start_separated(root, broker_args=flags, amqp=True))  # fmt: skip
    try:
        yield started
    finally:
        problems = started.stop()
        assert not problems, "cluster teardown:\n" + "\n".join(problems)


@dataclass
class Load:
    """The four clients, each in a thread of its own, recording what they were told and got."""

    cluster: Cluster
    topic: str
    group: str
    exchange: str
    queue: str
    acked: dict[str, float] = field(default_factory=dict)  # body -> when its send or publish was acknowledged
    started: dict[str, float] = field(default_factory=dict)  # body -> when its acknowledged send began
    received: list[tuple[float, str, str]] = field(default_factory=list)  # (when, "rocketmq" or "amqp", body)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._errors: list[BaseException] = []

    def __enter__(self) -> Load:
        config = configuration(self.cluster.endpoints)
        producer = Producer(config, (self.topic,))
        consumer = SimpleConsumer(config, self.group, {self.topic: FilterExpression()}, await_duration=1)
        producer.startup()
        consumer.startup()
        self._clients = (producer, consumer)
        amqp = endpoints(self.cluster)[0]
        for name, loop, arg in (("send", self._send, producer), ("receive", self._receive, consumer),
                                ("publish", self._publish, amqp), ("consume", self._consume, amqp)):  # fmt: skip
            thread = threading.Thread(target=self._run, args=(loop, arg), name=f"load-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(TRAFFIC_S)
        for client in self._clients:
            client.shutdown()
        assert not [t.name for t in self._threads if t.is_alive()], "a client loop did not stop"
        assert not self._errors, f"a client loop failed: {self._errors!r}"

    def _run(self, loop: Callable[[Any], None], arg: Any) -> None:
        try:
            loop(arg)
        except BaseException as exc:  # reported by __exit__
            self._errors.append(exc)

    def _ok(self, body: str, started: float) -> None:
        with self._lock:
            self.acked[body] = time.monotonic()
            self.started[body] = started

    def _got(self, who: str, body: bytes) -> None:
        with self._lock:
            self.received.append((time.monotonic(), who, body.decode()))

    def _send(self, producer: Producer) -> None:
        for n in itertools.count():
            if self._stop.wait(PAUSE_S):
                return
            started = time.monotonic()
            try:
                producer.send(message(self.topic, f"r-{n}".encode()))
            except Exception:  # the topic is away for a moment: the application retries later
                self._stop.wait(ERROR_PAUSE_S)
                continue
            self._ok(f"r-{n}", started)

    def _receive(self, consumer: SimpleConsumer) -> None:
        while not self._stop.is_set():
            try:
                batch = consumer.receive(16, INVISIBLE_S)
            except Exception:
                self._stop.wait(ERROR_PAUSE_S)
                continue
            for m in batch:
                self._got("rocketmq", m.body)
                try:
                    consumer.ack(m)
                except Exception:  # a message of the deleted topic: the broker refuses its ack
                    continue

    def _publish(self, endpoint: str) -> None:
        with connect(endpoint) as conn:
            ch = conn.channel()
            ch.confirm_delivery()
            for n in itertools.count():
                if self._stop.wait(PAUSE_S):
                    return
                started = time.monotonic()
                try:
                    ch.basic_publish(self.exchange, "order", f"a-{n}".encode())
                except pika.exceptions.NackError:  # the topic's copy was not stored: not confirmed
                    continue
                except pika.exceptions.ChannelClosedByBroker:
                    ch = conn.channel()
                    ch.confirm_delivery()
                    continue
                self._ok(f"a-{n}", started)

    def _consume(self, endpoint: str) -> None:
        with connect(endpoint) as conn:
            ch = conn.channel()
            for method, _, body in ch.consume(self.queue, inactivity_timeout=0.5):
                if self._stop.is_set():
                    break
                if method is not None:
                    self._got("amqp", body)
                    ch.basic_ack(method.delivery_tag)
            ch.cancel()

    # -- what happened ---------------------------------------------------------------------------

    def acked_between(self, start: float, end: float = float("inf")) -> set[str]:
        with self._lock:
            return {body for body, at in self.acked.items() if start <= at < end}

    def started_after(self, start: float) -> set[str]:
        """Acknowledged bodies whose send or publish began at `start` or later."""
        with self._lock:
            return {body for body, at in self.started.items() if at >= start}

    def received_by(self, who: str, since: float) -> set[str]:
        with self._lock:
            return {body for at, by, body in self.received if by == who and at >= since}

    def wait_for(self, what: str, since: float) -> None:
        """Until PER_PHASE sends of each protocol were acknowledged since `since`, and both consumers
        received something since then."""

        def done() -> bool:
            acked = self.acked_between(since)
            sent = all(sum(b.startswith(kind) for b in acked) >= PER_PHASE for kind in ("r-", "a-"))
            return sent and all(self.received_by(who, since) for who in ("rocketmq", "amqp"))

        deadline = time.monotonic() + TRAFFIC_S
        while not done():
            assert not self._errors, f"a client loop failed: {self._errors!r}"
            assert time.monotonic() < deadline, f"{what}: not within {TRAFFIC_S} s"
            time.sleep(0.1)


def declare(cluster: Cluster, exchange: str, topic: str, queue: str) -> None:
    """The exchange mapped to the topic and a durable queue bound to it (every routing key)."""
    with connect(endpoints(cluster)[0]) as conn:
        ch = conn.channel()
        ch.exchange_declare(exchange, "fanout", durable=True, arguments={"x-sluice-topic": topic})
        ch.queue_declare(queue, durable=True)
        ch.queue_bind(queue, exchange)


def drain(cluster: Cluster, queue: str) -> set[str]:
    """Bodies consumed (and acked) from an AMQP queue until nothing came for QUIET_S."""
    got: set[str] = set()
    conn = pika.BlockingConnection(params(endpoints(cluster)[-1]))
    try:
        ch = conn.channel()
        for method, _, body in ch.consume(queue, inactivity_timeout=QUIET_S):
            if method is None:
                break
            got.add(body.decode())
            ch.basic_ack(method.delivery_tag)
        ch.cancel()
    finally:
        conn.close()
    return got


def read_from_earliest(cluster: Cluster, topic: str, group: str, wanted: set[str]) -> set[str]:
    """Bodies a new group from the earliest message receives until it has `wanted` (all of them)."""
    with simple_consumer(cluster.endpoints, group, {topic: FilterExpression()}) as c:
        got = receive_until(c, lambda got: wanted <= {m.body.decode() for m in got}, timeout_s=TRAFFIC_S)
    return {m.body.decode() for m in got}


def browse(cluster: Cluster, topic: str) -> set[str]:
    """Bodies `sluice admin message range` (every queue, by time) and `message list` (queue 0 from
    offset 0, every broker holding it) show."""
    ranged = cluster.admin("message", "range", topic, "--from", "0", "--limit", "1000")
    listed = cluster.admin("message", "list", topic, "--queue", "0", "--from-offset", "0", "--count", "1000")
    return {m["body_text"] for m in [*ranged, *listed]}


def test_a_topic_deleted_and_created_again_under_traffic_serves_no_old_message(
    deleting: Cluster, unique: Callable[[str], str]
) -> None:
    c = deleting
    topic = c.create_topic(unique("orders"), queues=QUEUES)
    group = c.create_group(unique("stays"), consume_from="earliest")
    exchange, queue = unique("orders-x"), unique("orders-q")
    declare(c, exchange, topic, queue)
    with Load(c, topic, group, exchange, queue) as load:
        load.wait_for("traffic before the deletion", 0.0)
        c.admin("tier", "upload-now", topic)
        c.admin("tier", "evict-local", topic)  # the old messages are in S3 only
        deleting_at = time.monotonic()
        c.admin("topic", "delete", topic)
        deleted_at = time.monotonic()
        c.create_topic(topic, queues=QUEUES)
        created_at = time.monotonic()
        late_queue = unique("late-q")
        declare(c, exchange, topic, late_queue)
        bound_at = time.monotonic()
        load.wait_for("traffic after the topic was created again", bound_at)
    old, new = load.acked_between(0.0, deleting_at), load.acked_between(created_at)
    print(f"{len(old)} old and {len(new)} new messages acknowledged; "
          f"{len(load.acked_between(deleting_at, created_at))} in between")  # fmt: skip

    stayed = load.received_by("rocketmq", deleted_at)
    assert not stayed & old, f"the consumer that stayed connected got old messages: {sorted(stayed & old)[:10]}"
    fresh = read_from_earliest(c, topic, c.create_group(unique("fresh"), consume_from="earliest"), new)
    assert not fresh & old, f"a new group got old messages: {sorted(fresh & old)[:10]}"
    browsed = browse(c, topic)
    assert not browsed & old, f"a browse of the topic shows old messages: {sorted(browsed & old)[:10]}"
    late = drain(c, late_queue)
    assert not late & old, f"the exchange carried old messages of the topic: {sorted(late & old)[:10]}"
    # A publish confirmed after the bind but made before it was routed before the queue was bound.
    assert {b for b in load.started_after(bound_at) if b.startswith("a-")} <= late, "publishes after the bind"

    # The new messages tiered and evicted too: every reader now reads S3, and still nothing old.
    c.admin("tier", "upload-now", topic)
    c.admin("tier", "evict-local", topic)
    cold = read_from_earliest(c, topic, c.create_group(unique("cold"), consume_from="earliest"), new)
    assert not cold & old, f"a new group reading from S3 got old messages: {sorted(cold & old)[:10]}"
    browsed = browse(c, topic)
    assert not browsed & old and new <= browsed, "a browse of the tiered topic"
