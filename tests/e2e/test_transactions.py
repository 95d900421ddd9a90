"""Transactional messages with the official Python client, merged and separated (docs/transactions.md).

Each topology runs with short transaction timings (first check-back 2 s after the half message,
then every 3 s; proxies poll every 0.3 s), from a config file given with `--config`. These
clusters are this module's own: the restart test kills and restarts their processes.

Waits are bounded conditions; "nothing else arrives" is checked by receiving for a quiet period
after the expected messages, which can only miss a duplicate, never invent one.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import pytest
from rocketmq import FilterExpression, Message, Producer, SimpleConsumer, TransactionChecker, TransactionResolution

from tests.e2e.support.clients import configuration, message, simple_consumer
from tests.e2e.support.cluster import AdminError, Cluster, start_merged, start_separated

CONFIG = """
[broker.transaction]
default_recovery_ms = 2000
check_interval_ms = 3000
max_checks = 40

[proxy.transaction]
poll_interval_ms = 300
"""
RESOLVE_TIMEOUT_S = 60.0
QUIET_S = 4.0
TRANSACTION_TYPE = 4
UNSPECIFIED = TransactionResolution.TRANSACTION_RESOLUTION_UNSPECIFIED
Answer = Callable[[Message], int]


class RecordingChecker(TransactionChecker):
    """Answers check-backs with `answer(message)` and remembers every message it was asked about."""

    def __init__(self, answer: Answer) -> None:
        self._answer = answer
        self._lock = threading.Lock()
        self.asked: list[Message] = []

    def check(self, message: Message) -> int:  # type: ignore[override]
        with self._lock:
            self.asked.append(message)
        return self._answer(message)

    def asked_ids(self) -> set[str]:
        with self._lock:
            return {m.message_id for m in self.asked}


def by_body(answers: dict[bytes, int]) -> Answer:
    return lambda m: answers.get(m.body, UNSPECIFIED)


@pytest.fixture(scope="module", params=["merged", "separated"])
def txn_cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    kind: str = request.param
    root = tmp_path_factory.mktemp(f"txn-{kind}")
    config = root / "sluice.toml"
    config.write_text(CONFIG)
    started = start_merged(root, extra_args=["--config", str(config)]) if kind == "merged" else (
        start_separated(root, config=config))  # fmt: skip
    try:
        yield started
    finally:
        problems = started.stop()
        assert not problems, "cluster teardown:\n" + "\n".join(problems)


@contextmanager
def tx_producer(cluster: Cluster, topic: str, checker: TransactionChecker, namespace: str = "") -> Iterator[Producer]:
    client = Producer(configuration(cluster.endpoints, namespace), (topic,), checker)
    client.startup()
    try:
        yield client
    finally:
        client.shutdown()


def send_half(client: Producer, topic: str, body: bytes) -> tuple[object, str]:
    """Send a half message; (its transaction, its message id)."""
    tx = client.begin_transaction()
    receipt = client.send(message(topic, body), tx)
    assert receipt.transaction_id, "a TRANSACTION send must return a transaction id"
    return tx, receipt.message_id


# A producer in its own process: sends one half message, prints its message id, then waits to be killed.
DOOMED_PRODUCER = """
import sys, time
from rocketmq import ClientConfiguration, Credentials, Message, Producer, TransactionChecker, TransactionResolution
class Undecided(TransactionChecker):
    def check(self, message):
        return TransactionResolution.TRANSACTION_RESOLUTION_UNSPECIFIED
