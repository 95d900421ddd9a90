"""A replicated broker group under faults other than a plain crash, with the official client and a
history check (docs/replication.md):

- a **partition** between the primary and its replicas, through a TCP fault proxy on the path the
  replicas dial (each member publishes its proxy's address with `--repl-advertise`): with
  `--min-insync 2` the primary stops acknowledging sends (and consumers' acks) once the replicas
  left the in-sync set (retriable refusals), and acknowledges again once the path heals and they caught up; a SIGKILL of
  the primary afterwards loses nothing acknowledged. Both ways a path breaks: a blackhole (bytes
  stall, connections stay open) and resets (every connection closed, reconnects refused);
- **FIFO order across failovers with acks**: a FIFO consumer group acks while the primary is
  SIGKILLed; no message of a message group is delivered while an earlier acknowledged one is
  unsettled (history.py defines it), and nothing acknowledged is lost; and with the replicas cut
  off, a message group's (and a lite topic's) next message waits until they hold the (refused) ack
  before it;
- **lite topics across a failover**: a LiteSimpleConsumer's subscriptions are the group's
  replicated state: after a SIGKILL of the primary it keeps receiving only its lite topics, in
  order, acked messages are not redelivered, nothing acknowledged is lost;
- **a partition between the primary and etcd only** (split brain): each member reaches etcd
  through a fault proxy of its own and only the primary's is cut; its term's deadline passes
  before its lease expires in etcd, so it acknowledges nothing between that deadline and the
  election of a replica (which serves), though clients still reach it; healed, it rejoins as a
  replica. A producer and a consumer run throughout: nothing acknowledged lost, no ack undone;
- **a partition that cuts off one replica only**: each replica dials each other member's
  replication port through a fault proxy of that pair's (`--repl-dial`); with the other replica
  in sync, sends stay acknowledged while the cut one leaves the in-sync set and, healed, rejoins;
- **a replica started during a partition** retries its silent HELLO until the path heals;
- **a receipt handle of a message the old primary lost** (delivered before any replica held it:
  the partition makes that certain) acks nothing on the new primary, which stored another message
  at that queue offset.

Topology (support/replicated.py): etcd (started here), a NameServer, one group of three members
with `--min-insync 2`, one proxy, shared by the tests that need no other wiring (each heals its
cuts and restarts its victims); for the etcd partition each member's `--etcd` is a fault proxy,
for the one-replica partition each replica's path to each member (`--repl-dial`).
Each test is bounded by its waits' timeouts.
"""

from __future__ import annotations

import contextlib
import datetime
import random
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from rocketmq import FilterExpression, Producer, SimpleConsumer
from rocketmq.v5.model import Message

from tests.e2e.support.clients import message, producer, simple_consumer
from tests.e2e.support.cluster import AdminError, Cluster
from tests.e2e.support.history import History
from tests.e2e.support.replicated import (
    CONFIG,
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
    stored_copy,
    traffic,
    wait,
)
from tests.e2e.test_lite_topics import create_lite_topic, lite_consumer, lite_message
from tests.helpers.etcd import EtcdProcess, start_etcd
from tests.helpers.faultproxy import FaultProxy, Mode
from tests.helpers.procs import LOOPBACK, free_port

SEED = 18
QUEUES = 4
# Sends refused during a partition before it heals: each takes the client's three attempts, which
# the proxy holds for most of their deadlines (it asks the group again while too few are in sync).
REFUSED_SENDS = 1
WAIT_S = 60.0


@dataclass
class Group:
    cluster: Cluster
    etcd: EtcdProcess
    paths: dict[str, FaultProxy]  # member -> the fault proxy in front of its replication port
    # member -> the fault proxy its etcd traffic runs through (empty unless asked for)
    etcd_paths: dict[str, FaultProxy]
    # (replica, primary) -> the fault proxy on that replica's own path to that member's
    # replication port (`--repl-dial`; empty unless asked for)
    links: dict[tuple[str, str], FaultProxy]


@pytest.fixture(scope="module")
def _shared_group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Group]:
    with _group(tmp_path_factory.mktemp("replicated-faults"), CONFIG) as g:
        yield g


