"""The operator's commands against real clusters with the official client producing and consuming:
`group reset-offset`, `client list`, and `group describe` counting queues a group never consumed.
Merged and separated topologies."""

from __future__ import annotations

import re
import time
from collections.abc import Callable

import pytest
from rocketmq import FilterExpression

from tests.e2e.support import raw
from tests.e2e.support.clients import message, producer, producer_and_consumer, receive_count, send_all
from tests.e2e.support.cluster import AdminError, Cluster

REPORT_WAIT_S = 20.0  # proxies report their clients every 5 s


def _eventually(check: Callable[[], object], what: str, timeout_s: float = REPORT_WAIT_S) -> object:
    deadline = time.monotonic() + timeout_s
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what}: not within {timeout_s} s")
        time.sleep(0.5)


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
