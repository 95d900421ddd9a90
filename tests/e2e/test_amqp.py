"""AMQP 0-9-1 end to end: RabbitMQ's own clients (pika, aio-pika), unchanged, against real Sluice
processes in both topologies (the shared `cluster` fixture serves AMQP on free ports).

The RabbitMQ tutorials (hello world, work queues, publish/subscribe, routing, topics, publisher
confirms), basic.get, requeue on close, and RabbitMQ's reply codes for what clients get wrong;
raw frames for what no client library sends (garbage, wrong frame types), after which the server
answers with a connection close and keeps serving. docs/amqp.md describes the gateway.
"""

from __future__ import annotations

import asyncio
import collections
import json
import operator
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import aio_pika
import pika
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from pamqp import commands, frame, heartbeat
from pamqp import commands as pamqp_commands
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.support import amqp_fuzz
from tests.e2e.support.amqp import WAIT_S, RawClient, connect, drain, endpoints, params
from tests.e2e.support.cluster import Cluster, start_merged, start_separated

FUZZ_EXAMPLES = 60  # connections per topology


@pytest.fixture(scope="module")
def own_merged(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A merged cluster of this module's own, for the tests that crash it or shorten its leases
    (1.5 s leases, a 6 s consumer timeout)."""
    root = tmp_path_factory.mktemp("amqp-own")
    config = root / "sluice.toml"
    config.write_text("[proxy.amqp]\ndelivery_lease_ms = 1500\nconsumer_timeout_ms = 6000\n")
    started = start_merged(root / "cluster", amqp=True, extra_args=["--config", str(config)])
    try:
        yield started
    finally:
        problems = started.stop()
        assert not problems, "\n".join(problems)


def _ready_eventually(ch: pika.adapters.blocking_connection.BlockingChannel, queue: str, want: int) -> int:
    """The queue's ready count once it is `want` (or the last one seen after WAIT_S)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        count = int(ch.queue_declare(queue=queue, passive=True).method.message_count)
        if count == want or time.monotonic() > deadline:
            return count
        time.sleep(0.05)


def test_hello_world_keeps_properties(cluster: Cluster, unique: Callable[[str], str]) -> None:
    queue = unique("hello")
    props = pika.BasicProperties(content_type="text/plain", delivery_mode=2, correlation_id="c-1", reply_to="back",
                                 headers={"n": 7, "s": "x", "nested": {"k": "v"}}, timestamp=1_700_000_000,
                                 message_id="m-1", type="greeting", app_id="tests", priority=3)  # fmt: skip
    with connect(endpoints(cluster)[0]) as conn:
        ch = conn.channel()
        ch.queue_declare(queue=queue)
        ch.basic_publish(exchange="", routing_key=queue, body=b"Hello World!", properties=props)
    with connect(endpoints(cluster)[-1]) as conn:
        ch = conn.channel()
        [(method, got, body)] = drain(ch, queue, 1)
    assert body == b"Hello World!"
    assert (method.exchange, method.routing_key, method.redelivered) == ("", queue, False)
    for field in ("content_type", "delivery_mode", "correlation_id", "reply_to", "headers", "timestamp",
                  "message_id", "type", "app_id", "priority"):  # fmt: skip
        assert getattr(got, field) == getattr(props, field), field


def test_work_queue_prefetch_and_acks(cluster: Cluster, unique: Callable[[str], str]) -> None:
    queue = unique("tasks")
    first, last = endpoints(cluster)[0], endpoints(cluster)[-1]
    with connect(first) as producer, connect(last) as slow, connect(first) as fast:
        pch = producer.channel()
        pch.queue_declare(queue=queue, durable=True)
        pch.confirm_delivery()
        for i in range(10):
            pch.basic_publish("", queue, f"task {i}".encode(), pika.BasicProperties(delivery_mode=2))
        sch = slow.channel()
        sch.basic_qos(prefetch_count=1)
        held = []
        for method, _, body in sch.consume(queue, inactivity_timeout=WAIT_S):
            held.append((method, body))  # not acknowledged: with prefetch 1 nothing more comes here
            break
        fch = fast.channel()
        fch.basic_qos(prefetch_count=2)
        done = [body for _, _, body in drain(fch, queue, 9)]
        assert len(done) == 9 and held[0][1] not in done
        assert _ready_eventually(pch, queue, 0) == 0  # one unacked, none ready (acks carry no reply)
        sch.basic_ack(held[0][0].delivery_tag)
        sch.cancel()
        assert sorted([*done, held[0][1]]) == sorted(f"task {i}".encode() for i in range(10))


def test_publish_subscribe_fanout(cluster: Cluster, unique: Callable[[str], str]) -> None:
    exchange = unique("logs")
    with connect(endpoints(cluster)[0]) as conn:
        ch = conn.channel()
        ch.exchange_declare(exchange=exchange, exchange_type="fanout")
        queues = [ch.queue_declare(queue="", exclusive=True).method.queue for _ in range(2)]
        assert all(q.startswith("amq.gen-") for q in queues)
        for q in queues:
            ch.queue_bind(exchange=exchange, queue=q)
        for i in range(3):
            ch.basic_publish(exchange=exchange, routing_key="", body=f"log {i}".encode())
        for q in queues:
            assert [b for _, _, b in drain(ch, q, 3)] == [b"log 0", b"log 1", b"log 2"]
        ch.exchange_delete(exchange)


def test_routing_direct(cluster: Cluster, unique: Callable[[str], str]) -> None:
    exchange = unique("direct-logs")
    with connect(endpoints(cluster)[0]) as conn:
        ch = conn.channel()
        ch.exchange_declare(exchange=exchange, exchange_type="direct")
        errors = ch.queue_declare(queue="", exclusive=True).method.queue
        everything = ch.queue_declare(queue="", exclusive=True).method.queue
        ch.queue_bind(queue=errors, exchange=exchange, routing_key="error")
        for severity in ("info", "warning", "error"):
            ch.queue_bind(queue=everything, exchange=exchange, routing_key=severity)
        for severity in ("info", "error", "debug", "warning"):
            ch.basic_publish(exchange=exchange, routing_key=severity, body=severity.encode())
        assert [b for _, _, b in drain(ch, errors, 1)] == [b"error"]
        assert [(m.routing_key, b) for m, _, b in drain(ch, everything, 3)] == [
            ("info", b"info"), ("error", b"error"), ("warning", b"warning")]  # fmt: skip
        ch.queue_unbind(queue=errors, exchange=exchange, routing_key="error")
        ch.basic_publish(exchange=exchange, routing_key="error", body=b"after unbind")
        assert [b for _, _, b in drain(ch, everything, 1)] == [b"after unbind"]
        assert _ready_eventually(ch, errors, 0) == 0


def test_topics_with_aio_pika_across_proxies(cluster: Cluster, unique: Callable[[str], str]) -> None:
    exchange = unique("topic-logs")
    first, last = endpoints(cluster)[0], endpoints(cluster)[-1]

    async def main() -> dict[str, list[bytes]]:
        consumer = await aio_pika.connect(f"amqp://guest:guest@{first}/")
        producer = await aio_pika.connect(f"amqp://guest:guest@{last}/")
        async with consumer, producer:
            cch = await consumer.channel()
            ex = await cch.declare_exchange(exchange, aio_pika.ExchangeType.TOPIC)
            patterns = {"kern.*": None, "*.critical": None, "#": None, "a.#.z": None}
            queues = {}
            for pattern in patterns:
                q = await cch.declare_queue(exclusive=True)
                await q.bind(ex, pattern)
                queues[pattern] = q
            pch = await producer.channel(publisher_confirms=True)
            pex = await pch.get_exchange(exchange)
            for key in ("kern.critical", "kern.info", "app.critical", "a.z", "a.b.c.z", "a.b"):
                await pex.publish(aio_pika.Message(body=key.encode()), routing_key=key)
            got: dict[str, list[bytes]] = {}
            for pattern, q in queues.items():
                got[pattern] = []
                while (m := await q.get(fail=False, timeout=5)) is not None:
                    got[pattern].append(m.body)
                    await m.ack()
            return got

    got = asyncio.run(main())
    assert got == {
        "kern.*": [b"kern.critical", b"kern.info"],
        "*.critical": [b"kern.critical", b"app.critical"],
        "#": [b"kern.critical", b"kern.info", b"app.critical", b"a.z", b"a.b.c.z", b"a.b"],
        "a.#.z": [b"a.z", b"a.b.c.z"],
    }


def test_headers_exchange_and_exchange_to_exchange_bindings(cluster: Cluster, unique: Callable[[str], str]) -> None:
    front, docs = unique("front"), unique("docs")
    with connect(endpoints(cluster)[0]) as conn:
        ch = conn.channel()
        ch.exchange_declare(front, "fanout")
        ch.exchange_declare(docs, "headers")
        ch.exchange_bind(destination=docs, source=front)
        pdf = ch.queue_declare("", exclusive=True).method.queue
        either = ch.queue_declare("", exclusive=True).method.queue
        ch.queue_bind(pdf, docs, arguments={"x-match": "all", "format": "pdf", "type": "report"})
        ch.queue_bind(either, docs, arguments={"x-match": "any", "format": "zip", "type": "report"})
        ch.queue_bind(either, "amq.headers", arguments={"urgent": True})
        ch.confirm_delivery()
        for headers in ({"format": "pdf", "type": "report"}, {"format": "zip"}, {"format": "pdf"}):
            ch.basic_publish(front, "", json_bytes(headers), pika.BasicProperties(headers=headers))
        ch.basic_publish("amq.headers", "", b"urgent", pika.BasicProperties(headers={"urgent": True}))
        assert [b for _, _, b in drain(ch, pdf, 1)] == [json_bytes({"format": "pdf", "type": "report"})]
        assert [b for _, _, b in drain(ch, either, 3)] == [
            json_bytes({"format": "pdf", "type": "report"}), json_bytes({"format": "zip"}), b"urgent"]  # fmt: skip
        ch.exchange_unbind(destination=docs, source=front)
        with pytest.raises(pika.exceptions.UnroutableError):
            ch.basic_publish(front, "", b"nowhere now", pika.BasicProperties(headers={"format": "zip"}), mandatory=True)
        ch.exchange_delete(docs)
        ch.exchange_delete(front)


def _queue_metrics(cluster: Cluster, vhost: str, queue: str) -> dict[str, float]:
    """The `sluice_amqp_queue_*` samples of one queue over every process and worker: counters and
    consumers summed, ready and unacked their max (every proxy reads them from the broker)."""
    got: dict[str, float] = {}
    for address in cluster.ops.values():
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=WAIT_S) as answer:
            text = answer.read().decode()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = (sample.labels.get("vhost"), sample.labels.get("queue"))  # and a worker's `worker`
                if sample.name.startswith("sluice_amqp_queue_") and labels == (vhost, queue):
                    name = sample.name.removeprefix("sluice_amqp_queue_")
                    merged = max if name.endswith("_messages") else operator.add
                    got[name] = merged(got[name], sample.value) if name in got else sample.value
    return got