@pytest.fixture
def group(_shared_group: Group) -> Group:
    """The replicated group, each member's replication port behind a fault proxy of its own; one
    for the tests of the module that need nothing else. Each test heals what it cut and starts
    again what it killed; here every path forwards again (in case a test before failed midway)
    and the test starts once the NameServer routes a primary and every member is in sync."""
    for path in _shared_group.paths.values():
        path.set_mode(Mode.FORWARD)
    wait("the group whole again", lambda: _whole(_shared_group), explain=lambda: _listed(_shared_group))
    return _shared_group


def _whole(g: Group) -> bool:
    """Every member is listed in sync and the NameServer routes the group to the member etcd names
    primary (a test finds the primary by the route; a failover the load caused may not be routed yet)."""
    try:
        rows = group_listing(g.cluster, g.etcd.url)
        leaders = [str(r["name"]) for r in rows if r["role"] == "primary"]
        in_sync = len(rows) == len(MEMBERS) and all(bool(r["in_sync"]) for r in rows)
        return in_sync and leaders == [routed_primary(g.cluster)]
    except AdminError:  # nothing registered with the NameServer for a moment (a primary just left)
        return False


def _listed(g: Group) -> object:
    try:
        return _in_sync(g)
    except AdminError as exc:
        return exc


@contextlib.contextmanager
def _group(root: Path, config_text: str, *, etcd_paths: bool = False, links: bool = False) -> Iterator[Group]:
    """With `etcd_paths`, each member also reaches etcd through a fault proxy of its own; with
    `links`, each member dials every other member's replication port through a fault proxy of
    that pair's (`--repl-dial`), so one replica's path can be cut alone."""
    etcd = start_etcd(root)
    paths: dict[str, FaultProxy] = {}
    to_etcd: dict[str, FaultProxy] = {}
    pairs: dict[tuple[str, str], FaultProxy] = {}
    cluster: Cluster | None = None
    try:
        args: dict[str, list[str]] = {}
        repl_ports = {name: free_port() for name in MEMBERS}
        for name, repl_port in repl_ports.items():
            paths[name] = FaultProxy(f"{LOOPBACK}:{repl_port}").start()
            args[name] = ["--repl-port", str(repl_port), "--repl-advertise", paths[name].address]
            if etcd_paths:  # the last --etcd wins over start_replicated's
                to_etcd[name] = FaultProxy(f"{LOOPBACK}:{etcd.port}").start()
                args[name] += ["--etcd", f"http://{to_etcd[name].address}"]
            for other in MEMBERS if links else ():
                if other != name:
                    pairs[name, other] = FaultProxy(f"{LOOPBACK}:{repl_ports[other]}").start()
                    args[name] += ["--repl-dial", f"{other}={pairs[name, other].address}"]
        cluster = start_replicated(root, etcd.url, member_args=args, config_text=config_text)
        yield Group(cluster, etcd, paths, to_etcd, pairs)
    finally:
        problems = cluster.stop() if cluster is not None else []
        for path in (*paths.values(), *to_etcd.values(), *pairs.values()):
            path.stop()
        etcd.stop()
    assert not problems, "\n".join(problems)


def _in_sync(g: Group) -> dict[str, bool]:
    return {str(r["name"]): bool(r["in_sync"]) for r in group_listing(g.cluster, g.etcd.url)}


def _wait_all_in_sync(g: Group, what: str = "every member in sync") -> None:
    """Every member listed (a member whose lease lapsed is not) and in sync."""
    wait(what, lambda: list(_in_sync(g).values()) == [True] * len(MEMBERS),
         explain=lambda: f"listed as {_in_sync(g)} (members {list(MEMBERS)})")  # fmt: skip


@dataclass
class Attempt:
    body: str
    started: float
    ended: float
    error: str  # empty: acknowledged


def _produce(client: Producer, topic: str, history: History, attempts: list[Attempt], stop: threading.Event) -> None:
    """Send p0, p1, ... until `stop`, recording every attempt (monotonic times) and each send
    acknowledged in `history`; a refused send is tried again with the same body (a refusal may
    still have been stored: a duplicate, never a loss)."""
    n = 0
    while not stop.is_set():
        body, started = f"p{n}", time.monotonic()
        try:
            client.send(message(topic, body.encode()))
        except Exception as exc:  # refused while the group is short of in-sync members or failing over
            attempts.append(Attempt(body, started, time.monotonic(), f"{type(exc).__name__}: {exc}"))
            time.sleep(0.1)
            continue
        attempts.append(Attempt(body, started, time.monotonic(), ""))
        history.sent(body)
        n += 1


