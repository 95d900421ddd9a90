"""`sluice up` as a developer runs it: topics and consumer groups are created on first use.

The shared merged cluster of the other tests runs with `--no-auto-create`, so that both topologies
answer alike (an unknown topic is TOPIC_NOT_FOUND); this test starts its own default `sluice up`
(no `--shards` either: one shard per core, two on the development machine).
With auto-create on, a topic of another namespace is not "not found" either: it is created.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from rocketmq import FilterExpression

from tests.e2e.support import raw
from tests.e2e.support.clients import message, producer, receive_count, send_all, simple_consumer
from tests.e2e.support.cluster import start_merged


def test_topics_and_groups_are_created_on_first_use(tmp_path: Path, unique: Callable[[str], str]) -> None:
    cluster = start_merged(tmp_path / "up", auto_create=True, shards=None)  # no --shards: the default
    try:
        topic, group = unique("t"), unique("g")
        with simple_consumer(cluster.endpoints, group, {topic: FilterExpression()}) as c:
            assert c.receive(16, 15) == []  # creates the topic and the group (new groups start at the end)
            with producer(cluster.endpoints, topic) as p:
                ids = send_all(p, [message(topic, b"plain"), message(topic, b"ordered", group="mg")])
            got = receive_count(c, len(ids))
        assert sorted(m.message_id for m in got) == sorted(ids)  # auto-created topics accept every type
        listed = {row["topic"] for row in cluster.admin("topic", "list")}
        assert topic in listed
        assert group in {row["group"] for row in cluster.admin("group", "list")}
        with raw.stub(cluster.first_proxy) as s:
            route = raw.query_route(s, topic, namespace="elsewhere", metadata=raw.headers(namespace="elsewhere"))
        assert raw.code_name(route.status.code) == "OK"
        assert f"elsewhere%{topic}" in {row["topic"] for row in cluster.admin("topic", "list")}
    finally:
        problems = cluster.stop()
        assert not problems, "\n".join(problems)