def _metrics_eventually(cluster: Cluster, queue: str, want: dict[str, float]) -> dict[str, float]:
    """The queue's metrics once they include `want` (or the last seen after WAIT_S): the depth
    gauges show what the previous scrape asked the broker for."""
    deadline = time.monotonic() + WAIT_S
    while True:
        got = _queue_metrics(cluster, "/", queue)
        if want.items() <= got.items() or time.monotonic() > deadline:
            return got
        time.sleep(0.1)


def test_per_queue_metrics(cluster: Cluster, unique: Callable[[str], str]) -> None:
    queue = unique("metrics-q")
    with connect(endpoints(cluster)[0]) as conn:
        ch = conn.channel()
        ch.queue_declare(queue)
        ch.confirm_delivery()
        for _ in range(3):
            ch.basic_publish("", queue, b"x")
        method, _, _ = ch.basic_get(queue)
        want = {"ready_messages": 2.0, "unacked_messages": 1.0, "consumers": 0.0, "published_total": 3.0,
                "delivered_total": 1.0, "acked_total": 0.0}  # fmt: skip
        assert _metrics_eventually(cluster, queue, want) == want
        ch.basic_ack(method.delivery_tag)
        ch.basic_qos(prefetch_count=1)
        ch.basic_consume(queue, lambda *_: None)
        conn.process_data_events(time_limit=0.5)
        want = {"ready_messages": 1.0, "unacked_messages": 1.0, "consumers": 1.0, "published_total": 3.0,
                "delivered_total": 2.0, "acked_total": 1.0}  # fmt: skip
        assert _metrics_eventually(cluster, queue, want) == want
        ch.queue_delete(queue)


def test_admin_lists_connections_and_channels(cluster: Cluster, unique: Callable[[str], str]) -> None:
    queue = unique("conn-q")
    params_ = params(endpoints(cluster)[-1])
    params_.client_properties = {"product": "sluice-e2e", "version": "7.7"}
    with pika.BlockingConnection(params_) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare(queue, exclusive=True)
        ch.basic_publish("", queue, b"x")
        ch.basic_qos(prefetch_count=5)
        ch.basic_consume(queue, lambda *_: None)
        tx = conn.channel()
        tx.tx_select()
        conn.process_data_events(time_limit=0.3)
        # Proxies report every few seconds: a report taken between the two channels' opening lists
        # the connection with one channel, the next one with both.
        deadline = time.monotonic() + WAIT_S
        mine: list[dict[str, object]] = []
        while not (mine and mine[0]["channels"] == 2) and time.monotonic() < deadline:
            time.sleep(0.5)
            mine = [c for c in cluster.admin("amqp", "connections", "--vhost", "/") if c["client"] == "sluice-e2e 7.7"]
        assert len(mine) == 1 and mine[0]["user"] == "guest" and mine[0]["channels"] == 2, mine
        channels = [c for c in cluster.admin("amqp", "channels") if c["connection"] == mine[0]["connection"]]
        by_number = {c["channel"]: c for c in channels}
        assert set(by_number) == {ch.channel_number, tx.channel_number}
        assert {k: by_number[ch.channel_number][k] for k in ("consumers", "unacked", "prefetch", "confirm",
                                                             "transactional")} == {
            "consumers": 1, "unacked": 1, "prefetch": 5, "confirm": True, "transactional": False}  # fmt: skip
        assert by_number[tx.channel_number]["transactional"] is True
        assert mine[0]["connection"] in cluster.admin_text("amqp", "channels")
        assert cluster.admin("amqp", "connections", "--vhost", "no-such-vhost") == []


def _exists(conn: pika.BlockingConnection, queue: str) -> bool:
    try:
        conn.channel().queue_declare(queue, passive=True)
    except pika.exceptions.ChannelClosedByBroker as exc:
        assert exc.reply_code == 404, exc
        return False
    return True


def test_x_expires_deletes_an_unused_queue_only(cluster: Cluster, unique: Callable[[str], str]) -> None:
    unused, consumed = unique("expires-unused"), unique("expires-consumed")
    args = {"x-expires": 1500}
    with connect(endpoints(cluster)[0]) as conn, connect(endpoints(cluster)[-1]) as other:
        ch = conn.channel()
        ch.queue_declare(unused, arguments=args)
        ch.confirm_delivery()
        ch.basic_publish("", unused, b"kept until expiry")
        och = other.channel()  # a consumer on another proxy keeps its queue in use
        och.queue_declare(consumed, arguments=args)
        och.basic_consume(consumed, lambda *_: None)
        deadline = time.monotonic() + WAIT_S
        while _exists(conn, unused) and time.monotonic() < deadline:
            other.process_data_events(time_limit=0.2)
        assert not _exists(conn, unused), "a queue unused for its x-expires is deleted (messages and all)"
        for _ in range(10):  # 2 s more than its x-expires, with a consumer all along
            other.process_data_events(time_limit=0.2)
        assert _exists(conn, consumed)
        assert unused not in {q["name"] for q in cluster.admin("amqp", "queues")}
        och.queue_delete(consumed)


def json_bytes(value: object) -> bytes:
    return json.dumps(value, sort_keys=True).encode()