def test_partition_between_primary_and_replicas_stops_acknowledgements(
    group: Group, unique: Callable[[str], str]
) -> None:
    cluster = group.cluster
    topic = cluster.create_topic(unique("t"), queues=QUEUES)
    consumers = cluster.create_group(unique("g"))
    history = History()
    attempts: list[Attempt] = []
    stop = threading.Event()

    def acked_since(t: float) -> int:
        return sum(1 for a in attempts if not a.error and a.started >= t)

    def refused_since(t: float) -> int:
        return sum(1 for a in attempts if a.error and a.started >= t)

    with producer(cluster.endpoints, topic) as client, \
            simple_consumer(cluster.endpoints, consumers, {topic: FilterExpression()}) as consumer:  # fmt: skip
        worker = threading.Thread(target=_produce, args=(client, topic, history, attempts, stop), name="producer")
        worker.start()
        try:
            _wait_all_in_sync(group)
            for mode in (Mode.BLACKHOLE, Mode.CLOSE):
                wait("sends", lambda: acked_since(time.monotonic() - 1.0) > 0)
                leader = primary(cluster)
                replicas = [m for m in MEMBERS if m != leader]
                path = group.paths[leader]
                connections = path.connections
                path.set_mode(mode)
                wait(f"the replicas to leave the in-sync set ({mode.value})",
                     lambda rs=replicas: not any(_in_sync(group)[r] for r in rs))  # type: ignore[misc]  # fmt: skip
                cut = time.monotonic()  # etcd no longer lists them: nothing may be acknowledged now
                wait("refused sends", lambda t=cut: refused_since(t) >= REFUSED_SENDS)  # type: ignore[misc]
                _ack_is_refused(consumer, history)  # a consumer's ack waits for the in-sync set as a send does
                healed = time.monotonic()
                path.set_mode(Mode.FORWARD)
                during = [a for a in attempts if a.started >= cut and a.ended <= healed]
                assert during and not [a.body for a in during if not a.error], (
                    f"sends acknowledged while the replicas were cut off ({mode.value})"
                )
                refusals = Counter(a.error.split(":", 1)[0] for a in during)
                assert all("min_insync" in a.error for a in during), f"refused otherwise: {during[-1].error}"
                print(f"{mode.value}: {len(during)} sends refused while partitioned: {dict(refusals)}; "
                      f"e.g. {during[-1].error[:200]}")  # fmt: skip
                wait(f"the replicas to rejoin the in-sync set ({mode.value})", lambda: all(_in_sync(group).values()))
                wait("sends acknowledged after the partition healed", lambda t=healed: acked_since(t) >= 5)  # type: ignore[misc]
                assert primary(cluster) == leader, "the primary kept its term (etcd was reachable)"
                if mode is Mode.BLACKHOLE:  # TCP held on: the stalled streams simply went on
                    assert path.connections == connections, "a replica reconnected through a blackhole"
                else:  # reset: the replicas came back on new connections
                    assert path.connections >= connections + len(replicas)
        finally:
            stop.set()
            worker.join(60)
        # The replicas caught up with everything acknowledged: the successor of a SIGKILLed primary holds it.
        fail_over(cluster)
        held: list[Message] = []
        everything = set(history.sends)
        consume(consumer, history, held, lambda: everything <= history.settled(), hold=False)
    verdict = history.verdict()
    print(f"partition history: {verdict.summary()}")
    verdict.assert_nothing_lost()


def _ack_is_refused(consumer: SimpleConsumer, history: History) -> None:
    """Receive one message (a pop does not wait for replicas) and check that its ack is refused for
    want of in-sync members; the history records it as delivered with a failed ack."""
    deadline = time.monotonic() + WAIT_S
    got: list[Message] = []
    while not got:
        assert time.monotonic() < deadline, "nothing received while partitioned"
        got = consumer.receive(1, INVISIBLE_S)
    msg = got[0]
    history.delivered(msg.body.decode(), stored_copy(msg))
    with pytest.raises(Exception, match="min_insync"):
        consumer.ack(msg)
    history.ack_failed(msg.body.decode())


