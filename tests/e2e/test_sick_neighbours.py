"""Sick neighbours of a proxy, separated topology (its own cluster: the tests stop processes):

- a NameServer that hangs (SIGSTOP, not killed) must cost requests nothing once their routes are
  known: the proxy serves cached routes and refreshes them in the background;
- brokers that hang hold requests in the proxy: the request bytes held at once are bounded per
  client and per proxy, beyond which a request is refused at once with TOO_MANY_REQUESTS;
- a proxy that dies: the proxies know each other (`--peers`) and list each other in routes, so a
  client given only the dead one retries its sends on the other instead of failing (runs last:
  it kills the first proxy).

Every stopped process is continued in a `finally`. Routes refresh every 0.5 s here, so a route is
stale well within each test.
"""

from __future__ import annotations

import re
import signal
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import grpc
import pytest
from rocketmq import ClientConfiguration, Credentials, Message, Producer
from rocketmq.grpc_protocol import service_pb2 as spb

from tests.e2e.support import raw
from tests.e2e.support.cluster import Cluster, start_separated
from tests.helpers.procs import LOOPBACK, free_port

MIB = 1024 * 1024
CONFIG = f"""
[proxy]
route_refresh_s = 0.5
max_message_bytes = {5 * MIB}

[proxy.flow]
max_client_in_flight_bytes = {6 * MIB}
max_in_flight_bytes = {10 * MIB}

# Hung brokers must hold requests for HELD_S here; by default the proxy drops a connection whose
# pings go unanswered for a second and fails its calls (docs/proxy.md).
[proxy.brokers]
keepalive_s = 60.0
keepalive_timeout_s = 60.0
"""
BODY = b"b" * (3 * MIB + MIB // 2)  # two of them are over a client's 6 MiB, three over the proxy's 10 MiB
FAST_DEADLINE_S = 2.0  # below the proxy's NameServer timeout (3 s): a request waiting for it fails
HELD_S = 20.0


@pytest.fixture(scope="module")
def sick(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("sick-neighbours")
    config = root / "sluice.toml"
    config.write_text(CONFIG)
    ports = [free_port(), free_port()]
    peers = ";".join(f"{LOOPBACK}:{port}" for port in ports)  # each proxy leaves itself out
    # One process per proxy: route caches and in-flight limits are a process's own, and these tests
    # measure those of the proxy they talk to (a proxy's workers each have theirs; docs/workers.md).
    cluster = start_separated(
        root / "cluster",
        config=config,
        proxy_args=["--peers", peers, "--drain-s", "0", "--workers", "1"],
        proxy_ports=ports,
    )
    try:
        yield cluster
    finally:
        problems = cluster.stop()
        assert not problems, "cluster teardown:\n" + "\n".join(problems)


@contextmanager
def stopped(cluster: Cluster, *names: str) -> Iterator[None]:
    """SIGSTOP processes (hung, not dead) for the block; always SIGCONT them after."""
    try:
        for name in names:
            cluster.processes[name].signal(signal.SIGSTOP)
        yield
    finally:
        for name in names:
            cluster.processes[name].signal(signal.SIGCONT)


def send_code(address: str, topic: str, body: bytes = b"x", *, client_id: str = "sick@1@0@x",
              timeout_s: float = FAST_DEADLINE_S) -> str:  # fmt: skip
    with raw.stub(address) as s:
        try:
            response = s.SendMessage(spb.SendMessageRequest(messages=[raw.message(topic, body)]),
                                     metadata=raw.headers(client_id=client_id), timeout=timeout_s)  # fmt: skip
        except grpc.RpcError as exc:
            return f"grpc:{exc.code().name}"  # type: ignore[attr-defined]
    return raw.code_name(response.status.code)


def test_a_hung_nameserver_costs_requests_nothing(sick: Cluster, unique: Callable[[str], str]) -> None:
    """Before: once a route was older than route_refresh_s every request waited for the NameServer
    (3 s timeout) and the failure did not reset the route's age: sends with a 2 s deadline failed."""
    topic = sick.create_topic(unique("t"), queues=2)
    group = sick.create_group(unique("g"))
    proxy = sick.first_proxy
    assert send_code(proxy, topic) == "OK"  # the route is cached now
    config = ClientConfiguration(proxy, Credentials(), request_timeout=int(FAST_DEADLINE_S))
    producer = Producer(config, (topic,))
    producer.startup()
    try:
        with stopped(sick, "nameserver"):
            time.sleep(1.5)  # three refresh periods: every cached route is stale
            codes = [send_code(proxy, topic) for _ in range(10)]
            assert codes == ["OK"] * 10
            for i in range(10):  # the official client, on its own deadline
                message = Message()
                message.topic, message.body = topic, f"during the hang {i}".encode()
                producer.send(message)
            # A receive and an ack with a forged handle naming a broker nobody knows: answered, not stalled.
            with raw.stub(proxy) as s:
                statuses, _ = raw.receive(s, raw.receive_request(topic, group, long_poll_s=0))
                assert [raw.code_name(st.code) for st in statuses] in (["OK"], ["MESSAGE_NOT_FOUND"])
                for _ in range(3):
                    ack = s.AckMessage(spb.AckMessageRequest(
                        group=raw.resource(group), topic=raw.resource(topic),
                        entries=[spb.AckMessageEntry(message_id="m", receipt_handle="forged-broker~AAAAAAAA")],
                    ), metadata=raw.headers(), timeout=FAST_DEADLINE_S)  # fmt: skip
                    assert raw.code_name(ack.status.code) == "INVALID_RECEIPT_HANDLE"
    finally:
        producer.shutdown()
    assert send_code(proxy, topic) == "OK"  # and after the NameServer is back


def _in_flight_bytes(cluster: Cluster, proxy: str) -> float:
    address = cluster.ops[cluster.proxy_process(proxy)]
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    return float(re.search(r"^sluice_proxy_in_flight_bytes (\S+)$", text, flags=re.MULTILINE).group(1))  # type: ignore[union-attr]


def _wait_held(cluster: Cluster, proxy: str, at_least: int) -> None:
    deadline = time.monotonic() + 10
    while _in_flight_bytes(cluster, proxy) < at_least:
        assert time.monotonic() < deadline, f"the proxy never held {at_least} request bytes"
        time.sleep(0.05)


def test_request_bytes_in_flight_are_bounded_per_client_and_per_proxy(
    sick: Cluster, unique: Callable[[str], str]
) -> None:
    """Before: no size-based admission; every request was taken in and held."""
    topic = sick.create_topic(unique("t"), queues=2)
    proxy = sick.first_proxy
    assert send_code(proxy, topic) == "OK"
    held: dict[str, str] = {}

    def hold(client_id: str) -> threading.Thread:
        def run() -> None:
            held[client_id] = send_code(proxy, topic, BODY, client_id=client_id, timeout_s=HELD_S)

        thread = threading.Thread(target=run, name=f"held-{client_id}")
        thread.start()
        return thread

    threads = []
    with stopped(sick, *sick.brokers):  # sends wait for the brokers: their bytes stay in the proxy
        threads.append(hold("client-a"))
        _wait_held(sick, proxy, len(BODY))
        # The same client again: over its 6 MiB share, refused at once.
        assert send_code(proxy, topic, BODY, client_id="client-a") == "TOO_MANY_REQUESTS"
        assert send_code(proxy, topic, b"small", client_id="client-a") != "TOO_MANY_REQUESTS"  # room for a little
        threads.append(hold("client-b"))
        _wait_held(sick, proxy, 2 * len(BODY))
        # A third client: within its own share, but over the proxy's 10 MiB.
        assert send_code(proxy, topic, BODY, client_id="client-c") == "TOO_MANY_REQUESTS"
    for thread in threads:
        thread.join(HELD_S + 5)
    assert held == {"client-a": "OK", "client-b": "OK"}  # the held requests went through once the brokers woke
    assert _in_flight_bytes(sick, proxy) == 0
    assert send_code(proxy, topic, BODY, client_id="client-c") == "OK"


def test_a_client_given_one_proxy_carries_on_through_its_peer_when_it_dies(
    sick: Cluster, unique: Callable[[str], str]
) -> None:
    """Before: routes named only the proxy that answered, so a client given that proxy alone
    failed every send once it died (PROTOCOL-level ReconnectEndpointsCommand is ignored by the
    Python client, so the routes are what can help)."""
    topic = sick.create_topic(unique("t"), queues=2)
    dying, survivor = sick.proxies
    with raw.stub(dying) as s:
        route = raw.query_route(s, topic)
    assert {q.broker.endpoints.addresses[0].port for q in route.message_queues} == {
        int(dying.rsplit(":", 1)[1]), int(survivor.rsplit(":", 1)[1])}  # fmt: skip
    config = ClientConfiguration(dying, Credentials(), request_timeout=3)  # the client knows one proxy
    producer = Producer(config, (topic,))
    producer.startup()
    try:
        sent = []
        for i in range(5):
            message = Message()
            message.topic, message.body = topic, f"before {i}".encode()
            sent.append(producer.send(message).message_id)
        sick.kill(sick.proxy_process(dying))
        for i in range(20):  # every send succeeds: an attempt on the dead proxy is retried on its peer
            message = Message()
            message.topic, message.body = topic, f"after {i}".encode()
            sent.append(producer.send(message).message_id)
    finally:
        producer.shutdown()
    assert len(set(sent)) == 25
