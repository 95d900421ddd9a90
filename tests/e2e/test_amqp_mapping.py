"""AMQP and RocketMQ on one set of messages (docs/amqp.md, "Both protocols"): an exchange mapped to
a RocketMQ topic (`x-sluice-topic`) with pika on one side and the official RocketMQ Python client
on the other, in both topologies. Both directions, with the documented property mapping."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pika
import pytest
from pamqp import commands
from rocketmq import FilterExpression

from tests.e2e.support.amqp import WAIT_S, RawClient, connect, drain, endpoints
from tests.e2e.support.clients import message, producer, receive_count, send_all, simple_consumer
from tests.e2e.support.cluster import Cluster, start_merged, start_separated

# How often the secured cluster's proxies reload users and access rules ([proxy.auth] policy_refresh_s,
# 2 s by default), and how often the separated proxies report their connections ([proxy] client_report_s).
RULES_RELOAD_S = 0.5
CLIENT_REPORT_S = 0.5


def _queue_empty_after(ch: pika.adapters.blocking_connection.BlockingChannel, queue: str, wait_s: float) -> bool:
    """Nothing more arrives in `queue` for `wait_s` (no second copy of what was drained)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        method, _, _ = ch.basic_get(queue, auto_ack=True)
        if method is not None:
            return False
        time.sleep(0.1)
    return True


def test_one_set_of_messages_both_protocols(cluster: Cluster, unique: Callable[[str], str]) -> None:
    topic = cluster.create_topic(unique("orders"))
    group = cluster.create_group(unique("billing"))
    exchange = unique("orders-x")
    with (
        connect(endpoints(cluster)[0]) as conn,
        simple_consumer(cluster.endpoints, group, {topic: FilterExpression()}) as rocket,
        producer(cluster.endpoints, topic) as p,
    ):
        ch = conn.channel()
        ch.exchange_declare(exchange, "topic", arguments={"x-sluice-topic": topic})
        ch.exchange_declare(exchange, "topic")  # the application's own declare, unchanged: equivalent
        queue = ch.queue_declare("", exclusive=True).method.queue
        ch.queue_bind(queue, exchange, routing_key="order.*")
        ch.confirm_delivery()

        # AMQP -> RocketMQ (and the AMQP queue, once)
        props = pika.BasicProperties(content_type="application/json", correlation_id="c-1", message_id="m-1",
                                     reply_to="replies", headers={"region": "eu", "n": 7}, delivery_mode=2)  # fmt: skip
        ch.basic_publish(exchange, "order.created", b'{"id": 1}', props)
        (got,) = receive_count(rocket, 1)
        assert (got.body, got.tag, list(got.keys)) == (b'{"id": 1}', "order.created", ["m-1"])
        for name, want in {"content-type": "application/json", "correlation-id": "c-1", "message-id": "m-1",
                           "reply-to": "replies", "region": "eu", "n": "7", "delivery-mode": "2"}.items():  # fmt: skip
            assert got.properties.get(name) == want, (name, got.properties)

        # RocketMQ -> AMQP: the routing key is AMQP_ROUTING_KEY when given, else the tag
        send_all(p, [
            message(topic, b"paid", tag="order.paid", keys=["k-2"],
                    properties={"content-type": "text/plain", "correlation-id": "c-2", "region": "us"}),
            message(topic, b"shipped", tag="ignored", properties={"AMQP_ROUTING_KEY": "order.shipped"}),
            message(topic, b"not bound", tag="invoice.sent"),
        ])  # fmt: skip
        got_amqp = drain(ch, queue, 3)
        by_body = {body: (method, pr) for method, pr, body in got_amqp}
        assert set(by_body) == {b'{"id": 1}', b"paid", b"shipped"}, sorted(by_body)
        method, pr = by_body[b'{"id": 1}']
        assert (method.exchange, method.routing_key, pr.headers) == (exchange, "order.created", {"region": "eu",
                                                                                                  "n": 7})  # fmt: skip
        method, pr = by_body[b"paid"]
        assert (method.exchange, method.routing_key) == (exchange, "order.paid")
        assert (pr.content_type, pr.correlation_id) == ("text/plain", "c-2")
        assert pr.headers == {"region": "us", "x-rocketmq-tag": "order.paid", "x-rocketmq-keys": "k-2"}
        assert pr.message_id and pr.timestamp
        assert by_body[b"shipped"][0].routing_key == "order.shipped"
        assert _queue_empty_after(ch, queue, 1.5)  # the AMQP publish reached the queue once, not again via the topic
        receive_count(rocket, 3)  # the RocketMQ side still reads its own sends