FIFO_KILLS = 2
MESSAGE_GROUPS = 6


def test_fifo_groups_keep_their_order_across_failovers_with_acks(group: Group, unique: Callable[[str], str]) -> None:
    """A producer sends per message group with increasing sequence numbers (retrying the same one
    until acknowledged), a FIFO consumer group receives and acks, and the primary is SIGKILLed at
    random moments: no delivery breaks a message group's order (history.py), no ack answered OK is
    undone, nothing acknowledged is lost."""
    cluster = group.cluster
    topic = cluster.create_topic(unique("t"), message_type="fifo", queues=QUEUES)
    consumers = cluster.create_group(unique("g"), fifo=True)
    history = History()
    seq: Counter[str] = Counter()
    keys = random.Random(SEED + 1)

    def send_one(client: Producer) -> None:
        key = f"k{keys.randrange(MESSAGE_GROUPS)}"
        body = f"{key}:{seq[key]}"  # a refused send leaves the number to be tried again
        client.send(message(topic, body.encode(), group=key))
        history.sent(body, stream=key)
        seq[key] += 1

    run_through_failovers(cluster, topic, consumers, history, send_one, kills=FIFO_KILLS, rng=random.Random(SEED))
    verdict = history.verdict()
    print(f"FIFO history: {verdict.summary()}; message groups {len(history.streams)}")
    verdict.assert_nothing_lost()
    assert not verdict.out_of_order, f"message group order broken: {verdict.out_of_order[:10]}"


QUIET_S = 3.0  # how long the second consumer must get nothing of the message group


def _receive_one(consumer: SimpleConsumer) -> Message:
    deadline = time.monotonic() + WAIT_S
    while True:
        assert time.monotonic() < deadline, "nothing received"
        got = consumer.receive(1, INVISIBLE_S)
        if got:
            return got[0]


def test_a_fifo_groups_next_message_waits_until_the_ack_before_it_is_held(
    group: Group, unique: Callable[[str], str]
) -> None:
    """Two consumers of one FIFO group. With the replicas cut off, the first consumer's ack of m0
    is not answered OK (the primary applied it; no replica holds it, and they leave the in-sync
    set): the second consumer gets nothing of the message group until the replicas are back and
    hold that ack, then m1 (docs/replication.md, "FIFO message groups"). Before, m1 went
    to the second consumer at once; a failover then would have delivered m0 again after m1."""
    cluster = group.cluster
    topic = cluster.create_topic(unique("t"), message_type="fifo", queues=1)
    consumers = cluster.create_group(unique("g"), fifo=True)
    subscription = {topic: FilterExpression()}
    with producer(cluster.endpoints, topic) as client, \
            simple_consumer(cluster.endpoints, consumers, subscription) as first, \
            simple_consumer(cluster.endpoints, consumers, subscription) as second:  # fmt: skip
        for i in range(2):
            client.send(message(topic, f"m{i}".encode(), group="order-7"))
        _the_next_waits_until_the_ack_is_held(group, first, second)


def test_a_lite_topics_next_message_waits_until_the_ack_before_it_is_held(
    group: Group, unique: Callable[[str], str]
) -> None:
    """The same for a lite topic (docs/lite-topics.md: consumed in order): two LiteSimpleConsumers
    of one group subscribed to one lite topic; with the replicas cut off, the first one's ack of m0
    is not answered OK, and the second gets nothing until the replicas hold it, then m1. Before, m1
    went to the second consumer at once (broker/popstate.py, "Lite topics")."""
    cluster = group.cluster
    topic = create_lite_topic(cluster, unique("t"))
    consumers = cluster.create_group(unique("g"))
    first, second = lite_consumer(cluster, topic, consumers), lite_consumer(cluster, topic, consumers)
    try:
        for consumer in (first, second):
            consumer.subscribe_lite("chat-7")
        with producer(cluster.endpoints, topic) as client:
            for i in range(2):
                client.send(lite_message(topic, "chat-7", f"m{i}".encode()))
        _the_next_waits_until_the_ack_is_held(group, first, second)
    finally:
        first.shutdown()
        second.shutdown()