endpoints, topic, body = sys.argv[1:4]
producer = Producer(ClientConfiguration(endpoints, Credentials(), request_timeout=3), (topic,), Undecided())
producer.startup()
msg = Message()
msg.topic, msg.body = topic, body.encode()
print(producer.send(msg, producer.begin_transaction()).message_id, flush=True)
time.sleep(600)
"""


def send_half_and_die(cluster: Cluster, topic: str, body: bytes) -> str:
    """A producer process sends a half message and is SIGKILLed before ending it; its message id."""
    child = subprocess.Popen([sys.executable, "-c", DOOMED_PRODUCER, cluster.endpoints, topic, body.decode()],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)  # fmt: skip
    try:
        assert child.stdout is not None
        message_id = child.stdout.readline().strip()  # bounded: the client's send times out
        assert message_id, f"the producer process exited {child.poll()} without sending"
        return message_id
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)


def setup(cluster: Cluster, unique: Callable[[str], str]) -> tuple[str, str]:
    topic = cluster.create_topic(unique("tx"), "transaction")
    return topic, cluster.create_group(unique("g"))


def receive_bodies(consumer: SimpleConsumer, want: set[bytes], timeout_s: float = RESOLVE_TIMEOUT_S) -> list[Message]:
    """Receive (and ack) until every body in `want` arrived, then for QUIET_S more; all messages received."""
    got: list[Message] = []
    deadline = time.monotonic() + timeout_s
    while not want <= {m.body for m in got}:
        if time.monotonic() >= deadline:
            raise AssertionError(f"not all of {sorted(want)} arrived within {timeout_s} s; got {bodies(got)}")
        got += receive_some(consumer)
    quiet_until = time.monotonic() + QUIET_S
    while time.monotonic() < quiet_until:
        got += receive_some(consumer)
    return got


def receive_some(consumer: SimpleConsumer) -> list[Message]:
    batch = consumer.receive(16, 60)
    for m in batch:
        consumer.ack(m)
    return list(batch)


def bodies(messages: Sequence[Message]) -> list[bytes]:
    return sorted(m.body for m in messages)


def half_backlog(cluster: Cluster, topic: str) -> int:
    rows = cluster.admin("topic", "describe", topic)
    return sum({r["broker"]: r["half_messages"] for r in rows}.values())  # one value per broker, on every row


def wait_backlog(cluster: Cluster, topic: str, expected: int, timeout_s: float = RESOLVE_TIMEOUT_S) -> None:
    """Until the topic's half-message backlog is `expected` (admin errors, e.g. a broker that has not
    registered again after a restart yet, count as "not yet")."""
    deadline = time.monotonic() + timeout_s
    n: int | str = "unknown"
    while True:
        try:
            n = half_backlog(cluster, topic)
        except AdminError as exc:
            n = f"unknown ({exc})"
        if n == expected:
            return
        if time.monotonic() >= deadline:
            raise AssertionError(f"topic {topic} has {n} half messages, expected {expected}")
        time.sleep(0.5)


def retry(call: Callable[[], object], timeout_s: float = 30.0) -> None:
    """Call until it succeeds: right after a restart the client's channel may still be reconnecting."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            call()
            return
        except Exception:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.5)


# -- tests ------------------------------------------------------------------------------------------


def test_commit_delivers_once_and_rollback_discards(txn_cluster: Cluster, unique: Callable[[str], str]) -> None:
    topic, group = setup(txn_cluster, unique)
    checker = RecordingChecker(lambda m: UNSPECIFIED)
    with (
        tx_producer(txn_cluster, topic, checker) as producer,
        simple_consumer(txn_cluster.endpoints, group, {topic: FilterExpression()}) as consumer,
    ):
        commit_tx, commit_id = send_half(producer, topic, b"commit-me")
        rollback_tx, _ = send_half(producer, topic, b"roll-me-back")
        assert half_backlog(txn_cluster, topic) == 2
        assert receive_some(consumer) == [], "a half message must be invisible before its commit"
        commit_tx.commit()  # type: ignore[attr-defined]
        rollback_tx.rollback()  # type: ignore[attr-defined]
        commit_tx.commit()  # type: ignore[attr-defined]  # a repeated commit is accepted (idempotent)
        got = receive_bodies(consumer, {b"commit-me"})
    assert bodies(got) == [b"commit-me"], "committed exactly once, rolled back never delivered"
    assert got[0].message_id == commit_id
    assert got[0].message_type == TRANSACTION_TYPE
    assert half_backlog(txn_cluster, topic) == 0


def test_orphans_are_resolved_by_the_checker(txn_cluster: Cluster, unique: Callable[[str], str]) -> None:
    topic, group = setup(txn_cluster, unique)
    checker = RecordingChecker(by_body({b"orphan-commit": TransactionResolution.COMMIT,
                                        b"orphan-rollback": TransactionResolution.ROLLBACK}))  # fmt: skip
    with (
        tx_producer(txn_cluster, topic, checker) as producer,
        simple_consumer(txn_cluster.endpoints, group, {topic: FilterExpression()}) as consumer,
    ):
        _, commit_id = send_half(producer, topic, b"orphan-commit")
        _, rollback_id = send_half(producer, topic, b"orphan-rollback")
        got = receive_bodies(consumer, {b"orphan-commit"})
        wait_backlog(txn_cluster, topic, 0)
    assert bodies(got) == [b"orphan-commit"]
    assert {commit_id, rollback_id} <= checker.asked_ids()
    asked = next(m for m in checker.asked if m.message_id == commit_id)
    assert (asked.topic, asked.body, asked.message_type) == (topic, b"orphan-commit", TRANSACTION_TYPE)


