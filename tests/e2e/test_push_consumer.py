"""PushConsumer: every message consumed once; a failing listener gets retries with backoff, then the
message lands in `%DLQ%<group>`; a FIFO push consumer keeps each message group in order. Merged
and separated topologies."""

from __future__ import annotations

import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable

from rocketmq import ConsumeResult, FilterExpression, Message, MessageListener

from tests.e2e.support import raw
from tests.e2e.support.clients import message, producer, push_consumer, receive_count, send_all, simple_consumer
from tests.e2e.support.cluster import Cluster

WAIT_S = 60.0


class Recorder(MessageListener):
    """Records every call; `fail(message)` decides whether a call reports FAILURE."""

    def __init__(self, fail: Callable[[Message], bool] = lambda m: False) -> None:
        self._fail = fail
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self.calls: list[tuple[str, int, bytes, str | None, bool]] = []  # id, attempt, body, group, failed

    def consume(self, message: Message) -> ConsumeResult:
        failed = self._fail(message)
        with self._changed:
            self.calls.append((message.message_id, message.delivery_attempt, message.body, message.message_group,
                               failed))  # fmt: skip
            self._changed.notify_all()
        return ConsumeResult.FAILURE if failed else ConsumeResult.SUCCESS

    def succeeded(self) -> list[str]:
        with self._lock:
            return [c[0] for c in self.calls if not c[4]]

    def wait_for(self, done: Callable[[list[tuple[str, int, bytes, str | None, bool]]], bool],
                 timeout_s: float = WAIT_S) -> None:  # fmt: skip
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while not done(self.calls):
                remaining = deadline - time.monotonic()
                assert remaining > 0, f"listener calls after {timeout_s} s: {self.calls}"
                self._changed.wait(remaining)


def test_every_message_is_consumed_once(cluster: Cluster, unique: Callable[[str], str]) -> None:
    topic = cluster.create_topic(unique("t"))
    group = cluster.create_group(unique("g"))
    listener = Recorder()
    with producer(cluster.endpoints, topic) as p, push_consumer(cluster.endpoints, group, listener,
                                                                {topic: FilterExpression()}):  # fmt: skip
        ids = send_all(p, [message(topic, f"push-{i}".encode(), tag="T") for i in range(30)])
        listener.wait_for(lambda calls: {c[0] for c in calls} >= set(ids))
        time.sleep(1.0)  # room for a duplicate to show up, if there were one
    counts = Counter(listener.succeeded())
    assert set(counts) == set(ids)
    assert [i for i, n in counts.items() if n != 1] == []
    raw.assert_drained(cluster.first_proxy, cluster.brokers, topic, group)


def test_failing_listener_is_retried_with_backoff_then_dead_lettered(
    cluster: Cluster, unique: Callable[[str], str]
) -> None:
    topic = cluster.create_topic(unique("t"))
    group = cluster.create_group(unique("g"), max_attempts=3, retry_policy="customized:1000,1000")
    dlq_reader = cluster.create_group(unique("dlq"), consume_from="earliest")
    listener = Recorder(fail=lambda m: m.body == b"poison")
    with producer(cluster.endpoints, topic) as p, push_consumer(cluster.endpoints, group, listener,
                                                                {topic: FilterExpression()}):  # fmt: skip
        good_id, poison_id = send_all(p, [message(topic, b"good"), message(topic, b"poison", keys=["poison-key"])])
        # Non-FIFO consumers never dead-letter themselves: the server does, after the last attempt.
        dead = read_dead_letters(cluster, group, dlq_reader, 1)
        assert listener.succeeded() == [good_id]
    # Each failure was a nack with the group's backoff; the third delivery was the last one.
    assert [(c[1], c[4]) for c in listener.calls if c[0] == poison_id] == [(1, True), (2, True), (3, True)]
    assert [(m.message_id, m.body, m.keys) for m in dead] == [(poison_id, b"poison", {"poison-key"})]
    raw.assert_drained(cluster.first_proxy, cluster.brokers, topic, group)