def _the_next_waits_until_the_ack_is_held(group: Group, first: SimpleConsumer, second: SimpleConsumer) -> None:
    """m0 and m1 stored in order for one group: `first` receives m0; with the primary's replication
    path blackholed, its ack is not answered OK; `second` gets nothing for QUIET_S, and m1 once
    healed and back in sync."""
    cluster = group.cluster
    m0 = _receive_one(first)
    assert m0.body == b"m0"
    leader = primary(cluster)
    replicas = [m for m in MEMBERS if m != leader]
    path = group.paths[leader]
    path.set_mode(Mode.BLACKHOLE)
    try:
        # The ack (a state change the cut replicas cannot take) waits for them until they leave
        # the in-sync set (`max_lag_ms`), then is refused "fell below min_insync", or the
        # client's deadline ends first: either way not answered OK, and applied on the primary.
        with pytest.raises(Exception):  # noqa: B017
            first.ack(m0)
        wait("the replicas to leave the in-sync set", lambda: not any(_in_sync(group)[r] for r in replicas))
        early: list[Message] = []
        quiet_until = time.monotonic() + QUIET_S
        while time.monotonic() < quiet_until:
            early += second.receive(16, INVISIBLE_S)
        assert not early, f"delivered while the ack before it was held by no replica: {[m.body for m in early]}"
    finally:
        path.set_mode(Mode.FORWARD)
    _wait_all_in_sync(group, "the replicas back in sync")
    m1 = _receive_one(second)
    assert m1.body == b"m1"
    second.ack(m1)


LITE_SUBSCRIBED = ("chat-a", "chat-b")
LITE_OTHER = "chat-c"
LITE_ROUND = 10  # messages per lite topic per round
LITE_QUIET_S = 2 * 6  # after the last expected message: two invisible durations for stragglers


def test_lite_subscriptions_and_messages_survive_a_failover(group: Group, unique: Callable[[str], str]) -> None:
    """A LiteSimpleConsumer subscribed to two lite topics (of three sent to) acks a round of
    messages, the primary is SIGKILLed right after, and a second round is sent to the new primary:
    the consumer gets only its lite topics, each in order, nothing it acked again, and nothing
    acknowledged to the producer is missing. The client re-sends its subscriptions only every
    30 s: what the new primary delivers, it delivers from the replicated subscriptions."""
    cluster = group.cluster
    topic = create_lite_topic(cluster, unique("t"))
    consumers = cluster.create_group(unique("g"))
    history = History()
    held: list[Message] = []
    consumer = lite_consumer(cluster, topic, consumers)
    try:
        for lite in LITE_SUBSCRIBED:
            consumer.subscribe_lite(lite)
        with producer(cluster.endpoints, topic) as client:
            for round_no in range(2):
                for i in range(LITE_ROUND):
                    for lite in (*LITE_SUBSCRIBED, LITE_OTHER):
                        body = f"{lite}:{round_no}:{i}"
                        retrying_send(client, lite_message(topic, lite, body.encode()))
                        if lite != LITE_OTHER:
                            history.sent(body, stream=lite)
                wanted = set(history.sends)
                consume(consumer, history, held, lambda w=wanted: w <= history.settled(), hold=False)  # type: ignore[misc]
                if round_no == 0:
                    fail_over(cluster)  # right after the acks above were answered OK
                    # The new primary holds the subscriptions (stored state, not the client's resync).
                    listing = lambda: cluster.admin("lite", "list", topic, "--group", consumers)  # noqa: E731
                    rows = retrying("a lite listing", listing)["largest"]  # type: ignore[index]
                    subscribers = {row["lite_topic"]: row["subscribers"] for row in rows}
                    assert subscribers == {"chat-a": 1, "chat-b": 1, LITE_OTHER: 0}, subscribers
        quiet_until = time.monotonic() + LITE_QUIET_S
        consume(consumer, history, held, lambda: time.monotonic() >= quiet_until, hold=False)
    finally:
        consumer.shutdown()
    verdict = history.verdict()
    strays = [body for body in history.deliveries if body.startswith(f"{LITE_OTHER}:")]
    print(f"lite history: {verdict.summary()}")
    assert not strays, f"lite topics nobody subscribed to were delivered: {strays[:10]}"
    verdict.assert_nothing_lost()
    assert not verdict.out_of_order, f"lite topic order broken: {verdict.out_of_order[:10]}"


