"""MQTT 3.1.1 and 5.0 end to end (docs/mqtt.md), on both shared topologies: paho-mqtt in both
versions, aiomqtt, gmqtt and mosquitto_pub/mosquitto_sub, unchanged, against `sluice up --shards 2`
(both shards serve the MQTT port) and two separated proxies (the first with worker processes).

Every wait is bounded (support/mqtt.py); nothing here asserts how fast.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from collections.abc import Callable

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.e2e.support.cluster import Cluster
from tests.e2e.support.metrics import scrape, total
from tests.e2e.support.mqtt import Paho, Raw, host_port, new_id, publish_packet

pytestmark = pytest.mark.timeout(120)
QUIET_S = 1.0  # how long a test waits to see that nothing more arrives


def topic(unique: Callable[[str], str], *levels: str) -> str:
    return "/".join([unique("m"), *levels])


@pytest.mark.parametrize("version", [4, 5])
def test_publish_and_subscribe_at_each_qos_with_wildcards(cluster: Cluster, unique: Callable[[str], str],
                                                          version: int) -> None:  # fmt: skip
    root = topic(unique)
    sub = Paho(cluster.mqtt[0], version=version)
    pub = Paho(cluster.mqtt[-1], version=version)
    try:
        assert [int(c.value if hasattr(c, "value") else c) for c in sub.subscribe(f"{root}/+/t", 2)] == [2]
        sub.subscribe(f"{root}/b/#", 1)
        for qos in (0, 1, 2):
            pub.publish(f"{root}/a/t", f"a{qos}", qos)
        pub.publish(f"{root}/b/c/d", "deep", 2)
        pub.publish(f"{root}/a/x", "unmatched", 1)
        pub.publish(f"{root}/b/t", "both", 2)  # matched by both filters: one copy, at the higher QoS
        got = sub.take(5)
        assert sorted((m.topic, m.payload.decode(), m.qos) for m in got) == sorted([
            (f"{root}/a/t", "a0", 0), (f"{root}/a/t", "a1", 1), (f"{root}/a/t", "a2", 2),
            (f"{root}/b/c/d", "deep", 1), (f"{root}/b/t", "both", 2)])  # fmt: skip
        assert not any(m.retain for m in got)
        assert sub.quiet(QUIET_S) == []
    finally:
        sub.disconnect()
        pub.disconnect()


def test_messages_of_one_topic_arrive_in_order_and_empty_payloads_too(cluster: Cluster,
                                                                     unique: Callable[[str], str]) -> None:  # fmt: skip
    t = topic(unique, "seq")
    sub = Paho(cluster.mqtt[0], version=4)
    pub = Paho(cluster.mqtt[0], version=4)
    try:
        sub.subscribe(t, 1)
        for i in range(30):
            pub.publish(t, b"" if i == 7 else str(i).encode(), 1)
        got = [m.payload for m in sub.take(30)]
        assert got == [b"" if i == 7 else str(i).encode() for i in range(30)]
    finally:
        sub.disconnect()
        pub.disconnect()


def test_retained_messages(cluster: Cluster, unique: Callable[[str], str]) -> None:
    root = topic(unique)
    pub = Paho(cluster.mqtt[0])
    try:
        pub.publish(f"{root}/lamp", "on", 1, retain=True)
        pub.publish(f"{root}/door", "closed", 2, retain=True)
        pub.publish(f"{root}/door", "open", 1, retain=True)  # replaces
        late = Paho(cluster.mqtt[-1])
        late.subscribe(f"{root}/+", 2)
        got = {m.topic: (m.payload, m.retain, m.qos) for m in late.take(2)}
        assert got == {f"{root}/lamp": (b"on", True, 1), f"{root}/door": (b"open", True, 1)}
        pub.publish(f"{root}/lamp", "off", 1, retain=True)  # to an established subscription: RETAIN 0
        live = late.get()
        assert (live.payload, live.retain) == (b"off", False)
        pub.publish(f"{root}/door", b"", 1, retain=True)  # clears it (and is delivered)
        assert late.get().payload == b""
        late.disconnect()
        again = Paho(cluster.mqtt[0])
        again.subscribe(f"{root}/#", 1)
        assert [(m.topic, m.payload) for m in again.take(1)] == [(f"{root}/lamp", b"off")]
        assert again.quiet(QUIET_S) == []
        again.subscribe(f"{root}/#", 1, retain_handling=1)  # exists: no retained again
        assert again.quiet(QUIET_S) == []
        again.disconnect()
        rap = Paho(cluster.mqtt[0])
        rap.subscribe(f"{root}/lamp", 1, retain_as_published=True, retain_handling=2)
        assert rap.quiet(QUIET_S) == []
        pub.publish(f"{root}/lamp", "dim", 1, retain=True)
        assert rap.get().retain is True  # Retain As Published keeps the flag
        rap.disconnect()
    finally:
        pub.disconnect()


@pytest.mark.parametrize("version", [4, 5])
def test_a_persistent_session_gets_what_arrived_while_it_was_away(cluster: Cluster, unique: Callable[[str], str],
                                                                  version: int) -> None:  # fmt: skip
    root = topic(unique)
    cid = new_id("pers")
    sub = Paho(cluster.mqtt[0], cid, version=version, clean=False, session_expiry=300)
    assert not sub.session_present
    sub.subscribe(f"{root}/+/x", 1)
    sub.subscribe(f"{root}/exact", 2)
    sub.disconnect()
    pub = Paho(cluster.mqtt[-1], version=version)
    for i in range(5):
        pub.publish(f"{root}/{i}/x", f"m{i}", 1)
    pub.publish(f"{root}/exact", "two", 2)
    pub.disconnect()
    back = Paho(cluster.mqtt[0], cid, version=version, clean=False, session_expiry=300)
    try:
        assert back.session_present
        got = sorted(m.payload.decode() for m in back.take(6))
        assert got == ["m0", "m1", "m2", "m3", "m4", "two"]
    finally:
        back.disconnect()
    clean = Paho(cluster.mqtt[0], cid, version=version, clean=True)  # a clean start drops it
    assert not clean.session_present
    clean.disconnect()


def test_an_offline_session_gets_what_arrives_in_bind_topics_made_meanwhile(cluster: Cluster) -> None:
    """A filter whose first level is a wildcard applies to bind topics created while its persistent
    session is offline: what is published there meanwhile is kept for it (3.1.1 and 5.0 sessions
    keep every matching message)."""
    tag = new_id("w")  # short: a lite topic name (the whole MQTT topic) holds at most 64 characters
    cid = new_id("wild")
    sub = Paho(cluster.mqtt[0], cid, clean=False, session_expiry=300)
    sub.subscribe(f"+/{tag}", 1)
    sub.disconnect()
    pub = Paho(cluster.mqtt[-1])
    fresh = new_id("nb").replace("-", "_")  # a first level no bind topic has yet
    pub.publish(f"{fresh}/{tag}", "while away", 1)
    pub.publish(f"{fresh}/other", "not matched", 1)
    pub.disconnect()
    back = Paho(cluster.mqtt[0], cid, clean=False, session_expiry=300)
    try:
        got = back.get()
        assert (got.topic, got.payload) == (f"{fresh}/{tag}", b"while away")
        assert back.quiet(QUIET_S) == []
    finally:
        back.disconnect()
        Paho(cluster.mqtt[0], cid, clean=True).disconnect()  # the session dropped


def test_a_second_connection_takes_the_session_over(cluster: Cluster, unique: Callable[[str], str]) -> None:
    cid = new_id("take")
    t = topic(unique, "t")
    first = Paho(cluster.mqtt[0], cid, clean=False, session_expiry=60)
    first.subscribe(t, 1)
    second = Paho(cluster.mqtt[-1], cid, clean=False, session_expiry=60)
    try:
        reason = first.disconnects.get(timeout=20)
        assert getattr(reason, "value", reason) == 0x8E  # Session taken over
        assert second.session_present
        pub = Paho(cluster.mqtt[0])
        pub.publish(t, "to the new one", 1)
        pub.disconnect()
        assert second.get().payload == b"to the new one"
    finally:
        second.disconnect()
        first.client.loop_stop()


def test_wills_on_a_lost_connection_and_not_on_disconnect(cluster: Cluster, unique: Callable[[str], str]) -> None:
    t = topic(unique, "will")
    watcher = Paho(cluster.mqtt[0])
    watcher.subscribe(t, 1)
    try:
        polite = Paho(cluster.mqtt[-1], version=4, will=(t, b"polite", 1, False))
        polite.disconnect()
        crashing = Paho(cluster.mqtt[-1], version=4, will=(t, b"gone", 1, False))
        crashing.drop()
        assert [m.payload for m in watcher.take(1)] == [b"gone"]
        delayed_props = Properties(PacketTypes.WILLMESSAGE)
        delayed_props.WillDelayInterval = 2
        cid = new_id("will")
        delayed = Paho(cluster.mqtt[0], cid, will=(t, b"late", 1, False), will_props=delayed_props,
                       session_expiry=60)  # fmt: skip
        delayed.drop()
        back = Paho(cluster.mqtt[0], cid, clean=False, session_expiry=60)  # back within the delay: no will
        assert watcher.quiet(3.0) == []
        back.disconnect()
    finally:
        watcher.disconnect()


def test_shared_subscriptions_split_the_messages(cluster: Cluster, unique: Callable[[str], str]) -> None:
    root = topic(unique)
    group = unique("g").replace("-", "_")
    a, b = Paho(cluster.mqtt[0]), Paho(cluster.mqtt[-1])
    plain = Paho(cluster.mqtt[0])
    pub = Paho(cluster.mqtt[-1])
    try:
        a.subscribe(f"$share/{group}/{root}/#", 1)
        b.subscribe(f"$share/{group}/{root}/#", 1)
        plain.subscribe(f"{root}/#", 1)
        for i in range(20):
            pub.publish(f"{root}/{i % 5}", f"m{i}", 1)
        everything = plain.take(20)
        assert len(everything) == 20
        deadline = time.monotonic() + 20
        shared: list[str] = []
        while len(shared) < 20 and time.monotonic() < deadline:
            for c in (a, b):
                while not c.messages.empty():
                    shared.append(c.messages.get_nowait().payload.decode())
            time.sleep(0.05)
        assert sorted(shared) == sorted(f"m{i}" for i in range(20))  # each once, across the group
    finally:
        for c in (a, b, plain, pub):
            c.disconnect()


def test_mqtt5_properties_round_trip(cluster: Cluster, unique: Callable[[str], str]) -> None:
    t = topic(unique, "p")
    sub = Paho(cluster.mqtt[0])
    pub = Paho(cluster.mqtt[-1])
    try:
        sub.subscribe(t, 1, identifier=42)
        sub.subscribe(f"{t.split('/')[0]}/#", 1, no_local=True, identifier=7)
        props = Properties(PacketTypes.PUBLISH)
        props.ContentType = "application/json"
        props.ResponseTopic = "replies/here"
        props.CorrelationData = b"\x00\x01corr"
        props.PayloadFormatIndicator = 1
        props.MessageExpiryInterval = 3600
        props.UserProperty = [("k1", "v1"), ("k2", "v2")]
        pub.publish(t, '{"x": 1}', 1, props=props)
        got = sub.get()
        assert got.props["ContentType"] == "application/json"
        assert got.props["ResponseTopic"] == "replies/here"
        assert bytes.fromhex(got.props["CorrelationData"]) == b"\x00\x01corr"
        assert got.props["PayloadFormatIndicator"] == 1
        assert 3500 <= got.props["MessageExpiryInterval"] <= 3600
        assert ["k1", "v1"] in [list(p) for p in got.props["UserProperty"]]
        assert sorted(got.props["SubscriptionIdentifier"]) == [7, 42]
        # No Local: its own publish reaches the filter without it only.
        sub.publish(t, "mine", 1)
        own = sub.get()
        assert own.payload == b"mine" and own.props["SubscriptionIdentifier"] == [42]
        expiring = Properties(PacketTypes.PUBLISH)
        expiring.MessageExpiryInterval = 1
        away = Paho(cluster.mqtt[0], new_id("exp"), clean=False, session_expiry=60)
        away.subscribe(t, 1)
        away.disconnect()
        pub.publish(t, "expires", 1, props=expiring)
        time.sleep(2.5)
        back = Paho(cluster.mqtt[0], away.client_id, clean=False, session_expiry=60)
        assert back.quiet(QUIET_S) == []  # expired while it was away: never delivered
        back.disconnect()
    finally:
        sub.disconnect()
        pub.disconnect()


def test_sys_topics(cluster: Cluster) -> None:
    c = Paho(cluster.mqtt[0], version=4)
    try:
        c.subscribe("$SYS/broker/clients/connected", 0)
        c.subscribe("#", 0)  # a wildcard never matches $SYS topics
        got = c.get()
        assert got.topic == "$SYS/broker/clients/connected" and int(got.payload) >= 1 and got.retain
    finally:
        c.disconnect()


def test_aiomqtt_and_gmqtt(cluster: Cluster, unique: Callable[[str], str]) -> None:
    import aiomqtt
    from gmqtt import Client as GmqttClient

    t = topic(unique, "async")
    host, port = host_port(cluster.mqtt[0])

    async def run() -> list[bytes]:
        got: asyncio.Queue[bytes] = asyncio.Queue()
        g = GmqttClient(new_id("gm"))
        g.on_message = lambda client, _topic, payload, qos, props: got.put_nowait(payload)
        await g.connect(host, port)
        g.subscribe(t, qos=1)
        await asyncio.sleep(0.5)
        async with aiomqtt.Client(host, port, identifier=new_id("aio")) as a:
            await a.subscribe(t, qos=1)
            await a.publish(t, b"from aiomqtt", qos=1)
            async with asyncio.timeout(15):
                async for message in a.messages:
                    assert message.payload == b"from aiomqtt"
                    break
        first = await asyncio.wait_for(got.get(), 15)
        await g.disconnect()
        return [first]

    assert asyncio.run(run()) == [b"from aiomqtt"]


@pytest.mark.skipif(shutil.which("mosquitto_pub") is None, reason="Debian's mosquitto-clients is not installed")
def test_mosquitto_clients(cluster: Cluster, unique: Callable[[str], str]) -> None:
    """mosquitto_sub makes a persistent session (-E: exits once subscribed), mosquitto_pub publishes,
    mosquitto_sub resumes the session and gets both."""
    t = topic(unique, "cli")
    host, port = host_port(cluster.mqtt[-1])
    sub = ["mosquitto_sub", "-h", host, "-p", str(port), "-t", t, "-q", "1", "-c", "-i", new_id("msub"),
           "-V", "mqttv311"]  # fmt: skip
    subprocess.run([*sub, "-E"], check=True, timeout=20)
    for payload in ("one", "two"):
        subprocess.run(["mosquitto_pub", "-h", host, "-p", str(port), "-t", t, "-m", payload, "-q", "1"],
                       check=True, timeout=20)  # fmt: skip
    out = subprocess.run([*sub, "-C", "2", "-W", "20"], check=True, timeout=25, capture_output=True, text=True)
    assert out.stdout.split() == ["one", "two"]


def until(check: Callable[[], bool], what: str, timeout_s: float = 40.0) -> None:
    """Wait for `check()` (client reports every 5 s, the janitor every 10 s), bounded."""
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"{what} not seen within {timeout_s} s"
        time.sleep(0.5)


def test_operators_list_kick_and_drop(cluster: Cluster, unique: Callable[[str], str]) -> None:
    root = topic(unique)
    cid = new_id("op")
    c = Paho(cluster.mqtt[0], cid, clean=False, session_expiry=600)
    pub = Paho(cluster.mqtt[-1])
    try:
        c.subscribe(f"{root}/+", 1, identifier=5)
        pub.publish(f"{root}/a", "kept", 1, retain=True)
        until(lambda: any(r["client_id"] == cid for r in cluster.admin("mqtt", "clients")), "the client listed")
        sessions = {r["client_id"]: r for r in cluster.admin("mqtt", "sessions")}
        assert sessions[cid]["connected"] is True and sessions[cid]["expiry_s"] == 600
        subs = [r for r in cluster.admin("mqtt", "subscriptions") if r["client_id"] == cid]
        assert [(r["filter"], r["qos"], r["identifier"]) for r in subs] == [(f"{root}/+", 1, 5)]
        retained = cluster.admin("mqtt", "retained", "--filter", f"{root}/#")
        assert [(r["topic"], r["bytes"]) for r in retained] == [(f"{root}/a", 4)]
        cluster.admin("mqtt", "delete-retained", f"{root}/a")
        assert cluster.admin("mqtt", "retained", "--filter", f"{root}/#") == []
        cluster.admin("mqtt", "kick", cid)
        reason = c.disconnects.get(timeout=20)
        assert getattr(reason, "value", reason) == 0x98  # Administrative action
        back = Paho(cluster.mqtt[0], cid, clean=False, session_expiry=600)
        assert back.session_present  # a kick keeps the session
        cluster.admin("mqtt", "drop-session", cid)
        back.disconnects.get(timeout=20)
        until(lambda: all(r["client_id"] != cid for r in cluster.admin("mqtt", "sessions")), "the session removed")
        fresh = Paho(cluster.mqtt[0], cid, clean=False, session_expiry=600)
        assert not fresh.session_present
        fresh.disconnect()
    finally:
        pub.disconnect()
        c.client.loop_stop()


def test_mqtt_metrics_move_with_mqtt_traffic(cluster: Cluster, unique: Callable[[str], str]) -> None:
    """The `sluice_mqtt_*` families (docs/metrics.md) count this test's clients, subscriptions,
    messages both ways, their payload bytes and a refused connection, summed over every process."""
    t = topic(unique, "metered")
    _, before = scrape(cluster)
    sub = Paho(cluster.mqtt[0], version=5)
    pub = Paho(cluster.mqtt[-1], version=5)
    try:
        sub.subscribe(t, 1)
        for _ in range(3):
            pub.publish(t, b"x" * 10, 1)
        assert len(sub.take(3)) == 3
        _, during = scrape(cluster)
        raw = Raw(cluster.mqtt[0])  # a packet before CONNECT: refused, the connection closed
        raw.send(publish_packet("a/b", b"x"))
        assert raw.closed()
        raw.close()
    finally:
        sub.disconnect()
        pub.disconnect()
    _, after = scrape(cluster)
    assert total(during, "sluice_mqtt_connections") >= 2
    assert total(during, "sluice_mqtt_subscriptions") >= 1
    grew = {name: total(after, name) - total(before, name) for name in (
        "sluice_mqtt_connects_total", "sluice_mqtt_refused_total")}  # fmt: skip
    assert grew["sluice_mqtt_connects_total"] >= 2 and grew["sluice_mqtt_refused_total"] >= 1, grew
    for direction in ("in", "out"):
        assert (
            total(after, "sluice_mqtt_messages_total", direction=direction)
            - total(before, "sluice_mqtt_messages_total", direction=direction)
            >= 3
        ), direction
        assert (
            total(after, "sluice_mqtt_payload_bytes_total", direction=direction)
            - total(before, "sluice_mqtt_payload_bytes_total", direction=direction)
            >= 30
        ), direction
