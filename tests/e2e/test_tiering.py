"""Tiered storage seen by the official Python client, merged and separated topologies.

A moto S3 server runs as a child process on loopback; the brokers tier into it (flags
`--s3-endpoint --s3-bucket --s3-prefix --tier-min-age`, credentials from the standard AWS environment
variables, path-style addressing and small CommitLog segments from the `--config` file). Messages
produced through the client are tiered with `sluice admin tier upload-now`, their local copies dropped
with `sluice admin tier evict-local`; a new consumer group from the start then receives every one of
them from S3, identical and in order, and `sluice admin message get|find` finds them by id and key.

The topic has one queue (in the separated topology on broker-a), so "in order" is the send order.
With S3 hung (the moto process SIGSTOPped), producing and consuming hot data works, and an upload
that needs S3 fails with a retriable error rather than hanging; once S3 answers again it goes up.
"""

from __future__ import annotations

import base64
import re
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from rocketmq import FilterExpression

from tests.e2e.support.clients import (
    message,
    producer,
    producer_and_consumer,
    receive_count,
    send_all,
    simple_consumer,
)
from tests.e2e.support.cluster import AdminError, Cluster, start_merged, start_separated
from tests.e2e.support.moto import Moto, tiering_flags

MESSAGES = 120


@pytest.fixture(scope="module", params=["merged", "separated"])
def tiered(request: pytest.FixtureRequest, moto: Moto, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    kind: str = request.param
    root = tmp_path_factory.mktemp(f"tiered-{kind}")
    flags = tiering_flags(moto, root, f"sluice-e2e-{kind}-{uuid.uuid4().hex[:8]}", f"e2e-{kind}")
    started = start_merged(root, extra_args=flags) if kind == "merged" else start_separated(root, broker_args=flags)
    try:
        yield started
    finally:
        problems = started.stop()
        assert not problems, "cluster teardown:\n" + "\n".join(problems)


def _body(i: int) -> bytes:
    return (f"message {i}: the quick brown fox jumps over the lazy dog; " * 6).encode()


def _console_page(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as answer:
        text: str = answer.read().decode()
        return text


def _topic_row(rows: list[dict[str, Any]], topic: str) -> dict[str, Any]:
    (row,) = [r for broker in rows for r in broker["topics"] if r["topic"] == topic]
    return row


def test_replay_from_the_start_reads_tiered_messages(tiered: Cluster, unique: Callable[[str], str]) -> None:
    topic = unique("tiered")
    tiered.admin("topic", "create", topic, "--queues", "1", "--brokers", tiered.brokers[0])
    group = tiered.create_group(unique("replay"), consume_from="earliest")
    sent = [
        message(topic, _body(i), tag="even" if i % 2 == 0 else "odd", keys=[f"key-{i}"],
                properties={"seq": str(i), "lang": "ünïcode"})
        for i in range(MESSAGES)
    ]  # fmt: skip
    with producer(tiered.endpoints, topic) as p:
        ids = send_all(p, sent)

    (uploaded,) = tiered.admin("tier", "upload-now", topic)
    assert uploaded["lag_messages"] == 0 and uploaded["objects"] >= 2
    assert [(q["tiered_min"], q["tiered_end"]) for q in uploaded["queues"]] == [(0, MESSAGES)]
    (evicted,) = tiered.admin("tier", "evict-local", topic)
    assert evicted["messages"] == MESSAGES and evicted["segments"] >= 1
    assert evicted["freed_bytes"] > 0 and evicted["freed"].endswith("B")  # says what disk it freed
    row = _topic_row(tiered.admin("tier", "status"), topic)
    assert [(q["local_min"], q["local_max"]) for q in row["queues"]] == [(MESSAGES, MESSAGES)]
    if tiered.console:  # the merged topology's console says where the messages are now
        page = _console_page(tiered.console + f"/topics/{topic}")
        counts = {field: re.search(rf'id="{field}">([^<]*)<', page) for field in ("backlog", "local", "only-in-s3")}
        assert {k: m and m[1] for k, m in counts.items()} == {"backlog": str(MESSAGES), "local": "0",
                                                              "only-in-s3": str(MESSAGES)}  # fmt: skip
        assert f"{MESSAGES} (offsets 0-{MESSAGES - 1})" in page  # the S3 range, readable

    with simple_consumer(tiered.endpoints, group, {topic: FilterExpression()}) as c:
        got = receive_count(c, MESSAGES)
    assert [m.message_id for m in got] == ids
    for m, want in zip(got, sent, strict=True):
        assert m.body == want.body
        assert m.tag == want.tag
        assert set(m.keys) == set(want.keys)
        assert m.properties == want.properties

    # Lookups by id and key of messages whose CommitLog segment is gone.
    (found,) = tiered.admin("message", "get", "--topic", topic, "--id", ids[3])
    assert base64.b64decode(found["body_base64"]) == _body(3) and found["queue_offset"] == 3
    by_key = tiered.admin("message", "find", "--topic", topic, "--key", "key-5")
    assert [(m["message_id"], m["queue_offset"]) for m in by_key] == [(ids[5], 5)]


def test_tier_status_lists_every_broker(tiered: Cluster) -> None:
    status = tiered.admin("tier", "status")
    assert sorted(b["broker"] for b in status) == sorted(tiered.brokers)
    assert all(b["enabled"] and "sluice-e2e-" in b["store"] for b in status)


def test_hung_s3_leaves_hot_traffic_alone(tiered: Cluster, moto: Moto, unique: Callable[[str], str]) -> None:
    topic = unique("hot")
    tiered.admin("topic", "create", topic, "--queues", "1", "--brokers", tiered.brokers[0])
    group = tiered.create_group(unique("live"), consume_from="earliest")
    with moto.hung():
        with producer_and_consumer(tiered.endpoints, topic, group) as (p, c):
            ids = send_all(p, [message(topic, _body(i), keys=[f"hot-{i}"]) for i in range(20)])
            got = receive_count(c, 20)
        assert [m.message_id for m in got] == ids
        # An upload that needs S3 fails with a clear, retriable error instead of hanging.
        with pytest.raises(AdminError, match="HA_NOT_AVAILABLE"):
            tiered.admin("tier", "upload-now", topic, "--wait-s", "2")
    (uploaded,) = tiered.admin("tier", "upload-now", topic)
    assert uploaded["lag_messages"] == 0 and [q["tiered_end"] for q in uploaded["queues"]] == [20]


def test_replay_while_s3_hangs_fails_retriably_then_recovers(
    tiered: Cluster, moto: Moto, unique: Callable[[str], str]
) -> None:
    topic = unique("coldhung")
    tiered.admin("topic", "create", topic, "--queues", "1", "--brokers", tiered.brokers[0])
    with producer(tiered.endpoints, topic) as p:
        ids = send_all(p, [message(topic, _body(i)) for i in range(30)])
    tiered.admin("tier", "upload-now", topic)
    tiered.admin("tier", "evict-local", topic)
    group = tiered.create_group(unique("replay"), consume_from="earliest")
    # A long poll of 5 s gives the receive a deadline of 8 s: room for the broker's 2 s S3 timeout.
    with simple_consumer(tiered.endpoints, group, {topic: FilterExpression()}, await_duration_s=5) as c:
        with moto.hung():
            started = time.monotonic()
            with pytest.raises(Exception, match=r"HA_NOT_AVAILABLE|retry later") as err:
                c.receive(16, 60)
            assert time.monotonic() - started < 30.0, "a read that needs S3 must fail, not hang"
            assert "tiered" in str(err.value) or "S3" in str(err.value)
        got = receive_count(c, 30)
    assert [m.message_id for m in got] == ids
