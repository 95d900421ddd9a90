"""Authentication, access rules and rate limits with the official Python client and raw signed
requests, against clusters started with `--auth on` (merged and separated topologies).

Users, rules and limits are set with `sluice admin`; proxies pick changes up within seconds, so
every check after a change waits for it with a bounded loop. Asserts on outcomes and counts only.
"""

from __future__ import annotations

import hashlib
import hmac
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

import pytest
from rocketmq import ClientConfiguration, Credentials, FilterExpression, Producer, SimpleConsumer
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.v5.exception import TooManyRequestsException

from tests.e2e.support import raw
from tests.e2e.support.clients import REQUEST_TIMEOUT_S, message, receive_count, send_all
from tests.e2e.support.cluster import Cluster, start_merged, start_separated

PICKUP_TIMEOUT_S = 30.0
# Answers in a row, each on a new connection, before a change counts as in force on every proxy worker
# (a worker gets a connection with odds 1/N: 12 in a row miss one of 2 workers with odds 2**-11).
SAME_IN_A_ROW = 12
ALICE, BOB = ("alice", "alice-secret"), ("bob", "bob-secret")


@dataclass
class Secured:
    cluster: Cluster
    topic: str
    group: str


@pytest.fixture(scope="module", params=["merged", "separated"])
def secured(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    root = tmp_path_factory.mktemp(f"auth-{request.param}")
    auth = ["--auth", "on"]
    cluster = (
        start_merged(root, extra_args=auth) if request.param == "merged" else start_separated(root, proxy_args=auth)
    )
    try:
        suffix = uuid.uuid4().hex[:6]
        topic, group = cluster.create_topic(f"orders-{suffix}"), cluster.create_group(f"billing-{suffix}")
        for key, secret in (ALICE, BOB):
            cluster.admin("user", "create", key, "--secret", secret)
        cluster.admin("acl", "grant", "bob", "--resource", f"topic:{topic}", "--actions", "SUB")
        cluster.admin("acl", "grant", "bob", "--resource", f"group:{group}", "--actions", "SUB")
        # Last: once a proxy lets Alice route, it holds this document version and all before it.
        cluster.admin("acl", "grant", "alice", "--resource", "topic:orders-*", "--actions", "PUB")
        for address in cluster.proxies:
            wait_for_code(address, topic, ALICE, "OK")
        yield Secured(cluster, topic, group)
    finally:
        problems = cluster.stop()
        assert not problems, "cluster teardown:\n" + "\n".join(problems)


def signed(user: tuple[str, str], *, namespace: str = "", upper: bool = False) -> raw.Metadata:
    date_time = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    signature = hmac.new(user[1].encode(), date_time.encode(), hashlib.sha1).hexdigest()
    signature = signature.upper() if upper else signature
    auth = f"MQv2-HMAC-SHA1 Credential={user[0]}, SignedHeaders=x-mq-date-time, Signature={signature}"
    return [*raw.headers(namespace=namespace), ("x-mq-date-time", date_time), ("authorization", auth)]


def route_code(address: str, topic: str, user: tuple[str, str], namespace: str = "") -> tuple[str, str]:
    with raw.stub(address) as s:
        response = raw.query_route(s, topic, namespace=namespace, metadata=signed(user, namespace=namespace))
    return raw.code_name(response.status.code), response.status.message


def wait_for_code(address: str, topic: str, user: tuple[str, str], code: str, namespace: str = "") -> str:
    """Poll QueryRoute until it answers `code` (a change reached the proxy); returns its message.
    Each poll is a connection of its own, which the kernel hands to any of the proxy's worker
    processes (each refreshes the security document on its own): `code` must come back
    SAME_IN_A_ROW times running, so every worker has it."""
    deadline = time.monotonic() + PICKUP_TIMEOUT_S
    in_a_row = 0
    while True:
        got, text = route_code(address, topic, user, namespace)
        in_a_row = in_a_row + 1 if got == code else 0
        if in_a_row >= SAME_IN_A_ROW:
            return text
        assert time.monotonic() < deadline, f"{address} still answers {got} ({text}), not {code}"
        if not in_a_row:
            time.sleep(0.3)


def config(s: Secured, user: tuple[str, str], namespace: str = "") -> ClientConfiguration:
    return ClientConfiguration(s.cluster.endpoints, Credentials(*user), namespace=namespace,
                               request_timeout=REQUEST_TIMEOUT_S)  # fmt: skip


def test_signed_clients_produce_and_consume(secured: Secured) -> None:
    producer = Producer(config(secured, ALICE), (secured.topic,))
    consumer = SimpleConsumer(config(secured, BOB), secured.group, {secured.topic: FilterExpression()},
                              await_duration=1)  # fmt: skip
    producer.startup()
    consumer.startup()
    try:
        ids = send_all(producer, [message(secured.topic, f"signed {i}".encode()) for i in range(3)])
        got = receive_count(consumer, len(ids))
    finally:
        producer.shutdown()
        consumer.shutdown()
    assert sorted(m.message_id for m in got) == sorted(ids)


def test_upper_case_hex_signatures_are_accepted(secured: Secured) -> None:
    with raw.stub(secured.cluster.first_proxy) as s:
        response = raw.query_route(s, secured.topic, metadata=signed(ALICE, upper=True))
    assert raw.code_name(response.status.code) == "OK"


def test_missing_malformed_and_forged_signatures_are_unauthorized(secured: Secured) -> None:
    address = secured.cluster.first_proxy
    forged = ("alice", "not-her-secret")
    assert route_code(address, secured.topic, forged) == (
        "UNAUTHORIZED",
        "the signature of access key alice does not match; check its secret",
    )
    assert route_code(address, secured.topic, ("mallory", "x"))[0] == "UNAUTHORIZED"
    with raw.stub(address) as s:
        unsigned = raw.query_route(s, secured.topic)
        malformed = raw.query_route(s, secured.topic, metadata=[*raw.headers(), ("authorization", "Basic abc")])
        send = raw.send(s, raw.message(secured.topic), metadata=signed(forged))
    assert raw.code_name(unsigned.status.code) == "UNAUTHORIZED" and "not signed" in unsigned.status.message
    assert raw.code_name(malformed.status.code) == "UNAUTHORIZED"
    assert raw.code_name(send.status.code) == "UNAUTHORIZED" and not send.entries
    # The official client with a wrong secret cannot send either.
    producer = Producer(config(secured, forged))
    producer.startup()
    try:
        with pytest.raises(Exception):  # noqa: B017 - the client wraps the route failure in a plain Exception
            producer.send(message(secured.topic, b"forged"))
    finally:
        producer.shutdown()


def test_telemetry_needs_a_signature(secured: Secured) -> None:
    with pytest.raises(AssertionError, match="UNAUTHORIZED"):
        raw.advertised_settings(secured.cluster.first_proxy, secured.topic)


def test_denied_actions_are_forbidden_and_store_nothing(secured: Secured) -> None:
    address = secured.cluster.first_proxy
    with raw.stub(address) as s:
        denied_send = raw.send(s, raw.message(secured.topic, b"bob may not"), metadata=signed(BOB))
        statuses, messages = raw.receive(s, raw.receive_request(secured.topic, secured.group), metadata=signed(ALICE))
    assert raw.code_name(denied_send.status.code) == "FORBIDDEN"
    assert f"access key bob may not PUB on topic {secured.topic}" in denied_send.status.message
    assert [raw.code_name(st.code) for st in statuses] == ["FORBIDDEN"] and not messages
    assert f"may not SUB on group {secured.group}" in statuses[0].message
    # Alice may not SUB: the route answers only for PUB or SUB, which she has; a topic outside
    # her prefix is forbidden even to route.
    assert route_code(address, "payments", ALICE)[0] == "FORBIDDEN"
    # Nothing of the refused send was stored: Bob receives Alice's marker and nothing else.
    with raw.stub(address) as s:
        marker = raw.send(s, raw.message(secured.topic, b"marker"), metadata=signed(ALICE))
    assert raw.code_name(marker.status.code) == "OK"
    consumer = SimpleConsumer(config(secured, BOB), secured.group, {secured.topic: FilterExpression()},
                              await_duration=1)  # fmt: skip
    consumer.startup()
    try:
        got = receive_count(consumer, 1)
        extra = consumer.receive(32, 15)
    finally:
        consumer.shutdown()
    bodies = [m.body for m in [*got, *(extra or [])]]
    assert b"bob may not" not in bodies and b"marker" in bodies


def test_rule_changes_reach_every_proxy_within_seconds(secured: Secured) -> None:
    carol = (f"carol{uuid.uuid4().hex[:6]}", "carol-secret")
    c = secured.cluster
    c.admin("user", "create", carol[0], "--secret", carol[1])
    for address in c.proxies:
        assert "may not PUB or SUB" in wait_for_code(address, secured.topic, carol, "FORBIDDEN")
    c.admin("acl", "grant", carol[0], "--resource", "*", "--actions", "ADMIN")
    for address in c.proxies:
        wait_for_code(address, secured.topic, carol, "OK")
    c.admin("acl", "grant", carol[0], "--resource", f"topic:{secured.topic}", "--actions", "ADMIN", "--deny")
    for address in c.proxies:
        wait_for_code(address, secured.topic, carol, "FORBIDDEN")
    c.admin("user", "delete", carol[0])
    for address in c.proxies:
        wait_for_code(address, secured.topic, carol, "UNAUTHORIZED")


def test_rules_are_scoped_to_their_namespace(secured: Secured) -> None:
    c = secured.cluster
    ns = f"ns{uuid.uuid4().hex[:6]}"
    dave = (f"dave{uuid.uuid4().hex[:6]}", "dave-secret")
    c.create_topic(f"{ns}%{secured.topic}")
    c.admin("user", "create", dave[0], "--secret", dave[1])
    c.admin("acl", "grant", dave[0], "--namespace", ns, "--resource", "topic:*", "--actions", "PUB")
    for proxy in c.proxies:  # the producer may reach any of them
        wait_for_code(proxy, secured.topic, dave, "OK", namespace=ns)
    address = c.first_proxy
    # The same short name in the default namespace is another topic, not covered by the rule.
    assert route_code(address, secured.topic, dave)[0] == "FORBIDDEN"
    producer = Producer(config(secured, dave, namespace=ns), (secured.topic,))
    producer.startup()
    try:
        assert send_all(producer, [message(secured.topic, b"in namespace")])
    finally:
        producer.shutdown()


def test_producer_over_its_limit_is_refused_while_another_tenant_flows(
    secured: Secured, unique: Callable[[str], str]
) -> None:
    c = secured.cluster
    limited, free = c.create_topic(unique("orders-lim")), c.create_topic(unique("orders-free"))
    c.admin("limit", "set", "--topic", limited, "--messages-per-s", "5")
    address = c.first_proxy
    counts = {"limited_ok": 0, "limited_refused": 0, "free_ok": 0, "free_other": 0}
    deadline = time.monotonic() + PICKUP_TIMEOUT_S
    with raw.stub(address) as s:
        while counts["limited_refused"] == 0:  # until the proxy has the limit
            assert time.monotonic() < deadline, "the limit never took effect"
            probe = raw.send(s, raw.message(limited), metadata=signed(ALICE))
            counts["limited_refused"] += raw.code_name(probe.status.code) == "TOO_MANY_REQUESTS"
        counts["limited_refused"] = 0
        for _ in range(60):
            response = raw.send(s, raw.message(limited), metadata=signed(ALICE))
            code = raw.code_name(response.status.code)
            counts["limited_ok" if code == "OK" else "limited_refused"] += 1
            assert code in ("OK", "TOO_MANY_REQUESTS")
            if code == "TOO_MANY_REQUESTS":
                assert f"topic {limited} is over its limit of 5 messages/s" in response.status.message
            other = raw.send(s, raw.message(free), metadata=signed(ALICE))
            counts["free_ok" if other.status.code == pb.OK else "free_other"] += 1
    assert counts["limited_refused"] > 0, counts
    assert counts["limited_ok"] < 60, counts
    assert counts["free_ok"] == 60 and counts["free_other"] == 0, counts
    # Under the limit nothing is refused: after a pause the bucket has refilled.
    c.admin("limit", "delete", "--topic", limited)


# At most this many limited sends (with as many free ones) before the client must have been refused.
MAX_LIMITED_SENDS = 200


def test_official_producer_over_its_limit_gets_too_many_requests(
    secured: Secured, unique: Callable[[str], str]
) -> None:
    c = secured.cluster
    limited, free = c.create_topic(unique("orders-olim")), c.create_topic(unique("orders-ofree"))
    c.admin("limit", "set", "--topic", limited, "--messages-per-s", "2")
    for address in c.proxies:  # the limit reached every proxy: a burst of raw sends is refused
        deadline = time.monotonic() + PICKUP_TIMEOUT_S
        with raw.stub(address) as s:
            while raw.send(s, *[raw.message(limited) for _ in range(5)], metadata=signed(ALICE)).status.code != (
                pb.TOO_MANY_REQUESTS
            ):
                assert time.monotonic() < deadline, f"{address} never applied the limit"
    outcomes = {"limited_ok": 0, "limited_refused": 0, "free_ok": 0}
    producer = Producer(config(secured, ALICE), (limited, free))
    producer.startup()
    # Until the client gives up on a limited send. The client retries a refused send (on the next
    # queue, so the other proxy, whose bucket holds its own share), and a loaded machine can send so
    # slowly that the buckets refill between attempts: 20 sends were once all admitted in the end.
    deadline = time.monotonic() + PICKUP_TIMEOUT_S
    try:
        for i in range(MAX_LIMITED_SENDS):
            try:
                producer.send(message(limited, f"limited {i}".encode()))
                outcomes["limited_ok"] += 1
            except TooManyRequestsException:
                outcomes["limited_refused"] += 1
            producer.send(message(free, f"free {i}".encode()))  # another tenant's sends never fail
            outcomes["free_ok"] += 1
            if outcomes["limited_refused"] or time.monotonic() > deadline:
                break
    finally:
        producer.shutdown()
    sent = outcomes["limited_ok"] + outcomes["limited_refused"]
    assert outcomes["limited_refused"] > 0 and outcomes["free_ok"] == sent, outcomes
    c.admin("limit", "delete", "--topic", limited)


def test_group_over_its_receive_limit_is_refused(secured: Secured) -> None:
    c = secured.cluster
    suffix = uuid.uuid4().hex[:6]
    topic, group = c.create_topic(f"orders-rlim-{suffix}", queues=2), c.create_group(f"rlim-{suffix}")
    erin = (f"erin{suffix}", "erin-secret")
    c.admin("limit", "set", "--group", group, "--messages-per-s", "1")
    # After the limit: once Erin's rule is in force on the proxy, so is the limit.
    c.admin("user", "create", erin[0], "--secret", erin[1])
    c.admin("acl", "grant", erin[0], "--resource", "*", "--actions", "PUB,SUB")
    address = c.first_proxy
    wait_for_code(address, topic, erin, "OK")
    with raw.stub(address) as s:
        sent = raw.send(s, *[raw.message(topic, f"r{i}".encode()) for i in range(10)], metadata=signed(erin))
        assert raw.code_name(sent.status.code) == "OK"
        broker = raw.query_route(s, topic, metadata=signed(erin)).message_queues[0].broker.name
        request = raw.receive_request(topic, group, broker=broker, batch=16)
        deadline = time.monotonic() + PICKUP_TIMEOUT_S
        refused: list[str] = []
        delivered = 0
        while not refused:  # the first receive is admitted and charged what it delivered
            assert time.monotonic() < deadline, "the receive limit never refused a receive"
            statuses, messages = raw.receive(s, request, metadata=signed(erin))
            delivered += len(messages)
            refused = [st.message for st in statuses if st.code == pb.TOO_MANY_REQUESTS]
    assert f"group {group} is over its limit of 1 messages/s" in refused[0]
    assert delivered <= 10
