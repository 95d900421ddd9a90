"""A replicated broker group under the official client: SIGKILL the primary under load, in a bounded
loop, and check the history: every send the client saw acknowledged is consumable afterwards
(with --min-insync 2), duplicates are reported, per-message-group order holds. And consumer state:
SIGKILL the primary right after acks, offset commits and a DELAY send were answered OK; the new
primary redelivers no acked message, redelivers the popped-but-unacked ones after their
invisibility, keeps the committed offsets and fires the pending timer once; a half message left
undecided is checked back by the new primary, one rolled back before the kill stays discarded.

Topology: etcd (started here), a NameServer, one group of three `sluice broker --group g1` members,
one proxy, shared by the module's tests. The killed member is started again at once (same port and
data) and rejoins as a replica; each test starts once the group is whole again (every member in sync).
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator

import pytest
from rocketmq import FilterExpression, Producer, SimpleConsumer, TransactionChecker, TransactionResolution
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as spb
from rocketmq.v5.model import Message

from tests.e2e.support import raw
from tests.e2e.support.clients import configuration as client_configuration
from tests.e2e.support.clients import message, producer, receive_until, simple_consumer
from tests.e2e.support.cluster import AdminError, Cluster
from tests.e2e.support.history import History
from tests.e2e.support.replicated import (
    GROUP,
    INVISIBLE_S,
    MEMBERS,
    consume,
    fail_over,
    group_listing,
    new_primary,
    primary,
    restart,
    retrying,
    routed_primary,
    run_through_failovers,
    start_replicated,
    wait,
)
from tests.helpers.etcd import EtcdProcess, start_etcd

KILLS = 3
SEED = 18


@pytest.fixture(scope="module")
def _group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, EtcdProcess]]:
    """One group for the module: each test leaves it whole (every victim started again)."""
    root = tmp_path_factory.mktemp("replicated")
    etcd = start_etcd(root)
    try:
        cluster = start_replicated(root, etcd.url)
    except BaseException:
        etcd.stop()
        raise
    try:
        yield cluster, etcd
    finally:
        problems = cluster.stop()
        etcd.stop()
    assert not problems, "\n".join(problems)


@pytest.fixture
def replicated(_group: tuple[Cluster, EtcdProcess]) -> tuple[Cluster, EtcdProcess]:
    """The module's group once it is healthy again after the test before: every member is in sync
    (a restarted victim may still be catching up) and the NameServer routes it to the primary."""
    cluster, etcd = _group

    def listed() -> list[dict[str, object]] | AdminError:
        try:
            return group_listing(cluster, etcd.url)
        except AdminError as exc:  # nothing registered with the NameServer for a moment (a primary just left)
            return exc

    def whole() -> bool:
        rows = listed()
        if isinstance(rows, AdminError) or sum(bool(r["in_sync"]) for r in rows) != len(MEMBERS):
            return False
        # Routed to the member etcd names primary (a failover the load caused may not be routed yet).
        return [str(r["name"]) for r in rows if r["role"] == "primary"] == [routed_primary(cluster)]

    wait("the group whole again", whole, explain=listed)
    return _group


def test_sigkill_the_primary_under_load_loses_nothing_acknowledged(
    replicated: tuple[Cluster, EtcdProcess], unique: Callable[[str], str]
) -> None:
    cluster, etcd = replicated
    topic = cluster.create_topic(unique("t"), message_type="fifo", queues=4)
    group = unique("g")
    cluster.admin("group", "create", group, "--fifo")
    rng = random.Random(SEED)
    acked: list[tuple[str, str, int]] = []  # (body, message group, sequence in its group)
    failures: Counter[str] = Counter()
    stop = threading.Event()

    def produce() -> None:
        with producer(cluster.endpoints, topic) as client:
            seq: Counter[str] = Counter()
            while not stop.is_set():
                key = f"k{rng.randrange(4)}"
                body = f"{key}:{seq[key]}"
                try:
                    client.send(message(topic, body.encode(), group=key))
                except Exception as exc:  # retriable refusals during a failover
                    failures[type(exc).__name__] += 1
                    time.sleep(0.05)
                    continue  # the same sequence number is tried again: a group's order stays defined
                acked.append((body, key, seq[key]))
                seq[key] += 1

    worker = threading.Thread(target=produce, name="producer")
    worker.start()
    failovers: list[float] = []
    try:
        for _ in range(KILLS):
            time.sleep(rng.uniform(1.0, 3.0))
            victim = primary(cluster)
            before = len(acked)
            killed_at = time.monotonic()
            cluster.kill(victim)
            wait("sends to succeed again", lambda before=before: len(acked) > before + 5)  # type: ignore[misc]
            failovers.append(time.monotonic() - killed_at)
            restart(cluster, victim)
            wait("a new primary", lambda victim=victim: new_primary(cluster, victim))  # type: ignore[misc]
    finally:
        stop.set()
        worker.join(60)
    assert acked, "nothing was acknowledged"
    # The history: every acknowledged send is consumable, in order within its message group.
    wanted = {body for body, _, _ in acked}
    seen: Counter[str] = Counter()
    with simple_consumer(cluster.endpoints, group, {topic: FilterExpression()}) as consumer:
        got = receive_until(consumer, lambda msgs: wanted <= {m.body.decode() for m in msgs},
                            timeout_s=90, retry_unavailable=True)  # fmt: skip
    order: dict[str, list[int]] = {}
    for m in got:
        body = m.body.decode()
        seen[body] += 1
        key, n = body.split(":")
        order.setdefault(key, []).append(int(n))
    lost = wanted - set(seen)
    duplicates = sum(c - 1 for c in seen.values() if c > 1)
    print(f"acknowledged {len(acked)}, refused {dict(failures)}, duplicates {duplicates}, "
          f"sends succeeded again after each SIGKILL (s): {[round(f, 2) for f in failovers]}")  # fmt: skip
    assert not lost, f"{len(lost)} acknowledged messages lost: {sorted(lost)[:10]}"
    # The proxy waits for the group's new primary within each call's deadline: the client's own
    # retries cover a failover, and at most 1% of sends fail after them (before: 80 of ~2,600).
    assert sum(failures.values()) <= max(1, len(acked) // 100), f"sends failed after the client's retries: {failures}"
    for key, numbers in order.items():
        firsts = list(dict.fromkeys(numbers))  # first deliveries, in order
        assert firsts == sorted(firsts), f"message group {key} out of order: {firsts[:40]}"

    # Every member listed with its role, epoch and lag; the restarted one back in sync.
    def listing() -> list[dict[str, object]]:
        return group_listing(cluster, etcd.url)

    wait("every member in sync", lambda: sum(bool(r["in_sync"]) for r in listing()) == len(MEMBERS))
    rows = listing()
    assert sorted(r["name"] for r in rows) == sorted(MEMBERS)
    assert [r["role"] for r in rows].count("primary") == 1
    (epoch,) = {r["epoch"] for r in rows}  # every member agrees on it
    assert epoch >= KILLS + 1  # one term per kill, plus any a loaded machine's stalled lease refresh caused
    assert all(isinstance(r["lag_bytes"], int) for r in rows)


# -- consumer state across failovers -----------------------------------------------------------------

STATE_ROUNDS = 2  # SIGKILLs of the primary, each right after acks and offset commits were answered OK
PER_ROUND = 40
DELAY_AFTER_KILL_S = 8
QUEUES = 4


def _commit_offset(proxy: str, group: str, topic: str, queue: int, offset: int) -> None:
    queue_pb = pb.MessageQueue(topic=raw.resource(topic), id=queue, broker=pb.Broker(name=GROUP))
    with raw.stub(proxy) as s:
        request = spb.UpdateOffsetRequest(group=raw.resource(group), message_queue=queue_pb, offset=offset)
        reply = s.UpdateOffset(request, metadata=raw.headers(), timeout=raw.RPC_TIMEOUT_S)
    assert reply.status.code == pb.OK, raw.code_name(reply.status.code)


def _committed_offset(proxy: str, group: str, topic: str, queue: int) -> int:
    queue_pb = pb.MessageQueue(topic=raw.resource(topic), id=queue, broker=pb.Broker(name=GROUP))
    with raw.stub(proxy) as s:
        reply = s.GetOffset(spb.GetOffsetRequest(group=raw.resource(group), message_queue=queue_pb),
                            metadata=raw.headers(), timeout=raw.RPC_TIMEOUT_S)  # fmt: skip
    assert reply.status.code == pb.OK, raw.code_name(reply.status.code)
    return int(reply.offset)


def _receive_until_quiet(consumer: SimpleConsumer, timeout_s: float = 60.0) -> list[str]:
    """Bodies received (each acked) until nothing more came for two invisible durations after the
    first message, or `timeout_s` passed; receive errors while the group fails over are retried."""
    got: list[str] = []
    deadline = time.monotonic() + timeout_s
    quiet_until: float | None = None
    while time.monotonic() < deadline and (quiet_until is None or time.monotonic() < quiet_until):
        try:
            batch = consumer.receive(16, INVISIBLE_S)
        except Exception:
            time.sleep(0.3)
            continue
        for msg in batch:
            got.append(msg.body.decode())
            retrying("an ack", lambda msg=msg: consumer.ack(msg))  # type: ignore[misc]
            quiet_until = quiet_until or time.monotonic() + 2 * INVISIBLE_S
    return got


def test_acks_offsets_and_timers_survive_sigkill_of_the_primary(
    replicated: tuple[Cluster, EtcdProcess], unique: Callable[[str], str]
) -> None:
    cluster, _ = replicated
    topic = cluster.create_topic(unique("t"), queues=QUEUES)
    delay_topic = cluster.create_topic(unique("d"), message_type="delay", queues=1)
    group = cluster.create_group(unique("g"))
    delay_group = cluster.create_group(unique("dg"), consume_from="earliest")
    offsets_group = unique("pull")
    proxy = cluster.proxies[0]
    history = History()
    held: list[Message] = []
    committed: dict[int, int] = {}
    delayed_body = "delayed-once"
    with producer(cluster.endpoints, topic, delay_topic) as client, \
            simple_consumer(cluster.endpoints, group, {topic: FilterExpression()}) as consumer:  # fmt: skip
        for round_no in range(STATE_ROUNDS):
            bodies = [f"r{round_no}-{i}" for i in range(PER_ROUND)]
            for body in bodies:
                retrying("a send", lambda body=body: client.send(message(topic, body.encode())))  # type: ignore[misc]
                history.sent(body)
            if round_no == 0:  # a timer pending across the failover: due after the kill
                delayed = message(delay_topic, delayed_body.encode())
                delayed.delivery_timestamp = int(time.time()) + DELAY_AFTER_KILL_S
                _send_delayed(client, delayed)
            wanted = set(bodies)
            consume(consumer, history, held, lambda wanted=wanted: wanted <= set(history.deliveries), hold=True)  # type: ignore[misc]
            for q in range(QUEUES):
                committed[q] = 10 * round_no + q + 1
                retrying("an offset commit", lambda q=q: _commit_offset(proxy, offsets_group, topic, q, committed[q]))  # type: ignore[misc]
            fail_over(cluster)  # right after the acks and commits above were answered OK
        # Everything: the held messages come back after their invisibility; every one gets acked.
        everything = set(history.sends)
        consume(consumer, history, held, lambda: everything <= history.settled(), hold=False)
    verdict = history.verdict()
    print(f"history: {verdict.summary()}; held un-acked at the kills: {len(held)}")
    verdict.assert_nothing_lost()
    assert held and all(history.deliveries[m.body.decode()] >= 2 for m in held), "held messages did not come back"
    for q, offset in committed.items():
        got = retrying("an offset read", lambda q=q: _committed_offset(proxy, offsets_group, topic, q))  # type: ignore[misc]
        assert got == offset, f"queue {q}: committed offset {offset}, after the failovers {got}"
    # The timer fires once, on the primary that holds it after the failovers.
    with simple_consumer(cluster.endpoints, delay_group, {delay_topic: FilterExpression()}) as delays:
        fired = _receive_until_quiet(delays)
    assert fired == [delayed_body], f"the pending timer fired {fired}"


def _send_delayed(client: Producer, msg: Message) -> None:
    retrying("a delayed send", lambda: client.send(msg))


def test_planned_switchover_loses_nothing(
    replicated: tuple[Cluster, EtcdProcess], unique: Callable[[str], str]
) -> None:
    """`sluice admin broker switchover` under load: the chosen member becomes primary, every send
    acknowledged before, during and after is consumable, no acked message comes back. No send
    fails because it reached a member that is not the primary (draining, deposed): the proxy waits
    for the group's new primary and sends there within the call's deadline."""
    cluster, etcd = replicated
    topic = cluster.create_topic(unique("t"), queues=QUEUES)
    group = cluster.create_group(unique("g"))
    history = History()
    held: list[Message] = []
    stop = threading.Event()
    refused: Counter[str] = Counter()
    reasons: list[str] = []

    def produce(client: Producer) -> None:
        n = 0
        while not stop.is_set():
            body = f"s{n}"
            try:
                client.send(message(topic, body.encode()))
            except Exception as exc:  # retriable refusals while the group switches over
                refused[type(exc).__name__] += 1
                reasons.append(str(exc))
                time.sleep(0.05)
                continue
            history.sent(body)
            n += 1

    with producer(cluster.endpoints, topic) as client, \
            simple_consumer(cluster.endpoints, group, {topic: FilterExpression()}) as consumer:  # fmt: skip
        worker = threading.Thread(target=produce, args=(client,), name="producer")
        worker.start()
        try:
            wait("some sends", lambda: len(history.sends) >= 20)
            consume(consumer, history, held, lambda: len(history.acks) >= 10, hold=False)
            with pytest.raises(AdminError, match="not an in-sync replica"):  # refused, nothing changes
                cluster.admin("broker", "switchover", GROUP, "--to", "nobody", "--etcd", etcd.url)
            before = primary(cluster)
            target = next(m for m in MEMBERS if m != before)
            done = cluster.admin("broker", "switchover", GROUP, "--to", target, "--etcd", etcd.url, "--wait-s", "20")
            assert [{k: v for k, v in row.items() if k != "epoch"} for row in done] == [
                {"group": GROUP, "from": before, "to": target}
            ]
            assert done[0]["epoch"] >= 2  # a new term (2, unless the loaded machine caused a failover before)
            wait("routes to the new primary", lambda: new_primary(cluster, before) and primary(cluster) == target)
            sent_at_switch = len(history.sends)
            wait("sends after the switchover", lambda: len(history.sends) >= sent_at_switch + 20)
        finally:
            stop.set()
            worker.join(60)
        everything = set(history.sends)
        consume(consumer, history, held, lambda: everything <= history.settled(), hold=False)
    verdict = history.verdict()
    print(f"switchover history: {verdict.summary()}; refused sends {dict(refused)}")
    verdict.assert_nothing_lost()
    assert not [r for r in reasons if "primary" in r], f"the proxy handed the failover to the client: {reasons}"
    # The old primary rejoins as a replica and catches up: the whole group in sync again.
    rows = lambda: group_listing(cluster, etcd.url)  # noqa: E731
    wait("every member in sync", lambda: sum(bool(r["in_sync"]) for r in rows()) == len(MEMBERS))
    assert [r["name"] for r in rows() if r["role"] == "primary"] == [target]


class _CommitAfterFailover(TransactionChecker):
    """Leaves every check-back undecided until `decide` is set, then commits; remembers what it was asked."""

    def __init__(self) -> None:
        self.decide = threading.Event()
        self.asked: list[str] = []

    def check(self, message: Message) -> int:  # type: ignore[override]
        self.asked.append(message.body.decode())
        if self.decide.is_set():
            return int(TransactionResolution.COMMIT)
        return int(TransactionResolution.TRANSACTION_RESOLUTION_UNSPECIFIED)


def test_half_messages_are_checked_back_by_the_new_primary(
    replicated: tuple[Cluster, EtcdProcess], unique: Callable[[str], str]
) -> None:
    cluster, _ = replicated
    topic = cluster.create_topic(unique("tx"), message_type="transaction", queues=1)
    group = cluster.create_group(unique("g"), consume_from="earliest")
    checker = _CommitAfterFailover()
    client = Producer(client_configuration(cluster.endpoints), (topic,), checker)
    client.startup()
    try:
        undecided = client.begin_transaction()
        retrying("a half message", lambda: client.send(message(topic, b"undecided"), undecided))
        rolled_back = client.begin_transaction()
        retrying("a half message", lambda: client.send(message(topic, b"rolled-back"), rolled_back))
        rolled_back.rollback()
        fail_over(cluster)  # the undecided half message is in the new primary's half-message index
        checker.decide.set()
        with simple_consumer(cluster.endpoints, group, {topic: FilterExpression()}) as consumer:
            got = _receive_until_quiet(consumer)
    finally:
        client.shutdown()
    assert got == ["undecided"], f"after the failover the consumer got {got}"
    assert "undecided" in checker.asked and "rolled-back" not in checker.asked


RACING_KILLS = 2


def test_acks_racing_sigkills_are_never_undone(
    replicated: tuple[Cluster, EtcdProcess], unique: Callable[[str], str]
) -> None:
    """A producer and an acking consumer run while the primary is SIGKILLed at random moments: acks in
    flight at a kill may fail (their messages come back), but no ack answered OK is undone."""
    cluster, _ = replicated
    topic = cluster.create_topic(unique("t"), queues=QUEUES)
    group = cluster.create_group(unique("g"))
    history = History()
    count = itertools.count()

    def send_one(client: Producer) -> None:
        body = f"a{next(count)}"
        client.send(message(topic, body.encode()))
        history.sent(body)

    run_through_failovers(cluster, topic, group, history, send_one, kills=RACING_KILLS, rng=random.Random(SEED))
    verdict = history.verdict()
    print(f"racing history: {verdict.summary()}")
    verdict.assert_nothing_lost()


DELETED_OLD = 24  # messages of the topic before its deletion, half of them in flight when it goes
DELETED_NEW = 12


def test_a_deleted_topic_stays_deleted_through_a_failover(
    replicated: tuple[Cluster, EtcdProcess], unique: Callable[[str], str]
) -> None:
    """A topic deleted (with messages in flight and a DELAY message pending) and created again, then
    the primary SIGKILLed right after: the new primary serves nothing of the old topic (its in-flight
    messages never come back, their acks are refused as of a deleted topic, the timer never fires,
    a new group from the earliest message gets only the new ones) and loses nothing acknowledged
    since. The deletion is in the replicas' CommitLog and consumer state (docs/operations.md)."""
    cluster, _ = replicated
    topic = cluster.create_topic(unique("gone"), "normal,delay", QUEUES)
    group = cluster.create_group(unique("g"), consume_from="earliest")
    history = History()
    with producer(cluster.endpoints, topic) as client, \
            simple_consumer(cluster.endpoints, group, {topic: FilterExpression()}) as consumer:  # fmt: skip
        for i in range(DELETED_OLD):
            retrying("a send", lambda i=i: client.send(message(topic, f"old-{i}".encode())))  # type: ignore[misc]
        timer = message(topic, b"old-timer")
        timer.delivery_timestamp = int(time.time()) + DELAY_AFTER_KILL_S
        _send_delayed(client, timer)
        timer_due = time.monotonic() + DELAY_AFTER_KILL_S
        held = receive_until(consumer, lambda got: len(got) >= DELETED_OLD // 2, ack=False, invisible_s=INVISIBLE_S)
        held_until = time.monotonic() + INVISIBLE_S
        cluster.admin("topic", "delete", topic)
        cluster.create_topic(topic, "normal,delay", QUEUES)
        for i in range(DELETED_NEW):
            retrying("a send", lambda i=i: client.send(message(topic, f"new-{i}".encode())))  # type: ignore[misc]
            history.sent(f"new-{i}")
        fail_over(cluster)  # right after the deletion and the new sends were acknowledged
        watch_until = max(timer_due, held_until) + 2.0  # the timer's time and the held messages' invisibility pass
        everything = set(history.sends)
        consume(consumer, history, [], lambda: everything <= history.settled() and time.monotonic() > watch_until,
                hold=False)  # fmt: skip
        refused = []
        for m in held:
            with pytest.raises(Exception) as ack:  # the client raises its own exception types
                consumer.ack(m)
            refused.append(str(ack.value))
    verdict = history.verdict()
    print(f"after the deletion and the failover: {verdict.summary()}; an old ack: {refused[:1]}")
    verdict.assert_nothing_lost()
    assert not [b for b in history.deliveries if b.startswith("old")], f"old messages came back: {history.deliveries}"
    assert all("deleted" in text for text in refused), refused
    fresh = cluster.create_group(unique("fresh"), consume_from="earliest")
    with simple_consumer(cluster.endpoints, fresh, {topic: FilterExpression()}) as c:
        got = receive_until(c, lambda got: everything <= {m.body.decode() for m in got}, retry_unavailable=True)
    assert sorted(m.body.decode() for m in got) == sorted(everything)
