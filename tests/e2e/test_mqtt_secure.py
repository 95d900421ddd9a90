"""MQTT with the proxy's certificate and `--auth on`, merged and separated (docs/mqtt.md, "Sessions",
docs/security.md): MQTT over TLS and over secure WebSocket, users and passwords from `sluice admin
user`, their access rules per bind topic, and a username `ns/user` connecting to namespace `ns`."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e.support.cluster import Cluster, start_merged, start_separated
from tests.e2e.support.mqtt import Paho, Raw, connect_packet, new_id, publish_packet
from tests.helpers.tls import self_signed

pytestmark = pytest.mark.timeout(180)
RULES_WAIT_S = 30.0  # proxies read the security document every 2 s


@dataclass
class Secure:
    cluster: Cluster
    cert: Path
    prefix: str  # topics under `<prefix>...` are alice's to publish and subscribe


@pytest.fixture(scope="module", params=["merged", "separated"])
def secure(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secure]:
    root = tmp_path_factory.mktemp(f"mqtt-secure-{request.param}")
    cert, key = self_signed(root)
    args = ["--auth", "on", "--tls-cert", str(cert), "--tls-key", str(key)]
    cluster = (start_merged(root, extra_args=args, mqtt=True, shards=2) if request.param == "merged"
               else start_separated(root, proxy_args=args, mqtt=True))  # fmt: skip
    try:
        prefix = f"s{uuid.uuid4().hex[:6]}"
        cluster.admin("user", "create", "alice", "--secret", "alice-pw")
        cluster.admin("user", "create", "dave", "--secret", "dave-pw")
        cluster.admin("acl", "grant", "alice", "--resource", f"topic:{prefix}*", "--actions", "PUB,SUB")
        cluster.admin("acl", "grant", "dave", "--namespace", "tenant1", "--resource", "topic:*", "--actions", "PUB,SUB")
        # Last: a proxy that accepts zed holds this document version and all before it. Every proxy
        # (every shard behind a shared port) must, so zed is accepted several times in a row.
        cluster.admin("user", "create", "zed", "--secret", "zed-pw")
        for address in cluster.mqtt:
            until_accepted(address, cert, "zed", "zed-pw")
        yield Secure(cluster, cert, prefix)
    finally:
        problems = cluster.stop()
        assert not problems, "cluster teardown:\n" + "\n".join(problems)


def connack(address: str, cert: Path, user: str, password: str, version: int = 5) -> int:
    """The CONNACK reason (5.0) or return code (3.1.1) for these credentials, over TLS."""
    raw = Raw(address, tls=str(cert))
    raw.send(connect_packet(new_id(), version=version, username=user, password=password))
    got = raw.read()
    raw.close()
    assert got is not None and got[0] == 0x20
    return got[1][1]


def until_accepted(address: str, cert: Path, user: str, password: str, in_a_row: int = 8) -> None:
    deadline = time.monotonic() + RULES_WAIT_S
    accepted = 0
    while accepted < in_a_row:
        assert time.monotonic() < deadline, f"{user} not accepted within {RULES_WAIT_S} s"
        if connack(address, cert, user, password) == 0:
            accepted += 1
        else:
            accepted = 0
            time.sleep(0.5)


def test_tls_and_users(secure: Secure) -> None:
    c = secure.cluster
    address = c.mqtt[0]
    assert connack(address, secure.cert, "alice", "alice-pw") == 0
    assert connack(address, secure.cert, "alice", "wrong") == 0x86  # Bad user name or password
    assert connack(address, secure.cert, "mallory", "x") == 0x86
    assert connack(address, secure.cert, "alice", "wrong", version=4) == 0x04
    plain = Raw(address)  # a plain-text client cannot talk to the TLS port
    plain.send(connect_packet("c"))
    assert plain.closed()


def test_access_rules_apply_to_publish_and_subscribe(secure: Secure) -> None:
    c = secure.cluster
    mine = f"{secure.prefix}x/data"
    alice = Paho(c.mqtt[-1], username="alice", password="alice-pw", tls=str(secure.cert))
    try:
        codes = alice.subscribe(f"{mine}/#", 1)
        assert [getattr(x, "value", x) for x in codes] == [1]
        refused = alice.subscribe("elsewhere/#", 1)
        assert [getattr(x, "value", x) for x in refused] == [0x87]
        alice.publish(f"{mine}/1", "ok", 1)
        assert alice.get().payload == b"ok"
        info = alice.client.publish("elsewhere/1", "no", 1)
        info.wait_for_publish(timeout=15)
        assert alice.quiet(1.0) == []
    finally:
        alice.disconnect()
    raw = Raw(c.mqtt[0], tls=str(secure.cert))  # 3.1.1: a refused PUBLISH closes the connection
    raw.send(connect_packet(new_id(), username="alice", password="alice-pw"))
    assert raw.read() is not None
    raw.send(publish_packet("elsewhere/2", b"no", 1))
    assert raw.closed()


def test_websocket_over_tls_and_namespaces(secure: Secure) -> None:
    c = secure.cluster
    dave = Paho(c.mqtt_ws[0], username="tenant1/dave", password="dave-pw", transport="websockets",
                tls=str(secure.cert))  # fmt: skip
    other = Paho(c.mqtt[0], username="alice", password="alice-pw", tls=str(secure.cert))
    try:
        topic = f"{secure.prefix}ns/t"
        dave.subscribe(topic, 1)
        other.subscribe(topic, 1)
        pub = Paho(c.mqtt[-1], username="tenant1/dave", password="dave-pw", tls=str(secure.cert))
        pub.publish(topic, "in tenant1", 1)
        pub.disconnect()
        assert dave.get().payload == b"in tenant1"
        assert other.quiet(1.0) == []  # the same topic name in the default namespace is another topic
        assert any(row["topic"].startswith("tenant1%") for row in c.admin("topic", "list"))
    finally:
        dave.disconnect()
        other.disconnect()
