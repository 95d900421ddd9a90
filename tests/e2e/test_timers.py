"""DELAY messages and RecallMessage with the official Python client, in both topologies.

The Python client puts `Message.delivery_timestamp` into the Timestamp's *seconds* unchanged,
so these tests schedule in whole seconds, as its example does. Timing checks
say only "not before the delivery time" (client and server share this machine's clock); waits for
delivery are bounded and generous.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from rocketmq.grpc_protocol import MessageType
from rocketmq.v5.exception import NotFoundException
from rocketmq.v5.model import Message

from tests.e2e.support import raw
from tests.e2e.support.clients import message, producer, producer_and_consumer, receive_count, receive_until
from tests.e2e.support.cluster import Cluster, _start, start_merged, start_separated
from tests.helpers.procs import LOOPBACK

DELAY_S = 3
RECEIVE_TIMEOUT_S = 60.0


def delayed(topic: str, body: bytes, at_s: int) -> Message:
    msg = message(topic, body)
    msg.delivery_timestamp = at_s
    return msg


def check_on_time(msgs: list[Message], due_ms: dict[str, int], received_ms: dict[str, int]) -> None:
    for m in msgs:
        assert m.message_type == MessageType.DELAY
        assert m.delivery_timestamp == due_ms[m.message_id]
        assert received_ms[m.message_id] >= due_ms[m.message_id], f"{m.message_id} received before its time"


def receive_timed(
    c: object, count: int, received_ms: dict[str, int], *, retry_unavailable: bool = False
) -> list[Message]:
    def done(got: list[Message]) -> bool:
        for m in got:
            received_ms.setdefault(m.message_id, time.time_ns() // 1_000_000)
        return len(got) >= count

    return receive_until(c, done, timeout_s=RECEIVE_TIMEOUT_S, retry_unavailable=retry_unavailable)  # type: ignore[arg-type]


def test_delay_message_arrives_at_its_time_not_before(cluster: Cluster, unique: Callable[[str], str]) -> None:
    topic = cluster.create_topic(unique("t"), "delay")
    group = cluster.create_group(unique("g"))
    with producer_and_consumer(cluster.endpoints, topic, group) as (p, c):
        at_s = int(time.time()) + DELAY_S
        due = {}
        for i in range(4):
            receipt = p.send(delayed(topic, f"later-{i}".encode(), at_s))
            assert receipt.recall_handle
            due[receipt.message_id] = at_s * 1000
        received: dict[str, int] = {}
        got = receive_timed(c, len(due), received)
    assert sorted(m.message_id for m in got) == sorted(due)
    check_on_time(got, due, received)
    raw.assert_drained(cluster.first_proxy, cluster.brokers, topic, group)


def test_recall_cancels_a_pending_delay_message(cluster: Cluster, unique: Callable[[str], str]) -> None:
    topic = cluster.create_topic(unique("t"), "delay")
    group = cluster.create_group(unique("g"))
    with producer_and_consumer(cluster.endpoints, topic, group) as (p, c):
        at_s = int(time.time()) + DELAY_S
        keep = p.send(delayed(topic, b"keep", at_s))
        drop = p.send(delayed(topic, b"drop", at_s))
        assert p.recall_message(topic, drop.recall_handle) == drop.message_id
        with pytest.raises(NotFoundException, match=r"(?i)already delivered or recalled"):
            p.recall_message(topic, drop.recall_handle)
        got = receive_count(c, 1, timeout_s=RECEIVE_TIMEOUT_S)
        assert [m.message_id for m in got] == [keep.message_id]
        with pytest.raises(NotFoundException, match=r"(?i)already delivered or recalled"):
            p.recall_message(topic, keep.recall_handle)
    # the recalled one was due with `keep`: nothing is left
    raw.assert_drained(cluster.first_proxy, cluster.brokers, topic, group)


def pending_timers(cluster: Cluster, topic: str) -> int:
    rows = cluster.admin("topic", "describe", topic)
    return sum({r["broker"]: r["broker_pending_timers"] for r in rows}.values())


def test_admin_shows_pending_timers(cluster: Cluster, unique: Callable[[str], str]) -> None:
    topic = cluster.create_topic(unique("t"), "delay")
    with producer(cluster.endpoints, topic) as p:
        far_s = int(time.time()) + 3600
        receipts = [p.send(delayed(topic, f"far-{i}".encode(), far_s)) for i in range(3)]
        assert pending_timers(cluster, topic) == 3
        for r in receipts:
            assert p.recall_message(topic, r.recall_handle) == r.message_id
    assert pending_timers(cluster, topic) == 0


def test_bad_delivery_times_and_recall_handles(cluster: Cluster, unique: Callable[[str], str]) -> None:
    topic = cluster.create_topic(unique("t"), "delay")
    normal = cluster.create_topic(unique("n"))
    with raw.stub(cluster.first_proxy) as s:

        def send_at(name: str, seconds: int) -> str:
            msg = raw.message(name, message_type=raw.pb.DELAY)
            msg.system_properties.delivery_timestamp.seconds = seconds
            return raw.code_name(raw.send(s, msg).status.code)

        assert send_at(topic, int(time.time()) + 8 * 24 * 3600) == "ILLEGAL_DELIVERY_TIME"  # beyond 7 days
        assert send_at(topic, int(time.time() * 1000) + 5_000) == "ILLEGAL_DELIVERY_TIME"  # ms in the seconds field
        assert send_at(normal, int(time.time()) + 5) == "MESSAGE_PROPERTY_CONFLICT_WITH_TYPE"
        for handle in ("", "garbage", "no-such-broker~AQAAAAAAAAAAAAAAAAAAAAAAAAAA"):
            recall = s.RecallMessage(raw.spb.RecallMessageRequest(topic=raw.resource(topic), recall_handle=handle),
                                     metadata=raw.headers(), timeout=raw.RPC_TIMEOUT_S)  # fmt: skip
            assert raw.code_name(recall.status.code) == "BAD_REQUEST", recall
            assert "recall handle" in recall.status.message


# -- restarts ---------------------------------------------------------------------------------------


def _port(argv: list[str]) -> int:
    return int(argv[argv.index("--port") + 1])


def restart(cluster: Cluster, name: str, *, kill: bool) -> None:
    """SIGKILL (or stop) one process of `cluster` and start it again with the same command line."""
    child = cluster.processes[name]
    argv = [str(a) for a in child.popen.args]  # type: ignore[union-attr]
    if kill:
        cluster.kill(name)
        cluster.killed.discard(name)
    else:
        assert child.stop() == 0
    port = _port(argv)
    ready = f"proxy listening on {LOOPBACK}:{port}" if cluster.kind == "merged" else f"broker {name} listening on"
    _start(cluster, name, argv, port, ready)


@pytest.fixture(params=["merged", "separated"])
def own_cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Cluster]:
    """A cluster of this test alone (it restarts processes)."""
    started = start_merged(tmp_path / "m") if request.param == "merged" else start_separated(tmp_path / "s")
    try:
        yield started
    finally:
        problems = started.stop()
        assert not problems, "cluster teardown:\n" + "\n".join(problems)


def test_timers_survive_broker_sigkill_and_restart(own_cluster: Cluster, unique: Callable[[str], str]) -> None:
    cluster = own_cluster
    topic = cluster.create_topic(unique("t"), "delay")
    group = cluster.create_group(unique("g"))
    brokers = [n for n in cluster.processes if n.startswith("up-")] or list(cluster.brokers)
    due: dict[str, int] = {}
    with producer(cluster.endpoints, topic) as p:
        base_s = int(time.time())
        for i in range(20):  # due in waves: before, between and after the restarts
            at_s = base_s + 4 + 4 * (i % 4)
            due[p.send(delayed(topic, f"m{i}".encode(), at_s)).message_id] = at_s * 1000
        recalled = p.send(delayed(topic, b"recalled", base_s + 8))
        assert p.recall_message(topic, recalled.recall_handle) == recalled.message_id
    for name in brokers:
        restart(cluster, name, kill=True)
    time.sleep(2)
    for name in brokers:
        restart(cluster, name, kill=False)
    with producer_and_consumer(cluster.endpoints, topic, group) as (_, c):
        received: dict[str, int] = {}
        got = receive_timed(c, len(due), received, retry_unavailable=True)
        time.sleep(2)  # a duplicate (or the recalled message) would be due by now
        got += c.receive(16, 30)
    ids = [m.message_id for m in got]
    assert sorted(ids) == sorted(due), "each timer exactly once, the recalled one never"
    check_on_time(got, due, received)
