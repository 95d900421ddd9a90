"""Separated topology, two proxies: any proxy serves a message another proxy delivered, and when one
proxy dies mid-consumption the client carries on through the other, every message consumed at
least once.

Today a proxy advertises only itself in routes, so the Python client (given both proxies as its
access point, pick-first) sends everything to one proxy until its next route refresh — 10 s after
startup, then every 30 s — reaches the other proxy through the access point. Until then receives
fail; the test keeps receiving, bounded by RECOVERY_TIMEOUT_S. Messages that were in flight on the
dead proxy are not lost: their acks fail, and they come back once their invisible duration ends.
The failover test starts its own cluster: it kills a proxy.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from google.protobuf.duration_pb2 import Duration
from rocketmq import FilterExpression
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as spb

from tests.e2e.support import raw
from tests.e2e.support.clients import message, producer, receive_until, send_all, simple_consumer
from tests.e2e.support.cluster import Cluster, start_separated

MESSAGES = 60
RECOVERY_TIMEOUT_S = 90.0
IN_FLIGHT_INVISIBLE_S = 5


@pytest.mark.slow
def test_consumption_continues_through_the_other_proxy(tmp_path: Path, unique: Callable[[str], str]) -> None:
    cluster = start_separated(tmp_path / "cluster")
    try:
        topic = cluster.create_topic(unique("t"), queues=4)
        group = cluster.create_group(unique("g"))
        with producer(cluster.endpoints, topic) as p:
            ids = send_all(p, [message(topic, f"failover-{i}".encode()) for i in range(MESSAGES)])
        acked: Counter[str] = Counter()
        with simple_consumer(cluster.endpoints, group, {topic: FilterExpression()}, await_duration_s=1) as c:
            before = receive_until(c, lambda got: len(got) >= MESSAGES // 4)
            acked.update(m.message_id for m in before)
            (used,) = {str(m.endpoints) for m in before}  # pick-first: one proxy serves this client
            (survivor,) = set(cluster.proxies) - {used}
            in_flight = receive_until(c, lambda got: bool(got), ack=False, invisible_s=IN_FLIGHT_INVISIBLE_S)

            cluster.kill(cluster.proxy_process(used))
            for m in in_flight:  # its proxy is gone: the ack cannot get through
                with pytest.raises(Exception):  # noqa: B017 - any transport error will do
                    c.ack(m)

            failures, after = 0, []
            deadline = time.monotonic() + RECOVERY_TIMEOUT_S
            while set(ids) - set(acked):
                assert time.monotonic() < deadline, (
                    f"{len(set(ids) - set(acked))} of {MESSAGES} messages not consumed {RECOVERY_TIMEOUT_S} s after "
                    f"the proxy died ({failures} failed receives)"
                )
                try:
                    received = c.receive(16, 15)
                except Exception:  # the route still points at the dead proxy
                    failures += 1
                    time.sleep(0.5)
                    continue
                for m in received:
                    c.ack(m)
                    acked[m.message_id] += 1
                    after.append(m)
        assert set(acked) == set(ids)
        assert {str(m.endpoints) for m in after} == {survivor}
        assert {m.message_id for m in in_flight} <= {m.message_id for m in after}  # redelivered, not lost
    finally:
        problems = cluster.stop()
        assert not problems, "\n".join(problems)


def test_a_message_delivered_by_one_proxy_is_settled_through_the_other(
    cluster: Cluster, unique: Callable[[str], str]
) -> None:
    if len(cluster.proxies) < 2:
        pytest.skip("the merged topology has one proxy")
    topic = cluster.create_topic(unique("t"), queues=2)
    group = cluster.create_group(unique("g"))
    first, second = cluster.proxies[:2]
    with raw.stub(first) as s1, raw.stub(second) as s2:
        for body in (b"ack me elsewhere", b"delay me elsewhere"):
            assert raw.code_name(raw.send(s1, raw.message(topic, body)).status.code) == "OK"
        delivered: list[pb.Message] = []
        for broker in cluster.brokers * 3:
            delivered += raw.receive(s1, raw.receive_request(topic, group, broker=broker))[1]
            if len(delivered) == 2:
                break
        by_body = {m.body: m for m in delivered}
        assert set(by_body) == {b"ack me elsewhere", b"delay me elsewhere"}

        acked = by_body[b"ack me elsewhere"]
        entry = spb.AckMessageEntry(message_id=acked.system_properties.message_id,
                                        receipt_handle=acked.system_properties.receipt_handle)  # fmt: skip
        ack = s2.AckMessage(spb.AckMessageRequest(group=raw.resource(group), topic=raw.resource(topic),
                                                      entries=[entry]),
                            metadata=raw.headers(), timeout=raw.RPC_TIMEOUT_S)  # fmt: skip
        assert raw.code_name(ack.status.code) == "OK"

        delayed = by_body[b"delay me elsewhere"]
        change = s2.ChangeInvisibleDuration(
            spb.ChangeInvisibleDurationRequest(group=raw.resource(group), topic=raw.resource(topic),
                                                   receipt_handle=delayed.system_properties.receipt_handle,
                                                   invisible_duration=Duration(seconds=1),
                                                   message_id=delayed.system_properties.message_id),
            metadata=raw.headers(), timeout=raw.RPC_TIMEOUT_S,
        )  # fmt: skip
        assert raw.code_name(change.status.code) == "OK"
        again: list[pb.Message] = []
        for broker in cluster.brokers * 5:  # visible again after a second, now through the second proxy
            again = raw.receive(s2, raw.receive_request(topic, group, broker=broker, long_poll_s=2))[1]
            if again:
                break
        assert [(m.system_properties.message_id, m.system_properties.delivery_attempt) for m in again] == [
            (delayed.system_properties.message_id, 2)
        ]
