"""The operator's commands against real clusters with the official client producing and consuming:
`group reset-offset`, `client list`, and `group describe` counting queues a group never consumed.
Merged and separated topologies."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Callable

import pytest
from rocketmq import FilterExpression, Message, Producer
from rocketmq.v5.exception import ForbiddenException
from rocketmq.v5.exception.client_exception import IllegalArgumentException

from tests.e2e.support import raw
from tests.e2e.support.clients import message, producer, producer_and_consumer, receive_count, send_all
from tests.e2e.support.cluster import SLUICE, AdminError, Cluster
from tests.helpers.procs import REPO_ROOT

REPORT_WAIT_S = 20.0  # proxies report their clients every 5 s
# The Python client refreshes its routes every 30 s: one it fetched while a topic was read-only
# offers no queue to write until then.
CLIENT_ROUTE_WAIT_S = 45.0


def _eventually(check: Callable[[], object], what: str, timeout_s: float = REPORT_WAIT_S) -> object:
    deadline = time.monotonic() + timeout_s
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what}: not within {timeout_s} s")
        time.sleep(0.5)


def _sent(p: Producer, msg: Message) -> bool:
    try:
        p.send(msg)
    except ForbiddenException:  # the proxy's route still says read-only
        return False
    except IllegalArgumentException as exc:  # the client's own route does
        if "no available message queues" not in str(exc):
            raise
        return False
    return True


def test_reset_offset_replays_and_skips_while_consumers_are_connected(
    cluster: Cluster, unique: Callable[[str], str]
) -> None:
    topic = cluster.create_topic(unique("t"), queues=4)
    group = cluster.create_group(unique("g"))
    with producer_and_consumer(cluster.endpoints, topic, group) as (p, c):
        sent = send_all(p, [message(topic, f"m{i}".encode()) for i in range(6)])
        first = receive_count(c, 6)
        assert sorted(m.message_id for m in first) == sorted(sent)
        assert cluster.admin("group", "describe", group)["lag"] == 0

        dry = cluster.admin("group", "reset-offset", group, "--topic", topic, "--to", "earliest", "--dry-run")
        assert dry["dry_run"] and dry["lag_after"] == 6 and {q["offset"] for q in dry["queues"]} == {0}
        assert cluster.admin("group", "describe", group)["lag"] == 0  # a dry run changes nothing

        done = cluster.admin("group", "reset-offset", group, "--topic", topic, "--to", "earliest")
        assert not done["dry_run"] and done["lag_after"] == 6
        assert sum(q["previous"] for q in done["queues"]) == 6  # each queue was consumed to its end
        again = receive_count(c, 6)  # the same consumer, still connected, gets them all again
        assert sorted(m.message_id for m in again) == sorted(sent)

        more = send_all(p, [message(topic, b"skipped") for _ in range(3)])
        skipped = cluster.admin("group", "reset-offset", group, "--topic", topic, "--to", "latest")
        assert skipped["lag_after"] == 0 and len(more) == 3
        assert cluster.admin("group", "describe", group)["lag"] == 0
    raw.assert_drained(cluster.first_proxy, cluster.brokers, topic, group)


def test_reset_offset_to_a_time_and_of_one_queue(cluster: Cluster, unique: Callable[[str], str]) -> None:
    topic = cluster.create_topic(unique("t"), queues=len(cluster.brokers))
    group = cluster.create_group(unique("g"))
    with producer_and_consumer(cluster.endpoints, topic, group) as (p, c):
        send_all(p, [message(topic, b"old") for _ in range(4)])
        receive_count(c, 4)
        time.sleep(1.1)
        middle = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())  # whole seconds: wait past it
        time.sleep(1.1)
        newer = send_all(p, [message(topic, b"new") for _ in range(4)])
        receive_count(c, 4)
        cluster.admin("group", "reset-offset", group, "--topic", topic, "--to", middle)
        replayed = receive_count(c, 4)
        assert sorted(m.message_id for m in replayed) == sorted(newer)  # what was stored after the time
        one = cluster.admin("group", "reset-offset", group, "--topic", topic, "--to", "0", "--queue", "0",
                            "--broker", cluster.brokers[0])  # fmt: skip
        assert [(q["broker"], q["queue"], q["offset"]) for q in one["queues"]] == [(cluster.brokers[0], 0, 0)]
        receive_count(c, one["lag_after"])


def test_reset_offset_refuses_bad_arguments(cluster: Cluster, unique: Callable[[str], str]) -> None:
    topic = cluster.create_topic(unique("t"), queues=2)
    group = cluster.create_group(unique("g"))
    for args, wanted in [
        (["--to", "yesterday"], "--to 'yesterday': use earliest, latest"),
        (["--to", "0", "--queue", "7"], "not queue 7"),
        (["--to", "0", "--broker", "nobody"], "broker nobody holds no queue"),
    ]:
        with pytest.raises(AdminError, match=re.escape(wanted)):
            cluster.admin("group", "reset-offset", group, "--topic", topic, *args)
    with pytest.raises(AdminError, match=r"CONSUMER_GROUP_NOT_FOUND|does not exist"):
        cluster.admin("group", "reset-offset", unique("nogroup"), "--topic", topic, "--to", "latest")


def test_client_list_shows_who_is_connected(cluster: Cluster, unique: Callable[[str], str]) -> None:
    topic = cluster.create_topic(unique("t"))
    group = cluster.create_group(unique("g"))
    with producer_and_consumer(cluster.endpoints, topic, group) as (p, c):
        send_all(p, [message(topic, b"hello")])
        receive_count(c, 1)

        def members() -> list[dict[str, object]]:
            return [r for r in cluster.admin("client", "list") if topic in r["topics"]]

        rows = _eventually(lambda: len(members()) >= 2 and members(), "producer and consumer listed")
        assert isinstance(rows, list)
        kinds = {r["type"]: r for r in rows}
        assert set(kinds) >= {"PRODUCER", "SIMPLE_CONSUMER"}, rows
        consumer = kinds["SIMPLE_CONSUMER"]
        assert consumer["group"] == group and consumer["language"] == "PYTHON" and consumer["version"]
        assert consumer["proxy"] in cluster.proxies and str(consumer["address"]).startswith("127.0.0.1:")
        assert 0 <= float(consumer["last_seen_s"]) < 60  # type: ignore[arg-type]
        by_group = cluster.admin("client", "list", "--group", group)
        assert [r["client_id"] for r in by_group] == [consumer["client_id"]]
        assert {r["client_id"] for r in cluster.admin("client", "list", "--topic", topic)} >= {
            r["client_id"] for r in rows
        }


def test_describe_counts_queues_the_group_never_consumed(cluster: Cluster, unique: Callable[[str], str]) -> None:
    """Separated, two brokers: the group has consumed on broker-b only; messages then stored on
    broker-a count in its lag (they did not: describe listed broker-b's rows only)."""
    if len(cluster.brokers) < 2:
        pytest.skip("needs two brokers (the separated topology)")
    topic = cluster.create_topic(unique("t"), queues=4)
    group = cluster.create_group(unique("g"))
    raw.assert_drained(cluster.first_proxy, [cluster.brokers[1]], topic, group)  # consumes on broker-b only
    with producer(cluster.endpoints, topic) as p:
        send_all(p, [message(topic, f"m{i}".encode()) for i in range(8)])
    described = cluster.admin("group", "describe", group)
    on_a = [q for q in described["queues"] if q["broker"] == cluster.brokers[0]]
    assert on_a and sum(q["lag"] for q in on_a) > 0, described
    assert described["lag"] == 8, described
    with producer_and_consumer(cluster.endpoints, topic, group, FilterExpression()) as (_, c):
        assert len(receive_count(c, 8)) == 8


def test_topic_create_refuses_an_existing_topic_unless_update(cluster: Cluster, unique: Callable[[str], str]) -> None:
    topic = cluster.create_topic(unique("t"), queues=2)
    with pytest.raises(AdminError, match=r"PRECONDITION_FAILED: topic \S+ already exists \(2 queue\(s\) of normal"):
        cluster.admin("topic", "create", topic, "--queues", "4")
    assert sum(r["queues"] for r in cluster.admin("topic", "list") if r["topic"] == topic) == 2  # unchanged
    proc = cluster.admin_text("topic", "create", topic, "--queues", "4", "--type", "normal,fifo", "--update")
    assert f"topic {topic} updated: queues 2 -> 4, types normal -> normal,fifo" in proc
    assert sum(r["queues"] for r in cluster.admin("topic", "list") if r["topic"] == topic) == 4


def test_topic_permission_stops_writes_then_reads(cluster: Cluster, unique: Callable[[str], str]) -> None:
    topic = cluster.create_topic(unique("t"), queues=2)
    group = cluster.create_group(unique("g"))
    with producer_and_consumer(cluster.endpoints, topic, group) as (p, c):
        send_all(p, [message(topic, b"before")])
        made = cluster.admin("topic", "update", topic, "--perm", "r")
        assert {(b["before"], b["after"]) for b in made["brokers"]} == {("rw", "r")}
        with pytest.raises(Exception, match=r"40300, topic \S+ (has no writable queue|is not writable)"):
            send_all(p, [message(topic, b"refused")])
        assert [m.body for m in receive_count(c, 1)] == [b"before"]  # consumers still read
        cluster.admin("topic", "update", topic, "--perm", "rw")
        _eventually(lambda: _sent(p, message(topic, b"after")),
                    "a send once proxies and the client refreshed the route", CLIENT_ROUTE_WAIT_S)  # fmt: skip
        assert [m.body for m in receive_count(c, 1)] == [b"after"]
    with pytest.raises(AdminError, match="not on broker"):
        cluster.admin("topic", "update", topic, "--perm", "r", "--brokers", "nobody")


def test_drain_moves_writes_away_and_waits_for_consumers(cluster: Cluster, unique: Callable[[str], str]) -> None:
    if len(cluster.brokers) < 2:
        pytest.skip("needs two brokers (the separated topology)")
    drained, other = cluster.brokers
    topic = cluster.create_topic(unique("t"), queues=4)
    group = cluster.create_group(unique("g"))
    with producer(cluster.endpoints, topic) as p:
        send_all(p, [message(topic, f"old{i}".encode()) for i in range(8)])

    def stored() -> dict[str, int]:
        rows = cluster.admin("topic", "describe", topic)
        return {b: sum(r["max_offset"] for r in rows if r["broker"] == b) for b in cluster.brokers}

    before = stored()
    report = cluster.admin("broker", "drain", drained)
    assert {t["topic"]: t["after"] for t in report["topics"]}[topic] == "read"
    # The group was created before the sends: what it has not consumed on the drained broker is its backlog there.
    assert report["backlog"].get(group, 0) == before[drained] > 0
    with producer(cluster.endpoints, topic) as p:  # refused by the drained broker until proxies refresh (5 s)
        for i in range(6):
            _eventually(lambda i=i: _sent(p, message(topic, f"new{i}".encode())), "a send to the other broker")
    after = stored()
    assert after[drained] == before[drained] and after[other] == before[other] + 6
    with producer_and_consumer(cluster.endpoints, topic, group) as (_, c):
        receive_count(c, 14)  # everything, the drained broker's included
    done = cluster.admin("broker", "drain", drained)
    assert group not in done["backlog"]  # other tests' groups on this shared cluster may still have some
    undone = cluster.admin("broker", "undrain", drained)
    assert {t["topic"]: t["after"] for t in undone["topics"]}[topic] == "read_write"


def _admin_proc(cluster: Cluster, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SLUICE, "admin", "--namesrv", cluster.namesrv, *args], cwd=REPO_ROOT, input=stdin,
                          env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}, capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip


def test_message_send_list_and_tail_from_the_shell(cluster: Cluster, unique: Callable[[str], str]) -> None:
    topic = cluster.create_topic(unique("t"), queues=2)
    group = cluster.create_group(unique("g"))
    with producer_and_consumer(cluster.endpoints, topic, group) as (p, c):
        one = cluster.admin("message", "send", topic, "hello", "--tag", "T1", "--key", "k1", "--property", "a=b")
        lines = _admin_proc(cluster, "message", "send", topic, "--json", stdin="first\nsecond\n\nthird\n")
        assert lines.returncode == 0, lines.stderr
        sent = one + json.loads(lines.stdout)
        got = {m.message_id: m for m in receive_count(c, 4)}  # the official client receives them
        assert set(got) == {r["message_id"] for r in sent}
        hello = got[one[0]["message_id"]]
        assert (hello.body, hello.tag, hello.keys, hello.properties.get("a")) == (b"hello", "T1", {"k1"}, "b")
        assert sorted(m.body for m in got.values()) == [b"first", b"hello", b"second", b"third"]

        # Browse one queue from an offset: the same messages, no group touched.
        queue, broker = sent[0]["queue"], sent[0]["broker"]
        listed = cluster.admin("message", "list", topic, "--queue", str(queue), "--from-offset", "0",
                               "--broker", broker)  # fmt: skip
        assert one[0]["message_id"] in {m["message_id"] for m in listed}
        assert all(m["queue_id"] == queue for m in listed)

        # Tail from the start: everything stored so far, as JSON lines.
        tail = _admin_proc(cluster, "message", "tail", topic, "--from", "earliest", "--count", "4", "--for-s", "20",
                           "--json")  # fmt: skip
        assert tail.returncode == 0, tail.stderr
        assert {json.loads(line)["body_text"] for line in tail.stdout.splitlines()} == {
            "hello", "first", "second", "third",
        }  # fmt: skip

        # Tail what arrives: started first, then the official producer sends.
        argv = [*SLUICE, "admin", "--namesrv", cluster.namesrv, "message", "tail", topic, "--count", "2",
                "--for-s", "30"]  # fmt: skip
        follower = subprocess.Popen(argv, cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
        try:
            _eventually(lambda: follower.stdout is not None and follower.stdout.readline().startswith("BROKER"),
                        "tail printed its header")  # fmt: skip
            time.sleep(1.0)  # its start offsets are taken once the header is out; leave it a moment
            send_all(p, [message(topic, b"live-1"), message(topic, b"live-2")])
            out, err = follower.communicate(timeout=40)
        finally:
            if follower.poll() is None:
                follower.kill()
                follower.wait()
        assert follower.returncode == 0, err
        assert "live-1" in out and "live-2" in out and "2 message(s)" in out
        assert "hello" not in out  # it started at the end

        # Consume as the group: receive and ack (the group then has nothing left).
        eaten = _admin_proc(cluster, "message", "tail", topic, "--group", group, "--ack", "--count", "2",
                            "--for-s", "20", "--json")  # fmt: skip
        assert eaten.returncode == 0, eaten.stderr
        assert sorted(json.loads(line)["body_text"] for line in eaten.stdout.splitlines()) == ["live-1", "live-2"]
    assert cluster.admin("group", "describe", group)["lag"] == 0


def test_message_commands_refuse_bad_input(cluster: Cluster, unique: Callable[[str], str]) -> None:
    topic = cluster.create_topic(unique("t"), queues=2)
    fifo = cluster.create_topic(unique("f"), "fifo", queues=2)
    for args, wanted in [
        # A FIFO topic refuses a message without a group and the line says which flag to add.
        (["send", fifo, "x"], "accepts FIFO); send with --message-group MG"),
        (["send", topic, "x", "--property", "novalue"], "--property 'novalue': use KEY=VALUE"),
        (["send", topic, "--file", "/nonexistent/f"], "--file /nonexistent/f: No such file"),
        (["send", topic, "x", "--tag", "bad tag\u0001"], "ILLEGAL_MESSAGE_TAG"),
        (["list", topic, "--queue", "9", "--from-offset", "0"], "holds queue 9"),
        (["tail", topic, "--ack"], "--ack consumes as a group: give --group"),
        (["send", unique("nosuch"), "x"], "TOPIC_NOT_FOUND"),
    ]:
        proc = _admin_proc(cluster, "message", *args)
        assert proc.returncode in (1, 2) and wanted in proc.stderr and len(proc.stderr.splitlines()) == 1, (
            args, proc.stderr,
        )  # fmt: skip
