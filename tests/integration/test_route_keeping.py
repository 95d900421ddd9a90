"""Routes do not shrink on a young NameServer's word (issue 30): real `sluice nameserver` processes,
brokers' registrations sent by our client, and the proxy's own `ClusterDirectory` reading routes.

- A NameServer marks its routes `young` for `young_s` after it starts.
- A proxy whose cached route lists brokers a young NameServer's route lacks keeps them; once the
  NameServer is no longer young, a broker it does not hold leaves the route (it is known gone).
- Several NameServers: the client merges their answers (a broker any of them holds is in the route).
Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from common.model import TopicInfo
from nameserver.client import NameServerClient
from nameserver.model import BrokerRegistration
from proxy.directory import ClusterDirectory
from tests.helpers.procs import LOOPBACK, ChildProcess, free_port, start_process

NAMESERVER_ARGV = [sys.executable, "-m", "sluice", "nameserver"]
YOUNG_S = 2.0
WAIT_S = 10.0
TOPIC = "orders"


@pytest.fixture
def start_nameserver(tmp_path: Path) -> Iterator[Callable[[int], ChildProcess]]:
    config = tmp_path / "nameserver.toml"
    config.write_text(f"[nameserver]\nyoung_s = {YOUNG_S}\n")
    started: list[ChildProcess] = []

    def start(port: int) -> ChildProcess:
        child = start_process([*NAMESERVER_ARGV, "--port", str(port), "--config", str(config)], port=port,
                              log_path=tmp_path / f"nameserver-{port}-{len(started)}.log",
                              name=f"nameserver:{port}")  # fmt: skip
        started.append(child)
        return child

    yield start
    for child in started:
        child.stop()


def _registration(broker: str) -> BrokerRegistration:
    return BrokerRegistration(cluster_name="c", broker_name=broker, address=f"{LOOPBACK}:{free_port()}",
                              topics=(TopicInfo(TOPIC, 4),))  # fmt: skip


async def _eventually(check: Callable[[], Awaitable[bool]], what: str) -> None:
    deadline = asyncio.get_running_loop().time() + WAIT_S
    while not await check():
        if asyncio.get_running_loop().time() >= deadline:
            raise AssertionError(f"not within {WAIT_S} s: {what}")
        await asyncio.sleep(0.1)


def test_a_young_nameservers_route_does_not_drop_a_broker_that_was_live(
    start_nameserver: Callable[[int], ChildProcess],
) -> None:
    port = free_port()
    ns = start_nameserver(port)
    address = f"{LOOPBACK}:{port}"

    async def body() -> None:
        registrar = NameServerClient(address, timeout_s=1.0, reconnect_backoff_max_s=0.3)
        directory = ClusterDirectory(NameServerClient(address, timeout_s=1.0, reconnect_backoff_max_s=0.3),
                                     refresh_s=3600)  # refreshed by hand below  # fmt: skip
        a, b = _registration("broker-a"), _registration("broker-b")
        try:
            await registrar.register(a)
            await registrar.register(b)
            assert [r.broker for r in await directory.route(TOPIC)] == ["broker-a", "broker-b"]

            # The NameServer restarts; broker-b re-registers first, broker-a not yet.
            ns.stop()
            start_nameserver(port)
            await _eventually(lambda: _registers(registrar, b), "broker-b registered with the restarted NameServer")
            young = await registrar.get_route(TOPIC)
            assert young.young and [x.broker_name for x in young.brokers] == ["broker-b"]
            await directory._refresh_all()
            assert [r.broker for r in await directory.route(TOPIC)] == ["broker-a", "broker-b"]  # kept

            # Up long enough and broker-a still silent: it is gone, and leaves the route.
            await _eventually(lambda: _mature(registrar), "the NameServer no longer young")
            await registrar.register(b)
            await directory._refresh_all()
            assert [r.broker for r in await directory.route(TOPIC)] == ["broker-b"]

            # broker-a comes back: in the route again.
            await registrar.register(a)
            await directory._refresh_all()
            assert [r.broker for r in await directory.route(TOPIC)] == ["broker-a", "broker-b"]
        finally:
            await directory.close()
            await registrar.close()

    asyncio.run(body())


def test_routes_of_several_nameservers_are_merged(start_nameserver: Callable[[int], ChildProcess]) -> None:
    ports = [free_port(), free_port()]
    for port in ports:
        start_nameserver(port)
    first, second = (f"{LOOPBACK}:{p}" for p in ports)

    async def body() -> None:
        async with (
            NameServerClient(first, timeout_s=1.0) as only_first,
            NameServerClient(second, timeout_s=1.0) as only_second,
            NameServerClient([first, second], timeout_s=1.0) as both,
        ):
            await only_first.register(_registration("broker-a"))  # each NameServer knows one broker
            await only_second.register(_registration("broker-b"))
            route = await both.get_route(TOPIC)
            assert [b.broker_name for b in route.brokers] == ["broker-a", "broker-b"]
            await _eventually(lambda: _mature(both), "the NameServers no longer young")
            await only_first.register(_registration("broker-a"))  # (a heartbeat: still live)
            await only_second.register(_registration("broker-b"))
            route = await both.get_route(TOPIC)
            assert [b.broker_name for b in route.brokers] == ["broker-a", "broker-b"] and not route.young

    asyncio.run(body())


async def _registers(client: NameServerClient, registration: BrokerRegistration) -> bool:
    try:
        await client.register(registration)
    except Exception:
        return False
    return True


async def _mature(client: NameServerClient) -> bool:
    return not (await client.get_route(TOPIC)).young