def test_admin_lists_the_amqp_metadata(cluster: Cluster, unique: Callable[[str], str]) -> None:
    exchange, queue = unique("admin-x"), unique("admin-q")
    with connect(endpoints(cluster)[0]) as conn:
        ch = conn.channel()
        ch.exchange_declare(exchange, "topic")
        ch.queue_declare(queue, durable=True)
        ch.queue_bind(queue, exchange, "a.#")
        ch.confirm_delivery()
        for i in range(3):
            ch.basic_publish(exchange, f"a.{i}", b"x")
        method, _, _ = ch.basic_get(queue)  # one unacked while the admin looks
        queues = {q["name"]: q for q in cluster.admin("amqp", "queues", "--vhost", "/")}
        assert (queues[queue]["ready"], queues[queue]["unacked"], queues[queue]["durable"]) == (2, 1, True)
        exchanges = {e["name"]: e["type"] for e in cluster.admin("amqp", "exchanges")}
        assert exchanges[exchange] == "topic" and exchanges["amq.headers"] == "headers"
        bindings = cluster.admin("amqp", "bindings")
        assert {"vhost": "/", "source": exchange, "destination": queue, "destination_type": "queue",
                "routing_key": "a.#", "arguments": {}} in bindings  # fmt: skip
        assert queue in cluster.admin_text("amqp", "queues")
        ch.basic_ack(method.delivery_tag)
        ch.queue_delete(queue)
        ch.exchange_delete(exchange)


def test_ttl_dead_letters_and_the_delivery_limit(cluster: Cluster, unique: Callable[[str], str]) -> None:
    dlx, dead = unique("dlx"), unique("dead")
    ttl, plain, limited = unique("ttl"), unique("plain"), unique("limited")
    to_dlx = {"x-dead-letter-exchange": dlx, "x-dead-letter-routing-key": "dead"}
    with connect(endpoints(cluster)[0]) as conn:
        ch = conn.channel()
        ch.exchange_declare(dlx, "direct")
        ch.queue_declare(dead, exclusive=True)
        ch.queue_bind(dead, dlx, "dead")
        ch.queue_declare(ttl, arguments={"x-message-ttl": 100, **to_dlx})
        ch.queue_declare(plain, arguments=to_dlx)
        ch.queue_declare(limited, arguments={"x-queue-type": "quorum", "x-delivery-limit": 1, **to_dlx})
        ch.confirm_delivery()
        ch.basic_publish("", ttl, b"queue ttl", pika.BasicProperties(headers={"k": "v"}))
        ch.basic_publish("", plain, b"message ttl", pika.BasicProperties(expiration="100"))
        ch.basic_publish("", plain, b"rejected")
        ch.basic_publish("", limited, b"redelivered too often")
        time.sleep(0.3)  # both TTLs (100 ms) pass: a pop meets the messages expired
        assert ch.basic_get(ttl) == (None, None, None)
        method, _, body = ch.basic_get(plain)  # the expired one is dead-lettered, the next one answers
        assert body == b"rejected"
        ch.basic_reject(method.delivery_tag, requeue=False)
        for _ in range(2):  # delivered twice (the limit allows one return), then dead-lettered
            method, _, body = ch.basic_get(limited)
            assert body == b"redelivered too often"
            ch.basic_nack(method.delivery_tag, requeue=True)
        assert ch.basic_get(limited) == (None, None, None)
        got = {body: props for _, props, body in drain(ch, dead, 4)}
        assert set(got) == {b"queue ttl", b"message ttl", b"rejected", b"redelivered too often"}
        for body, queue, reason in ((b"queue ttl", ttl, "expired"), (b"message ttl", plain, "expired"),
                                    (b"rejected", plain, "rejected"), (b"redelivered too often", limited,
                                                                        "delivery_limit")):  # fmt: skip
            death = got[body].headers["x-death"][0]
            assert (death["queue"], death["reason"], death["count"], death["exchange"]) == (queue, reason, 1, "")
            assert got[body].headers["x-first-death-reason"] == reason
            assert got[body].expiration is None
        assert got[b"queue ttl"].headers["k"] == "v"
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as bad_arg:
            ch.queue_declare(unique("bad"), arguments={"x-message-ttl": -1})
        assert bad_arg.value.reply_code == 406 and "invalid arg 'x-message-ttl'" in bad_arg.value.reply_text


def test_transactions_commit_and_roll_back(cluster: Cluster, unique: Callable[[str], str]) -> None:
    queue = unique("tx")
    with connect(endpoints(cluster)[0]) as conn:
        ch = conn.channel()
        ch.queue_declare(queue)
        ch.tx_select()
        ch.basic_publish("", queue, b"rolled back")
        ch.tx_rollback()
        assert ch.queue_declare(queue, passive=True).method.message_count == 0
        for body in (b"one", b"two"):
            ch.basic_publish("", queue, body)
        ch.tx_commit()  # returns once both are stored
        assert ch.queue_declare(queue, passive=True).method.message_count == 2
        method, _, body = ch.basic_get(queue)
        assert body == b"one"
        ch.tx_commit()  # the get itself is not transactional; its ack below is
        ch.basic_ack(method.delivery_tag)
        ch.tx_rollback()  # the ack is undone: the message is still unacknowledged here
        ch.basic_ack(method.delivery_tag)  # so it can be acknowledged again
        ch.tx_commit()
        assert ch.queue_declare(queue, passive=True).method.message_count == 1
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as mixed:
            ch.confirm_delivery()
        assert mixed.value.reply_code == 406
        ch = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as not_tx:
            ch.tx_commit()
        assert not_tx.value.reply_code == 406
        ch = conn.channel()
        ch.queue_delete(queue)


def test_deleting_a_queue_cancels_its_consumers_everywhere(cluster: Cluster, unique: Callable[[str], str]) -> None:
    """A consumer told with basic.cancel (consumer_cancel_notify) when its queue is deleted through
    the same or another proxy (or proxy worker)."""
    queue = unique("doomed")
    with connect(endpoints(cluster)[0]) as conn, connect(endpoints(cluster)[-1]) as other:
        ch = conn.channel()
        ch.queue_declare(queue)
        cancelled: list[str] = []
        ch.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
        tag = ch.basic_consume(queue, lambda *_: None)
        other.channel().queue_delete(queue)
        deadline = time.monotonic() + WAIT_S
        while not cancelled and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.2)
        assert cancelled == [tag]
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as gone:
            conn.channel().queue_declare(queue, passive=True)
        assert gone.value.reply_code == 404


def test_max_length_drops_the_head_or_rejects(cluster: Cluster, unique: Callable[[str], str]) -> None:
    dlx, dead, head, reject = unique("maxlen-dlx"), unique("maxlen-dead"), unique("head"), unique("reject")
    with connect(endpoints(cluster)[0]) as conn:
        ch = conn.channel()
        ch.exchange_declare(dlx, "fanout")
        ch.queue_declare(dead, exclusive=True)
        ch.queue_bind(dead, dlx)
        ch.queue_declare(head, arguments={"x-max-length": 2, "x-dead-letter-exchange": dlx})
        ch.queue_declare(reject, arguments={"x-max-length": 2, "x-overflow": "reject-publish"})
        ch.confirm_delivery()
        for i in range(4):
            ch.basic_publish("", head, f"h{i}".encode())
        for i in range(2):
            ch.basic_publish("", reject, f"r{i}".encode())
        with pytest.raises(pika.exceptions.NackError):
            ch.basic_publish("", reject, b"r2")
        assert [b for _, _, b in drain(ch, head, 2)] == [b"h2", b"h3"]
        assert [b for _, _, b in drain(ch, reject, 2)] == [b"r0", b"r1"]
        got = drain(ch, dead, 2)
        assert [b for _, _, b in got] == [b"h0", b"h1"]
        assert {props.headers["x-death"][0]["reason"] for _, props, _ in got} == {"maxlen"}