def test_fifo_message_that_keeps_failing_is_dead_lettered_and_its_group_moves_on(
    cluster: Cluster, unique: Callable[[str], str]
) -> None:
    topic = cluster.create_topic(unique("t"), "fifo")
    group = cluster.create_group(unique("g"), fifo=True, max_attempts=2, retry_policy="customized:1000")
    dlq_reader = cluster.create_group(unique("dlq"), consume_from="earliest")
    listener = Recorder(fail=lambda m: m.body == b"a:1")
    order = [("a", 0), ("a", 1), ("a", 2), ("b", 0), ("b", 1)]
    with producer(cluster.endpoints, topic) as p, push_consumer(cluster.endpoints, group, listener,
                                                                {topic: FilterExpression()}):  # fmt: skip
        ids = dict(zip(order, send_all(p, [message(topic, f"{g}:{n}".encode(), group=g) for g, n in order]),
                       strict=True))  # fmt: skip
        # A FIFO consumer retries locally, then forwards the message to the dead-letter queue itself.
        dead = read_dead_letters(cluster, group, dlq_reader, 1)
        listener.wait_for(lambda calls: {ids[("a", 2)], ids[("b", 1)]} <= {c[0] for c in calls if not c[4]})
    calls_a = [(c[0], c[4]) for c in listener.calls if c[3] == "a"]
    assert calls_a == [(ids[("a", 0)], False), (ids[("a", 1)], True), (ids[("a", 1)], True), (ids[("a", 2)], False)]
    assert [c[0] for c in listener.calls if c[3] == "b"] == [ids[("b", 0)], ids[("b", 1)]]
    assert [(m.message_id, m.message_group) for m in dead] == [(ids[("a", 1)], "a")]
    raw.assert_drained(cluster.first_proxy, cluster.brokers, topic, group)


def read_dead_letters(cluster: Cluster, group: str, reader_group: str, count: int) -> list[Message]:
    """Wait for the group's dead-letter topic to exist, then receive `count` messages from it."""
    dlq = f"%DLQ%{group}"
    deadline = time.monotonic() + WAIT_S
    while dlq not in {row["topic"] for row in cluster.admin("topic", "list")}:
        assert time.monotonic() < deadline, f"{dlq} did not appear within {WAIT_S} s"
        time.sleep(0.5)
    with simple_consumer(cluster.endpoints, reader_group, {dlq: FilterExpression()}) as c:
        return receive_count(c, count)


def test_fifo_push_consumer_keeps_each_message_group_in_order(cluster: Cluster, unique: Callable[[str], str]) -> None:
    topic = cluster.create_topic(unique("t"), "fifo")
    group = cluster.create_group(unique("g"), fifo=True, retry_policy="customized:1000")
    groups, per_group = ("red", "green", "blue", "white"), 6
    order = [(g, n) for n in range(per_group) for g in groups]
    failed_once: set[str] = set()
    lock = threading.Lock()

    def fail_first_try_of_the_third(m: Message) -> bool:
        with lock:  # message 2 of every group fails once: its successors must wait for the retry
            if m.body.endswith(b":2") and m.message_id not in failed_once:
                failed_once.add(m.message_id)
                return True
        return False

    listener = Recorder(fail=fail_first_try_of_the_third)
    with producer(cluster.endpoints, topic) as p, push_consumer(cluster.endpoints, group, listener,
                                                                {topic: FilterExpression()}):  # fmt: skip
        ids = send_all(p, [message(topic, f"{g}:{n}".encode(), group=g) for g, n in order])
        listener.wait_for(lambda calls: set(ids) <= {c[0] for c in calls if not c[4]})
    expected: dict[str, list[str]] = defaultdict(list)
    for message_id, (g, _) in zip(ids, order, strict=True):
        expected[g].append(message_id)
    seen: dict[str, list[tuple[str, bool]]] = defaultdict(list)
    for message_id, _, _, g, failed in listener.calls:
        assert g is not None
        seen[g].append((message_id, failed))
    for g in groups:
        # Exactly the group's messages, in send order; the failed one retried before its successors.
        want = [(i, False) for i in expected[g]]
        want.insert(2, (expected[g][2], True))
        assert seen[g] == want, g
    raw.assert_drained(cluster.first_proxy, cluster.brokers, topic, group)