def test_a_new_producer_answers_for_a_dead_one(txn_cluster: Cluster, unique: Callable[[str], str]) -> None:
    topic, group = setup(txn_cluster, unique)
    orphan_id = send_half_and_die(txn_cluster, topic, b"left-behind")
    # The first producer was SIGKILLed without ending its transaction; a new one of the topic answers.
    second = RecordingChecker(lambda m: TransactionResolution.COMMIT if m.message_id == orphan_id else UNSPECIFIED)
    with (
        tx_producer(txn_cluster, topic, second),
        simple_consumer(txn_cluster.endpoints, group, {topic: FilterExpression()}) as consumer,
    ):
        got = receive_bodies(consumer, {b"left-behind"})
    assert bodies(got) == [b"left-behind"]
    assert orphan_id in second.asked_ids()


def test_pending_transactions_survive_broker_and_proxy_restarts(
    txn_cluster: Cluster, unique: Callable[[str], str]
) -> None:
    topic, group = setup(txn_cluster, unique)
    first = RecordingChecker(lambda m: UNSPECIFIED)
    with tx_producer(txn_cluster, topic, first) as producer:
        commit_tx, _ = send_half(producer, topic, b"committed-after-restart")
        _, orphan_id = send_half(producer, topic, b"checked-after-restart")
        for name in [n for n in txn_cluster.processes if n != "nameserver"]:
            txn_cluster.restart(name)  # brokers first (start order), then proxies; merged: the one process
        wait_backlog(txn_cluster, topic, 2)  # the pending half messages survived the restarts
        retry(commit_tx.commit)  # type: ignore[attr-defined]
    second = RecordingChecker(lambda m: TransactionResolution.COMMIT if m.message_id == orphan_id else UNSPECIFIED)
    with (
        tx_producer(txn_cluster, topic, second),
        simple_consumer(txn_cluster.endpoints, group, {topic: FilterExpression()}) as consumer,
    ):
        got = receive_bodies(consumer, {b"committed-after-restart", b"checked-after-restart"})
    assert bodies(got) == [b"checked-after-restart", b"committed-after-restart"], "each exactly once"
    assert half_backlog(txn_cluster, topic) == 0


def test_end_transaction_bad_input(txn_cluster: Cluster, unique: Callable[[str], str]) -> None:
    topic, _ = setup(txn_cluster, unique)
    with tx_producer(txn_cluster, topic, RecordingChecker(lambda m: UNSPECIFIED)) as producer:
        tx, _ = send_half(producer, topic, b"x")
        tx.rollback()  # type: ignore[attr-defined]
        with pytest.raises(Exception, match="not pending"):
            tx.commit()  # type: ignore[attr-defined]  # committing a rolled-back transaction is refused


def test_check_backs_and_commits_in_a_namespace(txn_cluster: Cluster, unique: Callable[[str], str]) -> None:
    ns, topic, group = f"ns{uuid.uuid4().hex[:6]}", unique("tx"), unique("g")
    txn_cluster.create_topic(f"{ns}%{topic}", "transaction")
    txn_cluster.create_group(f"{ns}%{group}")
    checker = RecordingChecker(by_body({b"ns-orphan": TransactionResolution.COMMIT}))
    with (
        tx_producer(txn_cluster, topic, checker, namespace=ns) as producer,
        simple_consumer(txn_cluster.endpoints, group, {topic: FilterExpression()}, namespace=ns) as consumer,
    ):
        tx, _ = send_half(producer, topic, b"ns-commit")
        tx.commit()  # type: ignore[attr-defined]
        _, orphan_id = send_half(producer, topic, b"ns-orphan")
        got = receive_bodies(consumer, {b"ns-commit", b"ns-orphan"})
    assert bodies(got) == [b"ns-commit", b"ns-orphan"]
    asked = next(m for m in checker.asked if m.message_id == orphan_id)
    assert (asked.topic, asked.namespace) == (topic, ns), "the check-back names the topic as the client knows it"