def test_max_length_bytes_drops_the_head(cluster: Cluster, unique: Callable[[str], str]) -> None:
    """x-max-length-bytes limits the body bytes of the ready messages: the oldest go (dead-lettered,
    reason maxlen) while the queue is above it, a message larger than the limit too; with
    x-max-length as well, either limit drops; requeued messages count, and a requeue drops too; a
    priority queue's head is its highest priority."""
    dlx, dead, head, both = unique("bytes-dlx"), unique("bytes-dead"), unique("bytes-head"), unique("bytes-both")
    requeued, ranked = unique("bytes-requeued"), unique("bytes-ranked")
    with connect(endpoints(cluster)[0]) as conn:
        ch = conn.channel()
        ch.exchange_declare(dlx, "fanout")
        ch.queue_declare(dead, exclusive=True)
        ch.queue_bind(dead, dlx)
        ch.queue_declare(head, arguments={"x-max-length-bytes": 250, "x-dead-letter-exchange": dlx})
        ch.queue_declare(both, arguments={"x-max-length": 3, "x-max-length-bytes": 1000})
        ch.queue_declare(requeued, arguments={"x-max-length-bytes": 300})
        ch.confirm_delivery()
        for i in range(4):
            ch.basic_publish("", head, f"h{i}".encode() * 50)  # 100 bytes each: two fit
        assert _ready_eventually(ch, head, 2) == 2
        ch.basic_publish("", head, b"x" * 20_000)  # larger than the limit (and than 8 KiB): the queue is emptied
        assert _ready_eventually(ch, head, 0) == 0
        ch.basic_publish("", head, b"last")
        assert [b for _, _, b in drain(ch, head, 1)] == [b"last"]
        got = drain(ch, dead, 5)
        assert [b[:2] for _, _, b in got] == [b"h0", b"h1", b"h2", b"h3", b"xx"]
        assert {props.headers["x-death"][0]["reason"] for _, props, _ in got} == {"maxlen"}

        for i in range(5):
            ch.basic_publish("", both, f"s{i}".encode())  # the length limit keeps the newest 3
        ch.basic_publish("", both, b"b" * 900)  # 4 messages: s2 goes; 904 bytes
        assert _ready_eventually(ch, both, 3) == 3
        ch.basic_publish("", both, b"c" * 200)  # s3 for the length, then s4 and the 900 for the bytes
        assert [b for _, _, b in drain(ch, both, 1)] == [b"c" * 200]
        assert _ready_eventually(ch, both, 0) == 0

        for i in range(3):  # requeued messages count again, and a requeue drops from the head too
            ch.basic_publish("", requeued, f"q{i}".encode() * 50)
        assert _ready_eventually(ch, requeued, 3) == 3
        held = [ch.basic_get(requeued) for _ in range(3)]  # unacknowledged: not ready
        for i in range(2):
            ch.basic_publish("", requeued, f"n{i}".encode() * 50)
        ch.basic_nack(held[-1][0].delivery_tag, multiple=True, requeue=True)  # 500 bytes ready: 2 go
        assert _ready_eventually(ch, requeued, 3) == 3
        left = sorted(b[:2] for _, _, b in drain(ch, requeued, 3))  # requeued ones go back to the head
        assert left[:2] == [b"n0", b"n1"] and left[2] in (b"q0", b"q1", b"q2"), left

        ch.queue_declare(ranked, arguments={"x-max-length-bytes": 200, "x-max-priority": 5})
        for body, prio in ((b"a" * 100, 1), (b"b" * 100, 5), (b"c" * 100, 1)):
            ch.basic_publish("", ranked, body, pika.BasicProperties(priority=prio))
        assert _ready_eventually(ch, ranked, 2) == 2  # the head of a priority queue: its highest priority
        assert [b[:1] for _, _, b in drain(ch, ranked, 2)] == [b"a", b"c"]
        for q in (head, both, requeued, ranked):
            ch.queue_delete(q)


def test_max_length_bytes_rejects_and_counts_requeued(cluster: Cluster, unique: Callable[[str], str]) -> None:
    """reject-publish with x-max-length-bytes: a publish that would take the ready bodies above the
    limit is nacked and not stored (a smaller one after it may fit); requeued messages count again,
    delivered ones do not; a redeclare must repeat the limit (406 otherwise)."""
    queue = unique("bytes-reject")
    args = {"x-max-length-bytes": 300, "x-overflow": "reject-publish"}
    with connect(endpoints(cluster)[-1]) as conn:
        ch = conn.channel()
        ch.queue_declare(queue, arguments=args)
        ch.confirm_delivery()
        for i in range(2):
            ch.basic_publish("", queue, f"r{i}".encode() * 50)
        with pytest.raises(pika.exceptions.NackError):
            ch.basic_publish("", queue, b"r2" * 75)  # 150: over
        ch.basic_publish("", queue, b"r3" * 50)  # exactly at the limit
        with pytest.raises(pika.exceptions.NackError):
            ch.basic_publish("", queue, b"!")
        assert _ready_eventually(ch, queue, 3) == 3
        [row] = [q for q in cluster.admin("amqp", "queues") if q["name"] == queue]
        assert (row["ready"], row["ready_bytes"]) == (3, 300)
        held = drain(ch, queue, 3, ack=False)  # delivered, not acknowledged: room again
        assert [b[:2] for _, _, b in held] == [b"r0", b"r1", b"r3"]
        ch.basic_publish("", queue, b"n0" * 100)
        ch.basic_nack(held[-1][0].delivery_tag, multiple=True, requeue=True)  # 300 + 200 ready now
        assert _ready_eventually(ch, queue, 4) == 4
        with pytest.raises(pika.exceptions.NackError):
            ch.basic_publish("", queue, b"?")
        assert ch.queue_declare(queue, arguments=args).method.message_count == 4
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as inequivalent:
            ch.queue_declare(queue, arguments={**args, "x-max-length-bytes": 301})
        assert inequivalent.value.reply_code == 406
        ch = conn.channel()
        assert sorted(b[:2] for _, _, b in drain(ch, queue, 4)) == [b"n0", b"r0", b"r1", b"r3"]
        ch.queue_delete(queue)