def test_mapping_errors(cluster: Cluster, unique: Callable[[str], str]) -> None:
    topic = cluster.create_topic(unique("mapped"))
    with connect(endpoints(cluster)[0]) as conn:
        ch = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as missing:
            ch.exchange_declare(unique("x"), "direct", arguments={"x-sluice-topic": unique("no-such-topic")})
        assert missing.value.reply_code == 404 and "no RocketMQ topic" in missing.value.reply_text
        ch = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as bad:
            ch.exchange_declare(unique("x"), "direct", arguments={"x-sluice-topic": "%DLQ%x"})
        assert bad.value.reply_code == 406
        ch = conn.channel()
        first = unique("x")
        ch.exchange_declare(first, "direct", arguments={"x-sluice-topic": topic})
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as twice:
            ch.exchange_declare(unique("y"), "direct", arguments={"x-sluice-topic": topic})
        assert twice.value.reply_code == 406 and first in twice.value.reply_text
        ch = conn.channel()
        ch.exchange_delete(first)
        ch.exchange_declare(unique("z"), "direct", arguments={"x-sluice-topic": topic})  # free again


def test_a_body_the_topics_clients_cannot_receive_is_refused(cluster: Cluster, unique: Callable[[str], str]) -> None:
    """A publish reaching a mapped exchange with a body over what RocketMQ clients are told they may
    receive ([proxy.settings] max_body_bytes, ~4 MiB; AMQP queues take 16 MiB) is refused as a
    whole with 406, stored nowhere (not in the exchange's queues either), and counted: stored in
    the topic, it would fail every receive of its RocketMQ consumers."""
    topic = cluster.create_topic(unique("large"))
    exchange = unique("large-x")
    with connect(endpoints(cluster)[0]) as conn:
        ch = conn.channel()
        ch.exchange_declare(exchange, "fanout", arguments={"x-sluice-topic": topic})
        queue = ch.queue_declare("", exclusive=True).method.queue
        ch.queue_bind(queue, exchange)
        ch.confirm_delivery()
        ch.basic_publish(exchange, "", b"fits")
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            ch.basic_publish(exchange, "", b"x" * (4 * 1024 * 1024))
        assert refused.value.reply_code == 406, refused.value
        assert f"the largest body RocketMQ clients of topic '{topic}'" in refused.value.reply_text
        ch = conn.channel()
        assert [body for _, _, body in drain(ch, queue, 1)] == [b"fits"]
        assert ch.queue_declare(queue, passive=True).method.message_count == 0


def test_mandatory_publish_to_a_mapped_exchange_without_queues_is_routed(
    cluster: Cluster, unique: Callable[[str], str]
) -> None:
    topic = cluster.create_topic(unique("events"))
    group = cluster.create_group(unique("g"))
    exchange = unique("events-x")
    with (
        connect(endpoints(cluster)[-1]) as conn,
        simple_consumer(cluster.endpoints, group, {topic: FilterExpression()}) as rocket,
    ):
        ch = conn.channel()
        ch.exchange_declare(exchange, "fanout", arguments={"x-sluice-topic": topic})
        ch.confirm_delivery()
        returned: list[bytes] = []
        ch.add_on_return_callback(lambda _ch, _m, _p, body: returned.append(body))
        ch.basic_publish(exchange, "", b"to the topic only", mandatory=True)
        conn.process_data_events(time_limit=0.2)
        (got,) = receive_count(rocket, 1, timeout_s=WAIT_S)
    assert got.body == b"to the topic only" and not got.tag and not returned


