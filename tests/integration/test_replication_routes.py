"""The NameServer's route of a broker group across a paused primary (docs/replication.md, "Routing").

Three real `sluice broker` processes on a real etcd and a real NameServer. The primary is paused
(SIGSTOP) past its term, a successor is elected and registers under the group's name; then the old
primary wakes. Its heartbeat timer has long run out, so before the fix its registrar sent at once,
routing the group back to the deposed member (which refuses everything), and its unregistering as
it stepped down a moment later took the group out of every route until the successor's next
heartbeat: proxies sent to a fenced member, then to nobody. (It sends when the term's end waits for
calls it cancels, as under traffic: here a receive long-polling when the pause began.) A primary
past its term registers nothing: the route stays on the successor throughout.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.client.api import GroupSpec, PopRequest, TopicSpec
from broker.client.remote import RemoteBroker
from common.errors import SluiceError
from nameserver.client import NameServerClient
from tests.helpers.broker_fixtures import ServerProcess, start_broker_process, start_nameserver_process
from tests.helpers.etcd import EtcdProcess, start_etcd
from tests.integration.test_replication_failover import GROUP, TIMEOUT_S, _etcd_json, _in_sync, _settings, _wait_for

TOPIC = "orders"
READERS = "readers"
HEARTBEAT_S = 1.0  # the brokers' heartbeat_interval_s (`_settings`)
WATCH_S = 3.0  # after the wake: the old primary's fencing and more than one heartbeat of each member
PAUSE_KEEPALIVE_S = 60.0  # longer than any pause here: the paused primary's connection is kept


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdProcess]:
    proc = start_etcd(tmp_path)
    yield proc
    proc.stop()


def test_a_primary_woken_past_its_term_leaves_the_route_to_its_successor(etcd: EtcdProcess, tmp_path: Path) -> None:
    procs: dict[str, ServerProcess] = {}

    async def body() -> None:
        ns = procs["nameserver"] = await asyncio.to_thread(start_nameserver_process, tmp_path)
        for name in ("b1", "b2", "b3"):
            procs[name] = await asyncio.to_thread(
                start_broker_process, tmp_path, name=name, settings=_settings(etcd), namesrv=ns.address
            )
        client = NameServerClient(ns.address, timeout_s=2)

        async def routed() -> str | None:
            return next((b.address for b in await client.list_brokers() if b.broker_name == GROUP), None)

        leader = await _wait_for("a leader", lambda: _etcd_json(etcd, "leader"))
        await _wait_for("three members in sync", lambda: _in_sync(etcd, 3))
        await _wait_for("the group routed to its primary", lambda: _is(routed, leader["address"]))
        # A client that does not take the paused primary's silence for a cut: this is about what the
        # primary answers when it wakes (the proxy's default keepalive would cut the call first).
        old = RemoteBroker(GROUP, leader["address"], keepalive_s=PAUSE_KEEPALIVE_S, timeout_s=30)
        await old.create_topic(TopicSpec(TOPIC, 1))
        await old.create_group(GroupSpec(READERS))
        waiting = asyncio.create_task(old.pop(PopRequest(READERS, TOPIC, long_poll_ms=20_000)))
        await asyncio.sleep(0.5)  # the receive is long-polling on the primary
        paused = procs[leader["name"]]
        paused.child.signal(signal.SIGSTOP)
        try:

            async def successor() -> dict[str, Any] | None:
                got = await _etcd_json(etcd, "leader")
                return got if got is not None and got["name"] != leader["name"] else None

            new = await _wait_for("a new leader while the old one is paused", successor)
            await _wait_for("the group routed to the new primary", lambda: _is(routed, new["address"]))
            await asyncio.sleep(2 * HEARTBEAT_S)  # the paused member's next heartbeat is long due
        finally:
            paused.child.signal(signal.SIGCONT)
        seen: list[str | None] = []
        until = time.monotonic() + WATCH_S
        while time.monotonic() < until:
            seen.append(await routed())
            await asyncio.sleep(0.05)
        wrong = sorted({str(a) for a in seen if a != new["address"]})
        assert not wrong, f"the group was routed to {wrong} (old primary {leader['address']}, new {new['address']})"
        with pytest.raises(SluiceError, match="fenced primary"):
            await waiting  # answered nothing of its term
        await old.close()
        await client.close()

    try:
        asyncio.run(asyncio.wait_for(body(), TIMEOUT_S))
    finally:
        for proc in procs.values():
            proc.child.signal(signal.SIGCONT)
            proc.stop()


async def _is(routed: Any, address: str) -> bool:
    return bool(await routed() == address)