def test_a_celery_worker_runs_tasks_sent_through_sluice(cluster: Cluster, tmp_path: Path) -> None:
    """A real `celery worker` (kombu over py-amqp, with its mingle and pidbox broadcasts) executes
    tasks sent through Sluice and returns their results over AMQP (the rpc:// backend)."""
    broker = f"amqp://guest:guest@{endpoints(cluster)[0]}//"
    queue = f"celery-{cluster.kind}-{uuid.uuid4().hex[:6]}"
    env = {**os.environ, "SLUICE_CELERY_BROKER": broker, "SLUICE_CELERY_QUEUE": queue,
           "PYTHONPATH": str(Path(__file__).resolve().parents[2])}  # fmt: skip
    log_path = tmp_path / "celery-worker.log"
    with log_path.open("wb") as log:
        worker = subprocess.Popen([sys.executable, "-m", "celery", "-A", "tests.e2e.support.celery_app", "worker",
                                   "--pool", "solo", "--loglevel", "info", "--hostname", f"{queue}@%h"],
                                  env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while b" ready." not in log_path.read_bytes():
            assert worker.poll() is None and time.monotonic() < deadline, log_path.read_text()[-2000:]
            time.sleep(0.2)
        from celery import Celery

        client = Celery("sluice_e2e_client", broker=broker, backend="rpc://")
        results = [client.send_task("sluice_e2e.add", args=(i, i), queue=queue) for i in range(5)]
        assert [r.get(timeout=WAIT_S) for r in results] == [0, 2, 4, 6, 8]
        client.close()
    finally:
        worker.terminate()
        try:
            worker.wait(timeout=20)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
    assert b"succeeded" in log_path.read_bytes()


NODE_DIR = Path(__file__).resolve().parent / "node"


def _amqplib() -> str:
    """The node binary once tests/e2e/node has amqplib (installed with npm, as the Node client's
    tests do); the test is skipped when Node.js or npm cannot provide it."""
    node_bin, npm_bin = shutil.which("node"), shutil.which("npm")
    if node_bin is None or npm_bin is None:
        pytest.skip("Node.js and npm are needed to run amqplib")
    if not (NODE_DIR / "node_modules" / "amqplib" / "package.json").exists():
        proc = subprocess.run([npm_bin, "install", "--no-audit", "--no-fund", "--loglevel=error"], cwd=NODE_DIR,
                              capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
        if proc.returncode != 0:
            pytest.skip(f"npm install failed (no network?): {proc.stderr.strip()[:200]}")
    return node_bin


def test_amqplib_work_queue_topics_and_errors(cluster: Cluster) -> None:
    node = _amqplib()
    tag = f"{cluster.kind}-{uuid.uuid4().hex[:6]}"
    proc = subprocess.run([node, "amqp_tutorials.js", f"amqp://guest:guest@{endpoints(cluster)[-1]}", tag],
                          cwd=NODE_DIR, capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["tasks"] == [{"body": f"task {i}", "n": i, "redelivered": False} for i in range(5)]
    assert out["topic"] == ["kern.critical"]
    assert out["missing"] == 404


def test_rpc_tutorial(cluster: Cluster, unique: Callable[[str], str]) -> None:
    """RabbitMQ's RPC tutorial: requests on a queue, replies to the client's exclusive callback
    queue named in reply_to, matched by correlation_id; server and client on different proxies."""
    rpc_queue = unique("rpc")
    with connect(endpoints(cluster)[0]) as server_conn, connect(endpoints(cluster)[-1]) as client_conn:
        server = server_conn.channel()
        server.queue_declare(rpc_queue)
        client = client_conn.channel()
        callback = client.queue_declare("", exclusive=True).method.queue
        ids = [str(uuid.uuid4()) for _ in range(3)]
        for n, cid in enumerate(ids, start=5):
            client.basic_publish("", rpc_queue, str(n).encode(),
                                 pika.BasicProperties(reply_to=callback, correlation_id=cid))  # fmt: skip
        for method, props, body in drain(server, rpc_queue, 3, ack=False):
            n = int(body)
            answer = str(n * n).encode()
            server.basic_publish("", props.reply_to, answer, pika.BasicProperties(correlation_id=props.correlation_id))
            server.basic_ack(method.delivery_tag)
        replies = {props.correlation_id: body for _, props, body in drain(client, callback, 3)}
        assert replies == {ids[0]: b"25", ids[1]: b"36", ids[2]: b"49"}


def test_publisher_confirms_and_mandatory(cluster: Cluster, unique: Callable[[str], str]) -> None:
    queue = unique("confirmed")
    with connect(endpoints(cluster)[0]) as conn:
        ch = conn.channel()
        ch.queue_declare(queue=queue, durable=True)
        ch.confirm_delivery()
        for i in range(20):  # each returns once the broker stored it (pika waits for the ack)
            ch.basic_publish("", queue, f"m{i}".encode(), pika.BasicProperties(delivery_mode=2), mandatory=True)
        with pytest.raises(pika.exceptions.UnroutableError):
            ch.basic_publish("", unique("nowhere"), b"lost", mandatory=True)
        assert _ready_eventually(ch, queue, 20) == 20

    async def many_in_flight() -> int:
        conn = await aio_pika.connect(f"amqp://guest:guest@{endpoints(cluster)[-1]}/")
        async with conn:
            ch = await conn.channel(publisher_confirms=True)
            confirms = [ch.default_exchange.publish(aio_pika.Message(f"x{i}".encode()), routing_key=queue)
                        for i in range(200)]  # fmt: skip
            results = await asyncio.gather(*confirms)
            assert all(isinstance(r, pamqp_commands.Basic.Ack) for r in results)
            q = await ch.declare_queue(queue, passive=True)
            return int(q.declaration_result.message_count or 0)

    assert asyncio.run(many_in_flight()) == 220
    with connect(endpoints(cluster)[0]) as conn:
        ch = conn.channel()
        assert ch.queue_purge(queue).method.message_count == 220
        assert ch.queue_declare(queue=queue, passive=True).method.message_count == 0
        ch.queue_delete(queue)


# -- bodies of every size, token refresh ------------------------------------------------------------

MAX_BODY_BYTES = 16 * 1024 * 1024  # [proxy.amqp] max_body_bytes by default: RabbitMQ 4's max_message_size


def _refused_total(cluster: Cluster, reason: str) -> float:
    """`sluice_amqp_publishes_refused_total` of vhost `/` for `reason`, over every process."""
    total = 0.0
    for address in cluster.ops.values():
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=WAIT_S) as answer:
            text = answer.read().decode()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = (sample.labels.get("vhost"), sample.labels.get("reason"))
                if sample.name == "sluice_amqp_publishes_refused_total" and labels == ("/", reason):
                    total += sample.value
    return total


def _texts(headers: dict[str, object] | None) -> dict[str, object]:
    return {k: v.decode() if isinstance(v, bytes) else v for k, v in (headers or {}).items()}


def test_empty_bodies_and_large_headers_are_stored_and_delivered(
    cluster: Cluster, unique: Callable[[str], str]
) -> None:
    """An empty body (signals, headers-only messages) and a header table as large as a frame are
    stored and delivered as published, with and without confirms, by pika and aio-pika; a
    basic.get right after a publish on the same channel sees it, as RabbitMQ's does. Before: the
    broker refused both (an empty body; the header as a user property over 16 KiB), so a publisher
    without confirms lost them in silence and one with confirms got a nack; and a basic.get could
    overtake the channel's publish."""
    queue = unique("empty")
    large = {"blob": "h" * 60_000}
    with connect(endpoints(cluster)[0]) as conn:
        ch = conn.channel()
        ch.queue_declare(queue)
        ch.basic_publish("", queue, b"", pika.BasicProperties(headers={"kind": "signal"}))  # no confirms
        method, props, body = ch.basic_get(queue)
        assert method is not None, "the empty publish did not reach its queue"
        assert (body, props.headers) == (b"", {"kind": "signal"})
        ch.basic_ack(method.delivery_tag)
        ch.confirm_delivery()  # a nack raises NackError
        ch.basic_publish("", queue, b"", pika.BasicProperties(headers=large))
        ch.basic_publish("", queue, b"after")

    async def with_aio_pika() -> list[tuple[bytes, dict[str, object]]]:
        conn = await aio_pika.connect(f"amqp://guest:guest@{endpoints(cluster)[-1]}/")
        async with conn:
            ch = await conn.channel(publisher_confirms=True)
            await ch.default_exchange.publish(aio_pika.Message(b"", headers={"kind": "aio"}), routing_key=queue)
            q = await ch.declare_queue(queue, passive=True)
            got = []
            while (m := await q.get(fail=False, timeout=WAIT_S)) is not None:
                got.append((m.body, _texts(m.headers)))
                await m.ack()
            await q.delete()
            return got

    assert asyncio.run(with_aio_pika()) == [(b"", large), (b"after", {}), (b"", {"kind": "aio"})]


def test_the_largest_body_round_trips_and_one_byte_more_is_refused(
    cluster: Cluster, unique: Callable[[str], str]
) -> None:
    """A body of max_body_bytes (16 MiB by default, RabbitMQ 4's max_message_size) published by pika
    reaches aio-pika and one published by aio-pika reaches pika (basic.consume), byte for byte; one
    byte more closes the channel with RabbitMQ's 406 and text, and is counted. Before: the gateway
    took 4 MiB and the brokers 4 MiB (with the gateway's limit raised alone, the broker refused the
    body after it was received: dropped in silence without confirms)."""
    there, back = unique("big-there"), unique("big-back")
    sent, returned = os.urandom(MAX_BODY_BYTES), os.urandom(MAX_BODY_BYTES)
    with connect(endpoints(cluster)[0]) as conn:
        ch = conn.channel()
        for q in (there, back):
            ch.queue_declare(q)
        ch.confirm_delivery()
        ch.basic_publish("", there, sent)

    async def with_aio_pika() -> bytes:
        conn = await aio_pika.connect(f"amqp://guest:guest@{endpoints(cluster)[-1]}/")
        async with conn:
            ch = await conn.channel(publisher_confirms=True)
            q = await ch.declare_queue(there, passive=True)
            m = await q.get(timeout=WAIT_S)
            await m.ack()
            await ch.default_exchange.publish(aio_pika.Message(returned), routing_key=back)
            await q.delete()
            return m.body

    assert asyncio.run(with_aio_pika()) == sent
    before = _refused_total(cluster, "max_size")
    with connect(endpoints(cluster)[0]) as conn:
        ch = conn.channel()
        [(_, _, body)] = drain(ch, back, 1)
        assert body == returned
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            ch.basic_publish("", back, returned + b"!")
            ch.basic_qos(prefetch_count=1)  # a publish has no answer: the next call sees the close
        assert (refused.value.reply_code, refused.value.reply_text) == (
            406, f"PRECONDITION_FAILED - message size {MAX_BODY_BYTES + 1} is larger than configured max size "
            f"{MAX_BODY_BYTES}")  # fmt: skip
        conn.channel().queue_delete(back)
    assert _refused_total(cluster, "max_size") == before + 1


def test_update_secret_is_checked_as_a_login(cluster: Cluster) -> None:
    """connection.update-secret (RabbitMQ 3.8+: how OAuth2 clients refresh their token) with the
    user's secret is answered update-secret-ok and the connection goes on; a secret the login
    would refuse closes it with 530 NOT_ALLOWED, as RabbitMQ answers a refused secret. Before:
    503 COMMAND_INVALID for any update. (With authentication on: test_amqp_mapping.py.)"""
    client = RawClient(endpoints(cluster)[0])
    try:
        client.open()
        client.send_method(0, commands.Connection.UpdateSecret(new_secret="guest", reason="token refreshed"))
        client.read_method(commands.Connection.UpdateSecretOk)
        client.send_method(1, commands.Channel.Open())
        client.read_method(commands.Channel.OpenOk)
        client.send_method(0, commands.Connection.UpdateSecret(new_secret="not the secret", reason="expired"))
        close = None
        while close is None:
            _, value = client.read()
            if isinstance(value, commands.Connection.Close):
                close = value
        assert (close.reply_code, close.reply_text) == (530, "NOT_ALLOWED - the new secret of user 'guest' was refused")
        assert (close.class_id, close.method_id) == (10, 70)
        client.send_method(0, commands.Connection.CloseOk())
    finally:
        client.close()


def test_amqplib_bodies_of_every_size_and_update_secret(cluster: Cluster) -> None:
    """amqplib (Node.js, 4 KiB frames): an empty body and one of max_body_bytes round-trip, one byte
    more gets 406 with RabbitMQ's text, and `updateSecret` is answered (tests/e2e/node/amqp_bodies.js)."""
    node = _amqplib()
    tag = f"{cluster.kind}-{uuid.uuid4().hex[:6]}"
    proc = subprocess.run([node, "amqp_bodies.js", f"amqp://guest:guest@{endpoints(cluster)[-1]}", tag,
                           str(MAX_BODY_BYTES)], cwd=NODE_DIR, capture_output=True, text=True, timeout=120,
                          check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [(g["size"], g["kind"]) for g in out["got"]] == [(0, "signal"), (MAX_BODY_BYTES, None)]
    assert out["got"][1]["sha"] == out["sent"]
    assert out["refusal"]["code"] == 406
    assert f"message size {MAX_BODY_BYTES + 1} is larger than configured max size" in out["refusal"]["text"]


def test_basic_get_and_requeue_on_channel_close(cluster: Cluster, unique: Callable[[str], str]) -> None:
    queue = unique("got")
    with connect(endpoints(cluster)[0]) as conn:
        ch = conn.channel()
        ch.queue_declare(queue=queue)
        assert ch.basic_get(queue) == (None, None, None)
        for body in (b"one", b"two"):
            ch.basic_publish("", queue, body)
        assert _ready_eventually(ch, queue, 2) == 2
        method, _, body = ch.basic_get(queue)
        assert (body, method.redelivered, method.message_count) == (b"one", False, 1)
        held = conn.channel()
        _, _, body2 = held.basic_get(queue)  # left unacknowledged, then the channel closes
        assert body2 == b"two"
        held.close()
        ch.basic_ack(method.delivery_tag)
        [(again, _, body3)] = drain(ch, queue, 1)
        assert (body3, again.redelivered) == (b"two", True)
        # nack with requeue comes back redelivered; reject without requeue drops it
        ch.basic_publish("", queue, b"three")
        [(m, _, _)] = drain(ch, queue, 1, ack=False)
        ch.basic_nack(m.delivery_tag, requeue=True)
        [(m, _, b)] = drain(ch, queue, 1, ack=False)
        assert (b, m.redelivered) == (b"three", True)
        ch.basic_reject(m.delivery_tag, requeue=False)
        assert ch.basic_get(queue) == (None, None, None)
        ch.queue_delete(queue)


def test_requeue_when_the_connection_drops(cluster: Cluster, unique: Callable[[str], str]) -> None:
    queue = unique("dropped")
    with connect(endpoints(cluster)[0]) as conn:
        ch = conn.channel()
        ch.queue_declare(queue=queue, durable=True)
        ch.confirm_delivery()
        for i in range(5):
            ch.basic_publish("", queue, f"d{i}".encode())
    dropped = pika.BlockingConnection(pika.ConnectionParameters(*endpoints(cluster)[0].rsplit(":", 1)))
    dch = dropped.channel()
    dch.basic_qos(prefetch_count=5)
    assert len(drain(dch, queue, 5, ack=False)) == 5
    dropped._impl._transport._sock.close()  # the client vanishes without closing anything
    with connect(endpoints(cluster)[-1]) as conn:
        got = drain(conn.channel(), queue, 5)
    assert sorted(b for _, _, b in got) == [f"d{i}".encode() for i in range(5)]
    assert all(m.redelivered for m, _, _ in got)


def test_channel_errors_use_rabbitmq_codes(cluster: Cluster, unique: Callable[[str], str]) -> None:
    queue = unique("strict")
    with connect(endpoints(cluster)[0]) as conn:
        ch = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as missing:
            ch.queue_declare(queue=unique("missing"), passive=True)
        assert missing.value.reply_code == 404 and "NOT_FOUND - no queue" in missing.value.reply_text
        ch = conn.channel()
        ch.queue_declare(queue=queue, durable=True)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as inequivalent:
            ch.queue_declare(queue=queue, durable=False)
        assert inequivalent.value.reply_code == 406
        assert "inequivalent arg 'durable'" in inequivalent.value.reply_text
        ch = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as no_exchange:
            ch.exchange_declare(exchange=unique("nox"), passive=True)
        assert no_exchange.value.reply_code == 404
        ch = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as reserved:
            ch.exchange_declare(exchange="amq.mine", exchange_type="direct")
        assert reserved.value.reply_code == 403
        ch = conn.channel()
        ch.basic_ack(delivery_tag=42)  # unknown delivery tag: the channel closes with 406
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as unknown_tag:
            ch.queue_declare(queue=queue, durable=True)
        assert unknown_tag.value.reply_code == 406
        ch = conn.channel()
        exclusive = ch.queue_declare(queue="", exclusive=True).method.queue
        with connect(endpoints(cluster)[0]) as other:
            och = other.channel()
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as locked:
                och.queue_declare(queue=exclusive, passive=True)
            assert locked.value.reply_code == 405
        ch.queue_delete(queue)
    with connect(endpoints(cluster)[0]) as conn:  # the exclusive queue went with its connection
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as gone:
            conn.channel().queue_declare(queue=exclusive, passive=True)
        assert gone.value.reply_code == 404


def test_bad_login_is_refused(cluster: Cluster) -> None:
    host, port = endpoints(cluster)[0].rsplit(":", 1)
    creds = pika.PlainCredentials("guest", "wrong")
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as refused:
        pika.BlockingConnection(pika.ConnectionParameters(host, int(port), credentials=creds))
    assert "ACCESS_REFUSED" in str(refused.value)


def _serves(endpoint: str) -> None:
    """A fresh connection still works end to end."""
    queue = f"alive-{uuid.uuid4().hex[:8]}"
    with connect(endpoint) as conn:
        ch = conn.channel()
        ch.queue_declare(queue=queue, exclusive=True)
        ch.basic_publish("", queue, b"ok")
        assert [b for _, _, b in drain(ch, queue, 1)] == [b"ok"]


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (b"\x09\x00\x00\x00\x00\x00\x01\x00\xce", 501),  # unknown frame type 9
        (b"\x01\x00\x00\x00\x00\x00\x04\x00\x14\x00\x0a\x00", 501),  # method frame without its end octet
        (b"\x03\x00\x05\x00\x00\x00\x02hi\xce", 504),  # content body on a channel never opened
        (frame.marshal(commands.Basic.Publish(exchange="", routing_key="q"), 0), 503),  # basic.publish on channel 0
        (b"\x01\x00\x01\x00\x00\x00\x04\x00\x3c\x00\x28\xce", 502),  # basic.publish without its arguments
        (b"\x01\x00\x00\x00\x00\x00\x04\x27\x0f\x00\x01\xce", 540),  # unknown class 9999
        (b"\x01\x00\x00\xff\xff\xff\xf0", 501),  # a frame far over frame_max
    ],
    ids=[
        "frame-type",
        "frame-end",
        "channel-not-open",
        "method-on-channel-0",
        "truncated-method",
        "unknown-class",
        "oversize",
    ],
)
def test_malformed_frames_close_the_connection(cluster: Cluster, data: bytes, code: int) -> None:
    client = RawClient(endpoints(cluster)[0])
    try:
        client.open()
        client.send(data)
        close = None
        while close is None:
            _, value = client.read()
            if isinstance(value, commands.Connection.Close):
                close = value
        assert close.reply_code == code, close.reply_text
        client.send_method(0, commands.Connection.CloseOk())
    finally:
        client.close()
    _serves(endpoints(cluster)[0])


def test_content_without_publish_and_wrong_protocol(cluster: Cluster) -> None:
    client = RawClient(endpoints(cluster)[0])
    try:
        client.open()
        client.send_method(1, commands.Channel.Open())
        client.read_method(commands.Channel.OpenOk)
        client.send(b"\x03\x00\x01\x00\x00\x00\x02hi\xce")  # a body frame with no publish before it
        _, value = client.read()
        assert isinstance(value, commands.Connection.Close) and value.reply_code == 505
    finally:
        client.close()
    client = RawClient(endpoints(cluster)[0])
    try:
        client.send(b"GET / HTTP/1.1\r\n\r\n")  # not AMQP: the server names its protocol and closes
        assert client.read_bytes() == b"AMQP\x00\x00\x09\x01"
    finally:
        client.close()
    _serves(endpoints(cluster)[0])


def test_metadata_and_messages_survive_a_crash(own_merged: Cluster) -> None:
    """SIGKILL of `sluice up`: exchanges, queues, bindings and confirmed messages (an empty body with
    a header table larger than user properties may be among them) are all there after the restart
    (its own cluster: the shared ones are not crashed)."""
    crashed = own_merged
    endpoint = crashed.amqp[0]
    large = {"blob": "h" * 60_000}
    with connect(endpoint) as conn:
        ch = conn.channel()
        ch.exchange_declare("orders", "topic", durable=True)
        ch.queue_declare("eu-orders", durable=True, arguments={"x-note": "kept"})
        ch.queue_bind("eu-orders", "orders", "eu.#")
        ch.confirm_delivery()
        for i in range(3):
            ch.basic_publish("orders", f"eu.de.{i}", f"order {i}".encode(), pika.BasicProperties(delivery_mode=2))
        ch.basic_publish("orders", "eu.de.signal", b"", pika.BasicProperties(delivery_mode=2, headers=large))
    crashed.restart(next(name for name in crashed.processes if name.startswith("up-")))
    with connect(endpoint) as conn:
        ch = conn.channel()
        ch.exchange_declare("orders", "topic", passive=True)
        assert ch.queue_declare("eu-orders", durable=True, arguments={"x-note": "kept"}).method.message_count == 4
        ch.confirm_delivery()
        ch.basic_publish("orders", "eu.fr.9", b"after the crash", mandatory=True)  # the binding is still there
        got = [(b, p.headers) for _, p, b in drain(ch, "eu-orders", 5)]
        assert got == [(b"order 0", None), (b"order 1", None), (b"order 2", None), (b"", large),
                       (b"after the crash", None)]  # fmt: skip


def test_heartbeats_both_ways(cluster: Cluster) -> None:
    """With a 1 s heartbeat the server sends heartbeats, and closes the socket of a client that
    stays silent for two intervals."""
    client = RawClient(endpoints(cluster)[0])
    try:
        client.send(b"AMQP\x00\x00\x09\x01")
        client.read_method(commands.Connection.Start)
        client.send_method(0, commands.Connection.StartOk(client_properties={}, mechanism="PLAIN",
                                                          response="\x00guest\x00guest", locale="en_US"))  # fmt: skip
        tune = client.read_method(commands.Connection.Tune)
        client.send_method(0, commands.Connection.TuneOk(channel_max=tune.channel_max, frame_max=tune.frame_max,
                                                         heartbeat=1))  # fmt: skip
        client.send_method(0, commands.Connection.Open(virtual_host="/"))
        client.read_method(commands.Connection.OpenOk)
        beats = 0
        with pytest.raises(EOFError):
            while True:  # bounded by the socket timeout (WAIT_S) if the server never closed it
                _, value = client.read()
                beats += isinstance(value, heartbeat.Heartbeat)
        assert beats >= 1
    finally:
        client.close()
    _serves(endpoints(cluster)[0])


def test_leases_are_renewed_until_the_consumer_timeout(own_merged: Cluster) -> None:
    """An unacknowledged delivery stays with its consumer past its lease (renewed), and goes back to
    the queue, redelivered, when its channel is closed for the consumer timeout (406)."""
    endpoint = own_merged.amqp[0]
    with connect(endpoint) as holder, connect(endpoint) as other:
        hch = holder.channel()
        hch.queue_declare("leased")
        hch.confirm_delivery()
        hch.basic_publish("", "leased", b"held")
        closed: list[int] = []
        hch._impl.add_on_close_callback(lambda _ch, reason: closed.append(reason.reply_code))
        _, _, body = hch.basic_get("leased")
        assert body == b"held"
        holder.sleep(4.0)  # over two leases: renewed, so nobody else gets it
        och = other.channel()
        assert och.basic_get("leased") == (None, None, None)
        deadline = time.monotonic() + WAIT_S
        while not closed and time.monotonic() < deadline:
            holder.sleep(0.2)
        assert closed == [406]
        [(again, _, body)] = drain(och, "leased", 1)
        assert (body, again.redelivered) == (b"held", True)


def test_proxy_killed_while_publishing_and_consuming(tmp_path: Path) -> None:
    """Separated topology, SIGKILL of the proxy a publisher (confirms) and a consumer (no acks yet)
    are connected to: every confirmed message is still there, through the other proxy, and the
    dead proxy's unacknowledged deliveries come back, redelivered, within their lease."""
    config = tmp_path / "sluice.toml"
    config.write_text("[proxy.amqp]\ndelivery_lease_ms = 2000\n")
    sep = start_separated(tmp_path / "sep", amqp=True, config=config)
    try:
        doomed, survivor = sep.amqp
        with connect(survivor) as conn:
            conn.channel().queue_declare("survives", durable=True)
        consumer = pika.BlockingConnection(params(doomed))
        cch = consumer.channel()
        cch.basic_qos(prefetch_count=10)
        publisher = pika.BlockingConnection(params(doomed))
        pch = publisher.channel()
        pch.confirm_delivery()
        for i in range(10):
            pch.basic_publish("", "survives", f"early {i}".encode(), pika.BasicProperties(delivery_mode=2))
        held = drain(cch, "survives", 10, ack=False)  # delivered through the doomed proxy, never acked
        assert len(held) == 10
        confirmed: list[bytes] = []
        killer = threading.Timer(0.5, sep.kill, args=(sep.proxy_process(sep.proxies[0]),))
        killer.start()
        try:
            for i in range(1_000_000):
                body = f"m{i}".encode()
                pch.basic_publish("", "survives", body, pika.BasicProperties(delivery_mode=2))
                confirmed.append(body)  # returned: the broker stored it and the proxy confirmed it
        except (pika.exceptions.AMQPConnectionError, pika.exceptions.AMQPChannelError, OSError):
            pass
        finally:
            killer.join()
        assert confirmed, "the proxy was killed before any publish was confirmed"
        with connect(survivor) as conn:
            ch = conn.channel()
            got: dict[bytes, bool] = {}
            deadline = time.monotonic() + WAIT_S
            want = set(confirmed) | {b for _, _, b in held}
            while not want <= got.keys() and time.monotonic() < deadline:
                for m, _, body in drain(ch, "survives", len(want)):
                    got[body] = got.get(body, False) or m.redelivered
        missing = want - got.keys()
        assert not missing, f"{len(missing)} confirmed or delivered messages lost, e.g. {sorted(missing)[:5]}"
        assert all(got[b] for _, _, b in held), "the dead proxy's deliveries came back without the redelivered flag"
    finally:
        problems = sep.stop()
        assert not problems, "\n".join(problems)


_BROKER_ERRORS = (pika.exceptions.AMQPError, OSError)


def _message(i: int) -> tuple[bytes, bytes, pika.BasicProperties]:
    """(id, body, properties) of the i-th message of `_Publisher`: `m<i>` as the body, or every
    fourth one as a header of an empty body (what the store holds of both survives the crash)."""
    ident = f"m{i}".encode()
    if i % 4 == 3:
        return ident, b"", pika.BasicProperties(delivery_mode=2, headers={"id": ident.decode()})
    return ident, ident, pika.BasicProperties(delivery_mode=2)


def _ident(props: pika.BasicProperties, body: bytes) -> bytes:
    return body or str((props.headers or {}).get("id", "")).encode()


class _Publisher(threading.Thread):
    """Publishes `m<i>` (persistent, confirms; `_message`) through one proxy until `stop`; what was
    confirmed. A nack or a closed channel (the broker is down) is not confirmed: it reconnects and
    goes on."""

    def __init__(self, endpoint: str, queue: str, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.endpoint, self.queue, self.stop = endpoint, queue, stop
        self.confirmed: list[bytes] = []
        self.refused = 0

    def run(self) -> None:
        i = 0
        while not self.stop.is_set():
            try:
                with connect(self.endpoint) as conn:
                    ch = conn.channel()
                    ch.confirm_delivery()
                    while not self.stop.is_set():
                        ident, body, props = _message(i)
                        i += 1
                        try:
                            ch.basic_publish("", self.queue, body, props)
                        except pika.exceptions.NackError:
                            self.refused += 1
                            time.sleep(0.05)
                            continue
                        self.confirmed.append(ident)
            except _BROKER_ERRORS:
                self.refused += 1
                time.sleep(0.1)


class _Consumer(threading.Thread):
    """Consumes with acks through one proxy until `stop`; the history of (id, redelivered, when
    delivered, when acked)."""

    def __init__(self, endpoint: str, queue: str, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.endpoint, self.queue, self.stop = endpoint, queue, stop
        self.history: list[tuple[bytes, bool, float, float]] = []

    def run(self) -> None:
        while True:
            try:
                with connect(self.endpoint) as conn:
                    ch = conn.channel()
                    ch.basic_qos(prefetch_count=50)
                    for method, props, body in ch.consume(self.queue, inactivity_timeout=1.0):
                        if self.stop.is_set():
                            return
                        if method is None:
                            continue
                        delivered = time.monotonic()
                        ch.basic_ack(method.delivery_tag)
                        self.history.append((_ident(props, body), method.redelivered, delivered, time.monotonic()))
            except _BROKER_ERRORS:
                time.sleep(0.1)


def test_broker_killed_while_publishing_and_consuming(tmp_path: Path) -> None:
    """Separated topology, SIGKILL of the broker holding the queue (and the AMQP metadata) while a
    publisher (confirms; every fourth message an empty body with its id in a header) and a consumer
    (an ack per message) run through the two proxies, then the broker is started again. History
    check: every confirmed message is delivered, and no message whose ack was sent before the
    crash window (more than a second before the kill) or after the broker was back is delivered
    again (acks in flight across the crash may be lost, as RabbitMQ's are: AMQP does not confirm
    acks)."""
    config = tmp_path / "sluice.toml"
    config.write_text("[proxy.amqp]\ndelivery_lease_ms = 2000\n")
    sep = start_separated(tmp_path / "sep", amqp=True, config=config)
    try:
        home = min(sep.brokers)  # the metadata home broker, where the queue's topic lives
        with connect(sep.amqp[0]) as conn:
            conn.channel().queue_declare("crash-kept", durable=True)
        stop, consumed = threading.Event(), threading.Event()
        publisher = _Publisher(sep.amqp[0], "crash-kept", stop)
        consumer = _Consumer(sep.amqp[1], "crash-kept", consumed)
        publisher.start()
        consumer.start()
        time.sleep(2.0)
        killed_at, confirmed_before = time.monotonic(), len(publisher.confirmed)
        sep.restart(home)  # SIGKILL, then the same broker again on its port and data
        back_at, confirmed_back = time.monotonic(), len(publisher.confirmed)
        deadline = back_at + 2 * WAIT_S
        while len(publisher.confirmed) < confirmed_back + 100 and time.monotonic() < deadline:
            time.sleep(0.1)  # until publishing goes on through the restarted broker
        stop.set()
        publisher.join(WAIT_S)
        deadline = time.monotonic() + 2 * WAIT_S
        confirmed = set(publisher.confirmed)
        while not confirmed <= {b for b, *_ in consumer.history} and time.monotonic() < deadline:
            time.sleep(0.2)
        consumed.set()
        consumer.join(WAIT_S)
        assert 0 < confirmed_before < len(confirmed), "publishes were not confirmed both before and after the crash"
        missing = confirmed - {b for b, *_ in consumer.history}
        assert not missing, f"{len(missing)} confirmed messages lost, e.g. {sorted(missing)[:5]}"
        acked: dict[bytes, float] = {}
        again = []
        for body, _, delivered, acked_at in consumer.history:
            if body in acked and (acked[body] < killed_at - 1.0 or acked[body] > back_at + 1.0):
                again.append((body, round(acked[body] - killed_at, 2), round(delivered - killed_at, 2)))
            acked.setdefault(body, acked_at)
        assert not again, f"{len(again)} messages delivered again after their ack (body, acked, delivered): {again[:5]}"
    finally:
        problems = sep.stop()
        assert not problems, "\n".join(problems)


def test_an_unsolicited_close_ok_gets_command_invalid(cluster: Cluster) -> None:
    """A connection.close-ok the server did not ask for (it sent no close) is answered with a close
    503 COMMAND_INVALID, as RabbitMQ answers it; it ended the connection without a word (the fuzzer
    found it)."""
    endpoint = endpoints(cluster)[0]
    close_ok = frame.marshal(pamqp_commands.Connection.CloseOk(), 0)
    assert amqp_fuzz.send(endpoint, [close_ok]) == "close:503"
    _serves(endpoint)


def test_fuzzed_frames_get_spec_answers(cluster: Cluster) -> None:
    """Generated frame sequences on fresh connections (tests/e2e/support/amqp_fuzz.py): every one
    ends in a connection close with a spec reply code or stays open; the server logs no failed
    connection and keeps serving."""
    endpoint = endpoints(cluster)[0]
    outcomes: collections.Counter[str] = collections.Counter()
    bad: list[tuple[list[bytes], str]] = []

    @settings(max_examples=FUZZ_EXAMPLES, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(amqp_fuzz.frames())
    def fuzz_once(data: list[bytes]) -> None:
        outcome = amqp_fuzz.send(endpoint, data)
        outcomes[outcome.split(":")[0] if not outcome.startswith("close") else outcome] += 1
        if amqp_fuzz.is_bad(outcome):
            bad.append((data, outcome))

    fuzz_once()
    assert not bad, f"{len(bad)} connections got a bad answer, e.g. {bad[:3]}"
    assert sum(outcomes.values()) == FUZZ_EXAMPLES and len(outcomes) > 2, outcomes
    failed = [line for log in cluster.root.glob("*.log") for line in log.read_text(errors="replace").splitlines()
              if "AMQP connection failed" in line or "Task exception was never retrieved" in line]  # fmt: skip
    assert not failed, failed[:5]
    _serves(endpoint)