def test_exchange_bound_and_dead_lettered_messages_reach_the_mapped_topic(
    cluster: Cluster, unique: Callable[[str], str]
) -> None:
    """A mapped exchange's topic gets every message the exchange routes, not only those published
    to it: one reaching it through an exchange-to-exchange binding, and one dead-lettered to it."""
    topic = cluster.create_topic(unique("audit"))
    group = cluster.create_group(unique("auditor"))
    mapped, upstream = unique("audit-x"), unique("front-x")
    with (
        connect(endpoints(cluster)[0]) as conn,
        simple_consumer(cluster.endpoints, group, {topic: FilterExpression()}) as rocket,
    ):
        ch = conn.channel()
        ch.exchange_declare(mapped, "fanout", arguments={"x-sluice-topic": topic})
        ch.exchange_declare(upstream, "direct")
        ch.exchange_bind(mapped, upstream, routing_key="audit")
        dying = ch.queue_declare("", exclusive=True, arguments={"x-dead-letter-exchange": mapped}).method.queue
        ch.confirm_delivery()
        ch.basic_publish(upstream, "audit", b"through a binding")
        ch.basic_publish(upstream, "other", b"not bound")
        ch.basic_publish("", dying, b"rejected")
        method = None
        deadline = time.monotonic() + WAIT_S
        while method is None and time.monotonic() < deadline:
            method, _, _ = ch.basic_get(dying)
        assert method is not None
        ch.basic_reject(method.delivery_tag, requeue=False)
        got = {m.body: m for m in receive_count(rocket, 2, timeout_s=WAIT_S)}
        assert set(got) == {b"through a binding", b"rejected"}, sorted(got)
        assert got[b"through a binding"].tag == "audit"
        assert got[b"rejected"].properties.get("x-first-death-reason") == "rejected", got[b"rejected"].properties


def test_a_vhost_is_a_namespace(cluster: Cluster, unique: Callable[[str], str]) -> None:
    """Vhost `ns` is namespace `ns`: its mapped exchange reads and writes topic `ns%t`, which a
    RocketMQ client of namespace `ns` knows as `t`; the same names in `/` are other resources."""
    ns, topic, group = unique("tenant")[-20:], unique("t"), unique("g")
    cluster.admin("topic", "create", topic, "--namespace", ns)
    cluster.admin("group", "create", group, "--namespace", ns)
    exchange = unique("x")
    with (
        connect(endpoints(cluster)[0], virtual_host=ns) as conn,
        simple_consumer(cluster.endpoints, group, {topic: FilterExpression()}, namespace=ns) as rocket,
        producer(cluster.endpoints, topic, namespace=ns) as p,
    ):
        ch = conn.channel()
        ch.exchange_declare(exchange, "direct", arguments={"x-sluice-topic": topic})
        queue = ch.queue_declare("", exclusive=True).method.queue
        ch.queue_bind(queue, exchange, routing_key="k")
        ch.confirm_delivery()
        ch.basic_publish(exchange, "k", b"amqp in a vhost")
        (got,) = receive_count(rocket, 1)
        assert (got.body, got.topic) == (b"amqp in a vhost", topic)
        send_all(p, [message(topic, b"rocketmq in a namespace", tag="k")])
        bodies = sorted(body for _, _, body in drain(ch, queue, 2))
        assert bodies == [b"amqp in a vhost", b"rocketmq in a namespace"]
    with connect(endpoints(cluster)[-1]) as conn:  # vhost "/": the exchange is not there
        ch = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as missing:
            ch.exchange_declare(exchange, passive=True)
        assert missing.value.reply_code == 404
    rows = {r["vhost"]: r for r in cluster.admin("amqp", "vhosts")}
    assert rows[ns]["namespace"] == ns and rows[ns]["exchanges"] == 1 and rows["/"]["namespace"] == "(default)"
    with pytest.raises(pika.exceptions.AMQPConnectionError) as bad:
        pika.BlockingConnection(pika.ConnectionParameters(*_host_port(endpoints(cluster)[0]), virtual_host="a/b"))
    assert "530" in repr(bad.value) and "not found" in repr(bad.value)