def retrying_send(client: Producer, msg: Message, timeout_s: float = 60.0) -> None:
    """Send until acknowledged (retriable refusals while the group fails over)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            client.send(msg)
            return
        except Exception:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.3)


# Replicas stay in the in-sync set (eligible) this long while cut off: the test kills the primary
# well inside it.
PATIENT_CONFIG = CONFIG.replace("max_lag_ms = 1500", "max_lag_ms = 20000")


def test_a_handle_of_a_message_the_old_primary_lost_acks_nothing_on_the_new(
    tmp_path: Path, unique: Callable[[str], str]
) -> None:
    """A consumer may receive a message the replicas do not hold yet (dispatch comes before the
    acknowledgement gate). If the primary dies then, the new primary stores other messages at that
    queue offset; the old receipt handle names the same broker (the group), queue and offset. Its
    ack must be refused, not remove the entry of whatever the new primary delivered there."""
    with _group(tmp_path, PATIENT_CONFIG) as g:
        cluster = g.cluster
        topic = cluster.create_topic(unique("t"), queues=1)
        consumers = cluster.create_group(unique("g"))
        _wait_all_in_sync(g)
        leader = primary(cluster)
        with producer(cluster.endpoints, topic) as client, \
                simple_consumer(cluster.endpoints, consumers, {topic: FilterExpression()}) as first, \
                simple_consumer(cluster.endpoints, consumers, {topic: FilterExpression()}) as second:  # fmt: skip
            g.paths[leader].set_mode(Mode.BLACKHOLE)  # the replicas never get what is sent now
            stranded = threading.Thread(target=_send_once, args=(client, message(topic, b"stranded")), daemon=True)
            stranded.start()
            got: list[Message] = []
            deadline = time.monotonic() + WAIT_S
            while not got:  # delivered by the old primary before any replica held it
                assert time.monotonic() < deadline, "the old primary did not deliver the stranded message"
                got = first.receive(1, 60)
            stale = got[0]
            assert stale.body == b"stranded"
            fail_over(cluster)  # the replicas were still in sync (eligible): one of them takes over
            g.paths[leader].set_mode(Mode.FORWARD)
            stranded.join(60)
            retrying_send(client, message(topic, b"other"))
            fresh: list[Message] = []
            deadline = time.monotonic() + WAIT_S
            while not fresh:
                assert time.monotonic() < deadline, "the new primary delivered nothing"
                fresh += retrying("a receive", lambda: second.receive(16, 60))  # type: ignore[operator]
            at_stale_offset = [m for m in fresh if stored_copy(m) == stored_copy(stale)]
            assert at_stale_offset, f"the new primary stored nothing at {stored_copy(stale)}: {fresh}"
            try:
                first.ack(stale)  # a handle the new primary never issued
            except Exception as exc:
                assert "receipt handle" in str(exc), exc
            else:
                taken = [m.body.decode() for m in at_stale_offset]
                raise AssertionError(f"the old primary's handle acked {taken}, delivered by the new primary")
            for m in fresh:
                second.ack(m)  # the deliveries the new primary did make are still theirs to ack


def _send_once(client: Producer, msg: Message) -> None:
    with contextlib.suppress(Exception):  # refused or cut off with the primary: never acknowledged
        client.send(msg)


def test_a_replica_started_during_a_partition_waits_it_out(group: Group, unique: Callable[[str], str]) -> None:
    """A replica (re)started while its primary's replication path is a blackhole connects, says
    HELLO and hears nothing: it must keep trying, not give up for good, and rejoin once healed."""
    cluster = group.cluster
    topic = cluster.create_topic(unique("t"), queues=QUEUES)
    _wait_all_in_sync(group)
    leader = primary(cluster)
    victim = next(m for m in MEMBERS if m != leader)
    path = group.paths[leader]
    path.set_mode(Mode.BLACKHOLE)
    cluster.kill(victim)
    connections = path.connections
    restart(cluster, victim)
    wait("the restarted replica to try again after its first silent attempt",
         lambda: path.connections >= connections + 2 or not cluster.processes[victim].running())  # fmt: skip
    assert cluster.processes[victim].running(), f"{victim} exited:\n{cluster.processes[victim].tail(30)}"
    path.set_mode(Mode.FORWARD)
    _wait_all_in_sync(group, "every member in sync again")
    with producer(cluster.endpoints, topic) as client:
        retrying_send(client, message(topic, b"after"))


LEASE_TTL_S = 2.0  # CONFIG's lease_ttl_s
# The fence comes FENCE_MARGIN_S before the lease could expire; etcd expires it a TTL after the last
# refresh it got, at most TTL/3 before the cut. With a margin above TTL/3 the span between the
# fence and the earliest possible election is never empty: nobody may acknowledge in it.
FENCE_MARGIN_S = 0.9
FENCED_CONFIG = CONFIG.replace("lease_ttl_s = 2\n", f"lease_ttl_s = 2\nfence_margin_s = {FENCE_MARGIN_S}\n")
ELECTED = re.compile(r"^(\S+ \S+) INFO .*elected primary .*member=(\S+) epoch=(\d+)", re.MULTILINE)


def _logged_at(stamp: str) -> float:
    """A log line's time ("2026-11-26 10:50:09,401", local time) on the monotonic clock."""
    wall = datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
    return wall - time.time() + time.monotonic()


