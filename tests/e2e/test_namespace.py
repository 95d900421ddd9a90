"""Namespaces with the official Python client (`ClientConfiguration(namespace=...)`): topic `t` of
namespace A is the cluster-wide topic `A%t` (created so with `sluice admin`); clients of namespace A
use it by its short name, clients of namespace B cannot see it. Merged and separated topologies."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest
from rocketmq import FilterExpression

from tests.e2e.support.clients import message, producer, receive_count, send_all, simple_consumer
from tests.e2e.support.cluster import Cluster


def test_namespace_isolates_topics(cluster: Cluster, unique: Callable[[str], str]) -> None:
    ns_a, ns_b = f"nsa{uuid.uuid4().hex[:6]}", f"nsb{uuid.uuid4().hex[:6]}"
    topic, group = "orders", "billing"
    cluster.create_topic(f"{ns_a}%{topic}")
    cluster.create_group(f"{ns_a}%{group}")
    with (
        producer(cluster.endpoints, topic, namespace=ns_a) as p,
        simple_consumer(cluster.endpoints, group, {topic: FilterExpression()}, namespace=ns_a) as c,
    ):
        ids = send_all(p, [message(topic, f"in {ns_a}".encode()) for _ in range(3)])
        got = receive_count(c, len(ids))
    assert sorted(m.message_id for m in got) == sorted(ids)
    assert {(m.topic, m.namespace) for m in got} == {(topic, ns_a)}  # the short name, as the client knows it

    with producer(cluster.endpoints, namespace=ns_b) as other, pytest.raises(Exception, match=topic):
        other.send(message(topic, f"from {ns_b}".encode()))
