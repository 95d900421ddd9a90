"""MQTT under faults, history-checked (docs/mqtt.md, "Durable state"): a persistent QoS 2 subscriber
and a QoS 1 and a QoS 2 publisher (support/mqtt_traffic.py, each reconnecting through any proxy
with its session) run while a proxy is SIGKILLed (separated topology, two proxies), while the home
broker (the MQTT state and half the lite topics) is SIGKILLed and started again, and while the
primary of a replicated group fails over. Nothing acknowledged (PUBACK, PUBREC) is lost, every QoS 2
message is delivered exactly once, and no QoS 2 message is delivered again after its PUBCOMP.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.e2e.support.cluster import Cluster, _start, start_separated
from tests.e2e.support.history import History
from tests.e2e.support.mqtt import new_id
from tests.e2e.support.mqtt_traffic import Publisher, Subscriber, qos2_duplicates
from tests.e2e.support.replicated import CONFIG, fail_over, start_replicated, wait
from tests.helpers.etcd import start_etcd

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]
BEFORE_S, AFTER_S = 4.0, 6.0  # traffic before and after the fault
DRAIN_S = 90.0  # bounded: what was acknowledged is delivered within it (leases of 4 s, restarts)
# Deliveries a dead proxy had in flight come back after the lease: short, so the test is short.
MQTT_CONFIG = "[proxy.mqtt]\ndelivery_lease_ms = 4000\nkick_poll_ms = 200\n"


def traffic(addresses: list[str], root: str, fault: Callable[[], None]) -> tuple[History, Subscriber, list[Publisher]]:
    async def main() -> tuple[History, Subscriber, list[Publisher]]:
        history = History()
        sub = Subscriber(addresses, new_id("fsub"), f"{root}/#", 2, history)
        await sub.subscribe()
        pubs = [Publisher(addresses, new_id("fq1"), [f"{root}/a", f"{root}/b"], 1, history),
                Publisher(addresses[::-1], new_id("fq2"), [f"{root}/c", f"{root}/d"], 2, history)]  # fmt: skip
        stop_pubs, stop_sub = asyncio.Event(), asyncio.Event()
        sub_task = asyncio.create_task(sub.run(stop_sub))
        pub_tasks = [asyncio.create_task(p.run(stop_pubs)) for p in pubs]
        await asyncio.sleep(BEFORE_S)
        before = len(history.sends)
        await asyncio.to_thread(fault)
        await asyncio.sleep(AFTER_S)
        stop_pubs.set()
        await asyncio.wait_for(asyncio.gather(*pub_tasks), DRAIN_S)
        assert len(history.sends) > before, "no publish was acknowledged after the fault"
        deadline = time.monotonic() + DRAIN_S
        while set(history.sends) - set(history.deliveries) and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.2)
        await asyncio.sleep(1.0)  # a late duplicate, if any, shows in the history
        stop_sub.set()
        await sub_task
        return history, sub, pubs

    return asyncio.run(main())


def check(history: History, sub: Subscriber, pubs: list[Publisher]) -> None:
    verdict = history.verdict()
    summary = f"{verdict.summary()}; publishers {[(p.qos, p.sent, p.failures) for p in pubs]}"
    verdict.assert_nothing_lost()
    assert not qos2_duplicates(history, sub), f"QoS 2 delivered twice: {qos2_duplicates(history, sub)[:5]}; {summary}"
    assert verdict.acknowledged > 0, summary


@pytest.fixture(scope="module")
def separated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("mqtt-faults")
    config = root / "mqtt.toml"
    config.write_text(MQTT_CONFIG)
    cluster = start_separated(root, mqtt=True, config=config)
    try:
        yield cluster
    finally:
        problems = cluster.stop()
        assert not problems, "cluster teardown:\n" + "\n".join(problems)


def start_again(cluster: Cluster, name: str) -> None:
    argv, port, ready = cluster.launches[name]
    _start(cluster, name, argv, port, ready, log_name=f"{name}-again-{time.monotonic_ns()}")
    cluster.killed.discard(name)


def test_proxy_sigkill(separated: Cluster, unique: Callable[[str], str]) -> None:
    victim = separated.proxy_process(separated.proxies[0])  # the one with worker processes

    def fault() -> None:
        separated.kill(victim)

    history, sub, pubs = traffic(separated.mqtt, unique("pk"), fault)
    start_again(separated, victim)
    check(history, sub, pubs)
    assert sub.failures + sum(p.failures for p in pubs) > 0, "the kill ended no client's connection"


def test_home_broker_sigkill(separated: Cluster, unique: Callable[[str], str]) -> None:
    """broker-a holds the MQTT state (sessions, QoS 2 packet ids) and half the lite topics."""

    def fault() -> None:
        separated.kill("broker-a")
        time.sleep(2.0)
        start_again(separated, "broker-a")

    history, sub, pubs = traffic(separated.mqtt, unique("bk"), fault)
    check(history, sub, pubs)


def test_replicated_primary_failover(tmp_path: Path, unique: Callable[[str], str]) -> None:
    etcd = start_etcd(tmp_path)
    (tmp_path / "group").mkdir()
    cluster = start_replicated(tmp_path / "group", etcd.url, config_text=CONFIG + MQTT_CONFIG, proxies=2, mqtt=True)
    try:
        wait("MQTT served", lambda: bool(cluster.mqtt))
        history, sub, pubs = traffic(cluster.mqtt, unique("fo"), lambda: fail_over(cluster))
        check(history, sub, pubs)
    finally:
        problems = cluster.stop()
        etcd.stop()
        assert not problems, "cluster teardown:\n" + "\n".join(problems)