def test_a_primary_cut_off_from_etcd_is_fenced_and_a_replica_takes_over(
    tmp_path: Path, unique: Callable[[str], str]
) -> None:
    """Split brain: each member reaches etcd through a fault proxy of its own, and only the
    primary's is cut (a blackhole) while clients and replicas still reach the primary. Its lease
    runs out in etcd, a replica is elected and serves; the old primary acknowledges nothing once
    its term's deadline passed (at most TTL - margin after the cut: the fence), while clients still
    reach it. Healed, it rejoins as a replica (dropping any tail the new term does not have).
    Meanwhile a producer sends and a consumer acks throughout: nothing acknowledged is lost, no
    ack answered OK is undone."""
    assert FENCED_CONFIG != CONFIG
    with _group(tmp_path, FENCED_CONFIG, etcd_paths=True) as g:
        cluster = g.cluster
        topic = cluster.create_topic(unique("t"), queues=QUEUES)
        consumers = cluster.create_group(unique("g"))
        history = History()
        attempts: list[Attempt] = []

        def produce(client: Producer, stop: threading.Event) -> None:
            _produce(client, topic, history, attempts, stop)

        with traffic(cluster, topic, consumers, history, produce):
            _wait_all_in_sync(g)
            wait("sends and acks", lambda: len(history.sends) >= 20 and len(history.acks) >= 10)
            old = primary(cluster)
            old_epoch = _epoch(g)
            g.etcd_paths[old].set_mode(Mode.BLACKHOLE)
            cut = time.monotonic()  # its last lease refresh that etcd answered was sent before this
            fence = cut + LEASE_TTL_S - FENCE_MARGIN_S  # its term's deadline is no later than this

            def elected() -> tuple[str, float] | None:
                for name in MEMBERS:
                    for stamp, who, epoch in ELECTED.findall(cluster.processes[name].output()):
                        if who == name != old and int(epoch) > old_epoch:
                            return name, _logged_at(stamp)
                return None

            wait("another member to be elected", lambda: elected() is not None)
            successor, elected_at = elected() or ("", 0.0)
            wait("the NameServer to route the group to the new primary", lambda: new_primary(cluster, old))
            wait("sends acknowledged by the new primary",
                 lambda: sum(1 for a in attempts if not a.error and a.started >= elected_at) >= 10)  # fmt: skip
            assert cluster.processes[old].running(), f"{old} exited:\n{cluster.processes[old].tail(30)}"
            # Between the fence and the election nobody may acknowledge: the new primary did not
            # exist yet, and the old one was past its term's deadline.
            orphaned = [a for a in attempts if fence <= a.started and a.ended < elected_at]
            assert not [a.body for a in orphaned if not a.error], (
                f"acknowledged by {old} after its term's deadline (fence at +{fence - cut:.2f}s, "
                f"{successor} elected at +{elected_at - cut:.2f}s): {[a for a in orphaned if not a.error]}"
            )
            refused = [a for a in attempts if a.started >= cut and a.error]
            example = refused[-1].error[:200] if refused else "-"
            print(f"etcd cut from {old} at 0: fence by +{fence - cut:.2f}s, {successor} elected at "
                  f"+{elected_at - cut:.2f}s; {len(orphaned)} sends between, all refused; "
                  f"{len(refused)} refused after the cut, e.g. {example}")  # fmt: skip
            g.etcd_paths[old].set_mode(Mode.FORWARD)
            _wait_all_in_sync(g, f"{old} to rejoin as an in-sync replica")
            roles = {str(r["name"]): r["role"] for r in group_listing(cluster, g.etcd.url)}
            assert roles[old] == "replica" and roles[successor] == "primary", roles
            healed = time.monotonic()
            wait("sends acknowledged after healing",
                 lambda: sum(1 for a in attempts if not a.error and a.started >= healed) >= 5)  # fmt: skip
        cut_lines = [line for line in cluster.processes[old].output().splitlines() if "replica log" in line]
        print(f"{old} rejoined: {cut_lines[-1] if cut_lines else 'no divergent tail to drop'}")
    verdict = history.verdict()
    print(f"etcd partition history: {verdict.summary()}")
    verdict.assert_nothing_lost()


