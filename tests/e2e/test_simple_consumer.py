"""SimpleConsumer: receive and ack, invisibility and redelivery, invisible-duration changes, tag and
SQL92 filters, FIFO order per message group. Merged and separated topologies."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from rocketmq import FilterExpression
from rocketmq.grpc_protocol import Code, FilterType
from rocketmq.v5.exception import BadRequestException

from tests.e2e.support import raw
from tests.e2e.support.clients import describe, message, producer_and_consumer, receive_count, send_all
from tests.e2e.support.cluster import Cluster

SHORT_INVISIBLE_S = 2


def test_unacked_message_comes_back_with_delivery_attempt_2(cluster: Cluster, unique: Callable[[str], str]) -> None:
    topic = cluster.create_topic(unique("t"))
    group = cluster.create_group(unique("g"))
    with producer_and_consumer(cluster.endpoints, topic, group) as (p, c):
        (message_id,) = send_all(p, [message(topic, b"dropped")])
        (first,) = receive_count(c, 1, ack=False, invisible_s=SHORT_INVISIBLE_S)
        # Not acked: it becomes visible again once its invisible duration is over.
        (again,) = receive_count(c, 1)
    assert (first.message_id, first.delivery_attempt) == (message_id, 1)
    assert (again.message_id, again.body, again.delivery_attempt) == (message_id, b"dropped", 2)
    assert again.receipt_handle != first.receipt_handle
    raw.assert_drained(cluster.first_proxy, cluster.brokers, topic, group)  # acked the second time: gone


def test_change_invisible_duration_gives_a_new_handle_for_the_ack(
    cluster: Cluster, unique: Callable[[str], str]
) -> None:
    topic = cluster.create_topic(unique("t"))
    group = cluster.create_group(unique("g"))
    with producer_and_consumer(cluster.endpoints, topic, group) as (p, c):
        (message_id,) = send_all(p, [message(topic, b"slow work")])
        (m,) = receive_count(c, 1, ack=False, invisible_s=SHORT_INVISIBLE_S)
        old_handle = m.receipt_handle
        c.change_invisible_duration(m, 30)  # the client stores the returned handle in the message
        new_handle = m.receipt_handle
        assert new_handle and new_handle != old_handle
        m.receipt_handle = old_handle
        with pytest.raises(BadRequestException) as superseded:
            c.ack(m)
        assert superseded.value.code == Code.INVALID_RECEIPT_HANDLE
        m.receipt_handle = new_handle
        c.ack(m)
    assert m.message_id == message_id
    # Acked: it does not come back, although the first invisible duration is long over.
    raw.assert_drained(cluster.first_proxy, cluster.brokers, topic, group)


def test_tag_filter_delivers_only_matching_tags(cluster: Cluster, unique: Callable[[str], str]) -> None:
    topic = cluster.create_topic(unique("t"))
    group = cluster.create_group(unique("g"))
    with producer_and_consumer(cluster.endpoints, topic, group, FilterExpression("TagA || TagB")) as (p, c):
        tags = ["TagA", "TagB", "TagC", "TagA", "TagC", None, "TagB", "TagAB"]
        ids = send_all(p, [message(topic, f"m{i}".encode(), tag=t) for i, t in enumerate(tags)])
        wanted = {i for i, t in zip(ids, tags, strict=True) if t in ("TagA", "TagB")}
        got = receive_count(c, len(wanted))
    assert sorted(m.message_id for m in got) == sorted(wanted), describe(got)
    assert {m.tag for m in got} == {"TagA", "TagB"}
    raw.assert_drained(cluster.first_proxy, cluster.brokers, topic, group, expression="TagA || TagB")


def test_sql92_filter_on_user_properties(cluster: Cluster, unique: Callable[[str], str]) -> None:
    topic = cluster.create_topic(unique("t"))
    group = cluster.create_group(unique("g"))
    sql = FilterExpression("a > 5 AND region = 'eu'", FilterType.SQL)
    with producer_and_consumer(cluster.endpoints, topic, group, sql) as (p, c):
        sent = [(a, region) for a in range(10) for region in ("eu", "us")]
        ids = send_all(p, [message(topic, f"{a}-{r}".encode(), properties={"a": str(a), "region": r})
                           for a, r in sent])  # fmt: skip
        unmarked = send_all(p, [message(topic, b"no properties")])  # a missing property is SQL unknown: no match
        wanted = {i for i, (a, r) in zip(ids, sent, strict=True) if a > 5 and r == "eu"}
        got = receive_count(c, len(wanted))
    assert sorted(m.message_id for m in got) == sorted(wanted), describe(got)
    assert unmarked[0] not in {m.message_id for m in got}
    raw.assert_drained(cluster.first_proxy, cluster.brokers, topic, group, filter_type=FilterType.SQL,
                       expression="a > 5 AND region = 'eu'")  # fmt: skip


def test_fifo_group_withholds_the_next_message_until_the_previous_is_acked(
    cluster: Cluster, unique: Callable[[str], str]
) -> None:
    topic = cluster.create_topic(unique("t"), "fifo")
    group = cluster.create_group(unique("g"), fifo=True)
    groups, per_group = ("alpha", "beta", "gamma"), 4
    order = [(g, n) for n in range(per_group) for g in groups]
    with producer_and_consumer(cluster.endpoints, topic, group) as (p, c):
        ids = send_all(p, [message(topic, f"{g}:{n}".encode(), group=g) for g, n in order])
        expected = {g: [i for i, (gg, _) in zip(ids, order, strict=True) if gg == g] for g in groups}
        consumed: dict[str, list[str]] = {g: [] for g in groups}
        for _ in range(per_group):
            # One message per message group is deliverable at a time: the head of each group.
            heads = receive_count(c, len(groups), ack=False)
            assert sorted(m.message_group for m in heads) == sorted(groups), describe(heads)
            # While they are in flight, nothing else of these groups comes out.
            raw.assert_drained(cluster.first_proxy, cluster.brokers, topic, group)
            for m in heads:
                consumed[m.message_group].append(m.message_id)
                c.ack(m)
    assert consumed == expected
    raw.assert_drained(cluster.first_proxy, cluster.brokers, topic, group)