def _host_port(endpoint: str) -> tuple[str, int]:
    host, port = endpoint.rsplit(":", 1)
    return host, int(port)


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A merged cluster with authentication on (the gateway's checks are the same code in both
    topologies): amy may use vhost `team-a` (exchanges `orders*`, queues `amy-*`), bob only `/`."""
    root = tmp_path_factory.mktemp("amqp-auth")
    config = root / "sluice.toml"
    config.write_text(f"[proxy.auth]\npolicy_refresh_s = {RULES_RELOAD_S}\n")
    started = start_merged(root / "cluster", amqp=True, extra_args=["--auth", "on", "--config", str(config)])
    try:
        for user in ("amy", "bob"):
            started.admin("user", "create", user, "--secret", f"{user}-secret")
        started.admin("acl", "grant", "amy", "--namespace", "team-a", "--resource", "topic:orders*",
                      "--actions", "PUB,SUB")  # fmt: skip
        started.admin("acl", "grant", "amy", "--namespace", "team-a", "--resource", "group:amy-*", "--actions", "SUB")
        started.admin("acl", "grant", "bob", "--resource", "*", "--actions", "PUB,SUB")
        _wait_rules_loaded(started)
        yield started
    finally:
        problems = started.stop()
        assert not problems, "\n".join(problems)


def _open(cluster: Cluster, user: str, vhost: str) -> pika.BlockingConnection:
    """A connection as `user`, retried while the proxy has not loaded the new rules yet."""
    creds = pika.PlainCredentials(user, f"{user}-secret")
    parameters = pika.ConnectionParameters(*_host_port(endpoints(cluster)[0]), virtual_host=vhost, credentials=creds)
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            return pika.BlockingConnection(parameters)
        except pika.exceptions.AMQPConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


def _wait_rules_loaded(cluster: Cluster) -> None:
    """Until amy's last rule (queues `amy-*`) is in force: each shard reloads the rules on its own
    (every RULES_RELOAD_S), so a first connection can see her first rule and not yet the last. Once
    one shard has it, one more reload period covers the other."""
    deadline = time.monotonic() + WAIT_S
    while True:
        conn = _open(cluster, "amy", "team-a")
        try:
            conn.channel().queue_declare("amy-probe", auto_delete=True)
            break
        except pika.exceptions.ChannelClosedByBroker:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)
        finally:
            if conn.is_open:
                conn.close()
    time.sleep(RULES_RELOAD_S + 0.5)


def test_access_rules_apply_to_vhosts_and_resources(secured: Cluster) -> None:
    conn = _open(secured, "amy", "team-a")
    try:
        ch = conn.channel()
        ch.exchange_declare("orders-x", "direct")
        ch.queue_declare("amy-q")
        ch.queue_bind("amy-q", "orders-x", routing_key="new")
        ch.confirm_delivery()
        ch.basic_publish("orders-x", "new", b"allowed")
        assert [body for _, _, body in drain(ch, "amy-q", 1)] == [b"allowed"]
        refusals = [
            lambda c: c.exchange_declare("payments", "direct"),  # configure on an exchange she has no rule for
            lambda c: c.queue_declare("bob-q"),  # configure on a queue
            lambda c: c.basic_publish("", "amy-q", b"x"),  # write to the default exchange (amq.default)
            lambda c: c.basic_get("bob-q"),  # read a queue
            lambda c: c.queue_delete("other"),
        ]
        for refuse in refusals:
            c = conn.channel()
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
                refuse(c)
                c.basic_qos(prefetch_count=1)  # a publish has no answer: the next call sees the close
            assert refused.value.reply_code == 403 and "refused for user 'amy'" in refused.value.reply_text
    finally:
        conn.close()
    _open(secured, "bob", "/").close()
    with pytest.raises(pika.exceptions.AMQPConnectionError) as denied:
        pika.BlockingConnection(pika.ConnectionParameters(
            *_host_port(endpoints(secured)[0]), virtual_host="team-a",
            credentials=pika.PlainCredentials("bob", "bob-secret")))  # fmt: skip
    text = repr(denied.value).replace("\\'", "'")
    assert "530" in text and "access to vhost 'team-a' refused for user 'bob'" in text, text
    with pytest.raises(pika.exceptions.AMQPConnectionError):  # guest is not a user when authentication is on
        pika.BlockingConnection(pika.ConnectionParameters(*_host_port(endpoints(secured)[0])))
    rows = {r["vhost"]: r for r in secured.admin("amqp", "vhosts")}
    assert rows["team-a"]["users"] == "amy" and rows["/"]["users"] == "bob"


def test_update_secret_is_checked_against_the_users(secured: Cluster) -> None:
    """With authentication on, connection.update-secret is checked as connection.start-ok's
    password is, against the security document's users: bob's own secret is answered
    update-secret-ok and his connection goes on; another user's closes it with 530 NOT_ALLOWED.
    Before: 503 COMMAND_INVALID for any update (an OAuth2 client lost its connection at each
    token refresh)."""
    client = RawClient(endpoints(secured)[0])
    try:
        client.open("bob", "bob-secret")
        client.send_method(0, commands.Connection.UpdateSecret(new_secret="bob-secret", reason="token refreshed"))
        client.read_method(commands.Connection.UpdateSecretOk)
        client.send_method(1, commands.Channel.Open())
        client.read_method(commands.Channel.OpenOk)
        client.send_method(0, commands.Connection.UpdateSecret(new_secret="amy-secret", reason="token refreshed"))
        close = None
        while close is None:
            _, value = client.read()
            if isinstance(value, commands.Connection.Close):
                close = value
        assert (close.reply_code, close.reply_text) == (530, "NOT_ALLOWED - the new secret of user 'bob' was refused")
        client.send_method(0, commands.Connection.CloseOk())
    finally:
        client.close()


def _gone(survivor: str, queue: str) -> bool:
    """A passive declare through `survivor` answers 404 (405 while another connection's exclusive
    queue is still there)."""
    with connect(survivor) as conn:
        try:
            conn.channel().queue_declare(queue, passive=True)
        except pika.exceptions.ChannelClosedByBroker as exc:
            if exc.reply_code == 404:
                return True
            assert exc.reply_code == 405, exc
    return False


def test_a_killed_proxys_exclusive_queues_and_orphan_topics_are_cleaned(tmp_path: Path) -> None:
    """Separated topology (connections reported every CLIENT_REPORT_S): SIGKILL of the proxy holding a
    connection with an exclusive queue; the other proxy deletes the queue (RabbitMQ deletes it with
    its connection). A deleted queue's topic and group created again (as a publish through a proxy
    with stale metadata does) are deleted again."""
    config = tmp_path / "sluice.toml"
    config.write_text(f"[proxy]\nclient_report_s = {CLIENT_REPORT_S}\n")
    sep = start_separated(tmp_path / "sep", amqp=True, config=config)
    try:
        doomed, survivor = sep.amqp
        owner = pika.BlockingConnection(pika.ConnectionParameters(*_host_port(doomed)))
        owner.channel().queue_declare("mine-only", exclusive=True)
        with connect(survivor) as conn:
            ch = conn.channel()
            ch.queue_declare("shared", durable=True)
            ch.queue_declare("short-lived")
        [row] = [r for r in sep.admin("amqp", "queues") if r["name"] == "short-lived"]
        topic, group = row["topic"], row["topic"].replace("AMQP_Q", "AMQP_G")
        time.sleep(3 * CLIENT_REPORT_S)  # the owner's connection has been reported: a live exclusive queue stays
        assert not _gone(survivor, "mine-only")
        sep.kill(sep.proxy_process(sep.proxies[0]))
        deadline = time.monotonic() + 3 * WAIT_S
        while not _gone(survivor, "mine-only"):
            assert time.monotonic() < deadline, "the dead connection's exclusive queue is still there"
            time.sleep(0.5)
        assert not _gone(survivor, "shared")

        with connect(survivor) as conn:
            conn.channel().queue_delete("short-lived")
        sep.admin("topic", "create", topic, "--queues", "1", "--brokers", row["broker"])  # what a stale publish leaves
        sep.admin("group", "create", group)
        deadline = time.monotonic() + WAIT_S
        while topic in {t["topic"] for t in sep.admin("topic", "list")} or group in {
            g["group"] for g in sep.admin("group", "list")
        }:
            assert time.monotonic() < deadline, "the orphan topic or group is still there"
            time.sleep(0.5)
        assert not _gone(survivor, "shared")
    finally:
        problems = sep.stop()
        assert not problems, "\n".join(problems)


def test_a_priority_queue_delivers_higher_priorities_first(cluster: Cluster, unique: Callable[[str], str]) -> None:
    """x-max-priority: the highest priority first, publish order within one priority, a priority
    above the maximum counts as the maximum and none as 0 (RabbitMQ's rules); counts and purge
    cover every level."""
    queue = unique("jobs")
    sent = [(None, b"none-1"), (1, b"p1-1"), (5, b"p5-1"), (9, b"p9-capped"), (3, b"p3-1"), (5, b"p5-2"),
            (0, b"p0-1"), (4, b"p4-1")]  # fmt: skip
    with connect(endpoints(cluster)[0]) as conn:
        ch = conn.channel()
        ch.queue_declare(queue, arguments={"x-max-priority": 5})
        ch.confirm_delivery()
        for priority, body in sent:
            ch.basic_publish("", queue, body, pika.BasicProperties(priority=priority))
        assert ch.queue_declare(queue, passive=True).method.message_count == len(sent)
        got = []
        for _ in sent:
            method, props, body = ch.basic_get(queue, auto_ack=True)
            assert method is not None, got
            got.append(body)
        assert got == [b"p5-1", b"p9-capped", b"p5-2", b"p4-1", b"p3-1", b"p1-1", b"none-1", b"p0-1"]
        assert props.priority == 0
        for priority, body in sent:
            ch.basic_publish("", queue, body, pika.BasicProperties(priority=priority))
        assert ch.queue_purge(queue).method.message_count == len(sent)
        assert ch.basic_get(queue)[0] is None
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as bad:
            ch.queue_declare(unique("q"), arguments={"x-max-priority": 256})
        assert bad.value.reply_code == 406