def _epoch(g: Group) -> int:
    return max(int(str(r["epoch"])) for r in group_listing(g.cluster, g.etcd.url))


def test_a_partition_cutting_off_one_replica_keeps_acknowledging(tmp_path: Path, unique: Callable[[str], str]) -> None:
    """Each replica dials the primary through a fault proxy of its own (`--repl-dial`), and only
    one replica's path is cut (a blackhole). With three members and `--min-insync 2` the other
    replica keeps the group acknowledging: the cut one leaves the in-sync set (`admin broker list`
    shows `in_sync` false) within `max_lag_ms`, sends go on being acknowledged, and once healed it
    catches up and is in sync again. A producer and a consumer run throughout: nothing
    acknowledged lost, no ack undone; the primary keeps its term."""
    with _group(tmp_path, CONFIG, links=True) as g:
        cluster = g.cluster
        topic = cluster.create_topic(unique("t"), queues=QUEUES)
        consumers = cluster.create_group(unique("g"))
        history = History()
        attempts: list[Attempt] = []

        def acked_since(t: float) -> int:
            return sum(1 for a in attempts if not a.error and a.started >= t)

        def produce(client: Producer, stop: threading.Event) -> None:
            _produce(client, topic, history, attempts, stop)

        with traffic(cluster, topic, consumers, history, produce):
            _wait_all_in_sync(g)
            wait("sends and acks", lambda: len(history.sends) >= 20 and len(history.acks) >= 10)
            leader = primary(cluster)
            cut_off, other = (m for m in MEMBERS if m != leader)
            link = g.links[cut_off, leader]
            # Each replica streams through its own link, not through the address the primary published.
            assert link.connections >= 1 and g.links[other, leader].connections >= 1
            assert g.paths[leader].connections == 0, "a replica dialled the published address"
            link.set_mode(Mode.BLACKHOLE)
            cut = time.monotonic()
            wait(f"{cut_off} to leave the in-sync set", lambda: not _in_sync(g).get(cut_off, True),
                 explain=lambda: _in_sync(g))  # fmt: skip
            left = time.monotonic()
            assert _in_sync(g)[other], f"{other}, not cut off, left the in-sync set: {_in_sync(g)}"
            wait("sends acknowledged with one replica cut off", lambda: acked_since(left) >= 20)
            during = [a for a in attempts if a.started >= left]
            refused = [a for a in during if a.error]
            assert not refused, f"sends refused with {other} still in sync: {refused[:5]}"
            healed = time.monotonic()
            link.set_mode(Mode.FORWARD)
            _wait_all_in_sync(g, f"{cut_off} back in sync after healing")
            back = time.monotonic()
            wait("sends acknowledged after healing", lambda: acked_since(back) >= 5)
            assert primary(cluster) == leader, "the primary kept its term (etcd was reachable)"
            print(f"{cut_off} cut off from {leader}: out of the in-sync set after {left - cut:.2f}s, "
                  f"{acked_since(left) - acked_since(healed)} sends acknowledged meanwhile (none refused), "
                  f"in sync again {back - healed:.2f}s after healing")  # fmt: skip
    verdict = history.verdict()
    print(f"one-replica partition history: {verdict.summary()}")
    verdict.assert_nothing_lost()
