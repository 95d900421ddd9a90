"""Bounds and task ownership in the proxy: clients of brokers that moved are closed by tasks the
directory owns, releases of a departed client's messages by tasks the renewer owns, and the
caches that start over when full are sized by configuration."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from broker.client.remote import RemoteBroker
from common.errors import Unavailable
from nameserver.model import BrokerStatus
from proxy.config import ReceiveConfig
from proxy.core.producer import ProducerService
from proxy.core.renewer import AutoRenewer
from proxy.directory import BrokerDirectory, ClusterDirectory
from tests.helpers.records import outgoing

TIMEOUT_S = 10.0


class _NameServer:
    """Answers list_brokers with whatever address the test set last."""

    def __init__(self) -> None:
        self.address = "127.0.0.1:1"
        self.closed = False

    async def list_brokers(self, cluster_name: str = "") -> list[BrokerStatus]:
        return [BrokerStatus("c", "b1", self.address, 0, 0.0)]

    async def close(self) -> None:
        self.closed = True


def test_a_broker_that_moved_is_closed_by_a_task_the_directory_waits_for() -> None:
    async def scenario() -> None:
        ns = _NameServer()
        directory = ClusterDirectory(cast(Any, ns), refresh_s=60.0)
        await directory.refresh_brokers()
        first = directory.broker("b1")
        ns.address = "127.0.0.1:2"
        await directory.refresh_brokers()
        second = directory.broker("b1")
        assert first is not second and isinstance(first, RemoteBroker)
        await directory.close()
        assert ns.closed
        for remote in (first, second):  # both closed: a send fails at once rather than connecting
            with pytest.raises(Unavailable, match="client is closed"):
                await cast(RemoteBroker, remote).send("t", 0, [outgoing(b"x", "id")])
        assert all(t.get_name() != "close-b1" for t in asyncio.all_tasks())

    asyncio.run(asyncio.wait_for(scenario(), TIMEOUT_S))


class _StuckBroker:
    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.cancelled = False

    async def change_invisible_duration(self, group: str, topic: str, handle: str, invisible_ms: int) -> str:
        self.started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        return handle


class _OneBroker:
    def __init__(self, broker: _StuckBroker) -> None:
        self._broker = broker

    def broker(self, name: str) -> Any:
        return self._broker


def test_releases_of_a_departed_client_end_with_the_renewer() -> None:
    async def scenario() -> None:
        stuck = _StuckBroker()
        renewer = AutoRenewer(cast(BrokerDirectory, _OneBroker(stuck)), ReceiveConfig(renew_interval_ms=10))
        renewer.add("client-1", "b1", "g", "t", "h1", until_ms=1 << 62)
        renewer.release_client("client-1")
        await stuck.started.wait()
        stop = asyncio.Event()
        stop.set()
        await renewer.run(stop)  # returns only once the release it started has ended
        assert stuck.cancelled

    asyncio.run(asyncio.wait_for(scenario(), TIMEOUT_S))


def test_the_lease_and_selector_bounds_come_from_configuration() -> None:
    renewer = AutoRenewer(cast(BrokerDirectory, _OneBroker(_StuckBroker())), ReceiveConfig(max_leases=2))
    for i in range(5):
        renewer.add("c", "b1", "g", "t", f"h{i}", until_ms=1)
    assert list(renewer.leases) == ["h0", "h1"]
    producer = ProducerService(cast(BrokerDirectory, None), topics_max=3)
    selectors = [producer._selector(f"t{i}") for i in range(4)]  # the fourth starts the cache over
    assert producer._selector("t3") is selectors[3] and producer._selector("t0") is not selectors[0]
