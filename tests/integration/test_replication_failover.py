"""A broker group of three real `sluice broker` processes on a real etcd: SIGKILL the primary, a new
one is elected from the in-sync set and holds every message the old one acknowledged; the killed
member comes back with a wiped data directory and resyncs; a paused primary is fenced and rejoins as
a replica; a short etcd pause changes nothing.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aetcd
import pytest

from broker.client import receipt
from broker.client.api import ConsumeFrom, GroupSpec, PopRequest, StoredMessage, TopicSpec
from broker.client.remote import RemoteBroker
from common.errors import SluiceError
from tests.helpers.broker_fixtures import ServerProcess, start_broker_process
from tests.helpers.etcd import EtcdProcess, start_etcd
from tests.helpers.records import outgoing

GROUP = "g1"
TOPIC = "orders"
TIMEOUT_S = 120
LEASE_TTL_S = 2
PAUSE_KEEPALIVE_S = 60.0  # longer than any pause here: the paused primary's connection is kept


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdProcess]:
    proc = start_etcd(tmp_path)
    yield proc
    proc.stop()


def _settings(etcd: EtcdProcess) -> dict[str, Any]:
    return {
        "heartbeat_interval_s": 1.0,
        "replication": {"group": GROUP, "etcd": [etcd.url], "min_insync": 2, "lease_ttl_s": LEASE_TTL_S,
                        "max_lag_ms": 1500},
    }  # fmt: skip


async def _etcd_json(etcd: EtcdProcess, key: str) -> dict[str, Any] | None:
    async with aetcd.Client(host="127.0.0.1", port=etcd.port, timeout=2) as client:
        got = await client.get(f"/sluice/sluice/groups/{GROUP}/{key}".encode())
    return None if got is None else json.loads(got.value)


async def _wait_for(what: str, check: Any, timeout_s: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = await check()
        if value:
            return value
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


async def _send(remote: RemoteBroker, tag: str) -> str:
    message_id = f"{tag}-{time.monotonic_ns()}"
    await remote.send(TOPIC, 0, [outgoing(body=message_id.encode(), message_id=message_id)])
    return message_id


def test_failover_keeps_every_acknowledged_message(etcd: EtcdProcess, tmp_path: Path) -> None:
    procs: dict[str, ServerProcess] = {}

    def start(name: str) -> ServerProcess:
        procs[name] = start_broker_process(tmp_path, name=name, settings=_settings(etcd))
        return procs[name]

    async def in_sync(n: int) -> bool:
        got = await _etcd_json(etcd, "insync")
        return got is not None and len(got["members"]) >= n

    async def body() -> None:
        for name in ("b1", "b2", "b3"):
            await asyncio.to_thread(start, name)
        leader = await _wait_for("a leader", lambda: _etcd_json(etcd, "leader"))
        await _wait_for("three members in sync", lambda: in_sync(3))
        first = leader["name"]
        remote = RemoteBroker(GROUP, leader["address"], timeout_s=5)
        await remote.create_topic(TopicSpec(TOPIC, queue_count=3))
        acked = [await _send(remote, "before") for _ in range(40)]
        # A replica refuses client calls, naming its role.
        other = next(n for n in procs if n != first)
        replica = RemoteBroker(GROUP, procs[other].address, timeout_s=5)
        with pytest.raises(SluiceError, match="replica of group g1"):
            await _send(replica, "wrong")
        await replica.close()
        procs[first].child.signal(signal.SIGKILL)
        procs[first].child.popen.wait(10)
        killed_at = time.monotonic()
        await remote.close()

        async def new_leader() -> dict[str, Any] | None:
            got = await _etcd_json(etcd, "leader")
            return got if got is not None and got["name"] != first else None

        leader = await _wait_for("a new leader", new_leader)
        assert leader["epoch"] == 2
        remote = RemoteBroker(GROUP, leader["address"], timeout_s=5)

        async def sent() -> str | None:
            try:
                return await _send(remote, "after")
            except SluiceError:
                return None

        acked.append(await _wait_for("a send on the new primary", sent))
        failover_s = time.monotonic() - killed_at
        acked += [await _send(remote, "after") for _ in range(20)]
        assert (await remote.get_topic(TOPIC)).queue_count == 3  # metadata survived the failover
        for message_id in acked:
            assert await remote.get_message(TOPIC, message_id), f"acknowledged message {message_id} was lost"
        # The killed member returns with an empty data directory (a replaced disk): it resyncs from
        # scratch, byte for byte, and rejoins the in-sync set.
        shutil.rmtree(tmp_path / first)
        await asyncio.to_thread(start, first)
        await _wait_for("the old primary back in sync", lambda: in_sync(3))
        got = await _etcd_json(etcd, "leader")
        assert got is not None and got["name"] == leader["name"]
        primary_log = sorted((tmp_path / leader["name"] / "commitlog").glob("*.log"))
        resynced_log = sorted((tmp_path / first / "commitlog").glob("*.log"))
        assert [p.read_bytes() for p in resynced_log] == [p.read_bytes() for p in primary_log]
        await remote.close()
        print(f"failover: first send acknowledged {failover_s:.2f} s after SIGKILL (lease TTL {LEASE_TTL_S} s)")

    try:
        asyncio.run(asyncio.wait_for(body(), TIMEOUT_S))
    finally:
        for proc in procs.values():
            proc.stop()


def _start_group(tmp_path: Path, etcd: EtcdProcess, procs: dict[str, ServerProcess], **replication: Any) -> None:
    settings = _settings(etcd)
    settings["replication"].update(replication)
    for name in ("b1", "b2", "b3"):
        procs[name] = start_broker_process(tmp_path, name=name, settings=settings)


async def _in_sync(etcd: EtcdProcess, n: int) -> bool:
    got = await _etcd_json(etcd, "insync")
    return got is not None and len(got["members"]) >= n


def test_a_paused_primary_is_fenced_and_rejoins_as_replica(etcd: EtcdProcess, tmp_path: Path) -> None:
    procs: dict[str, ServerProcess] = {}

    async def body() -> None:
        await asyncio.to_thread(_start_group, tmp_path, etcd, procs)
        leader = await _wait_for("a leader", lambda: _etcd_json(etcd, "leader"))
        await _wait_for("three members in sync", lambda: _in_sync(etcd, 3))
        old = RemoteBroker(GROUP, leader["address"], timeout_s=3)
        await old.create_topic(TopicSpec(TOPIC, queue_count=3))
        await _send(old, "before")
        paused = procs[leader["name"]]
        paused.child.signal(signal.SIGSTOP)
        try:

            async def new_leader() -> dict[str, Any] | None:
                got = await _etcd_json(etcd, "leader")
                return got if got is not None and got["name"] != leader["name"] else None

            successor = await _wait_for("a new leader while the old one is paused", new_leader)
            fresh = RemoteBroker(GROUP, successor["address"], timeout_s=3)
            await _wait_for("a send on the new primary", lambda: _try_send(fresh))
        finally:
            paused.child.signal(signal.SIGCONT)
        # Awake again, and clients still reach it: it must acknowledge nothing.
        for _ in range(20):
            with pytest.raises(SluiceError):
                await _send(old, "stale")
            await asyncio.sleep(0.05)
        await _wait_for("the old primary back in sync as a replica", lambda: _in_sync(etcd, 3))
        with pytest.raises(SluiceError, match="replica of group g1"):
            await _send(old, "stale")
        assert (await _etcd_json(etcd, "leader") or {}).get("name") == successor["name"]
        await old.close()
        await fresh.close()

    try:
        asyncio.run(asyncio.wait_for(body(), TIMEOUT_S))
    finally:
        for proc in procs.values():
            proc.stop()


def test_the_primary_rides_out_a_short_etcd_pause(etcd: EtcdProcess, tmp_path: Path) -> None:
    procs: dict[str, ServerProcess] = {}

    async def body() -> None:
        await asyncio.to_thread(_start_group, tmp_path, etcd, procs)
        leader = await _wait_for("a leader", lambda: _etcd_json(etcd, "leader"))
        await _wait_for("three members in sync", lambda: _in_sync(etcd, 3))
        remote = RemoteBroker(GROUP, leader["address"], timeout_s=3)
        await remote.create_topic(TopicSpec(TOPIC, queue_count=3))
        etcd.child.signal(signal.SIGSTOP)  # shorter than the lease: nobody may take over
        try:
            served = [await _try_send(remote) for _ in range(3)]
            await asyncio.sleep(0.5)
        finally:
            etcd.child.signal(signal.SIGCONT)
        assert all(served), "the primary must keep serving while its lease surely lives"
        await _wait_for("sends after the pause", lambda: _try_send(remote))
        after = await _etcd_json(etcd, "leader")
        assert after is not None and (after["name"], after["epoch"]) == (leader["name"], leader["epoch"]), (
            "no failover (and no second primary) for a pause shorter than the lease"
        )
        await remote.close()

    try:
        asyncio.run(asyncio.wait_for(body(), TIMEOUT_S))
    finally:
        for proc in procs.values():
            proc.stop()


async def _try_send(remote: RemoteBroker) -> str | None:
    try:
        return await _send(remote, "try")
    except SluiceError:
        return None


def test_a_replica_paused_past_its_lease_joins_the_group_again(etcd: EtcdProcess, tmp_path: Path) -> None:
    """A replica stalled longer than its lease (SIGSTOP here; a starved process or a long GC on a
    loaded machine alike) finds its lease expired and its member key gone when it wakes: it must
    join again with a new lease while it keeps following the same primary, not stay out of the
    group's member list (and unable to campaign) until the leader changes."""
    procs: dict[str, ServerProcess] = {}

    async def member_names() -> set[str]:
        async with aetcd.Client(host="127.0.0.1", port=etcd.port, timeout=2) as client:
            found = await client.get_prefix(f"/sluice/sluice/groups/{GROUP}/members/".encode())
        return {kv_.key.decode().rsplit("/", 1)[1] for kv_ in found}

    async def body() -> None:
        await asyncio.to_thread(_start_group, tmp_path, etcd, procs)
        leader = await _wait_for("a leader", lambda: _etcd_json(etcd, "leader"))
        await _wait_for("three members in sync", lambda: _in_sync(etcd, 3))
        replica = next(n for n in procs if n != leader["name"])
        procs[replica].child.signal(signal.SIGSTOP)
        try:
            await _wait_for("the paused replica's lease to expire", lambda: _absent(member_names, replica))
        finally:
            procs[replica].child.signal(signal.SIGCONT)
        await _wait_for("the replica back in the member list", lambda: _present(member_names, replica), 10.0)
        got = await _etcd_json(etcd, "leader")
        assert got is not None and got["name"] == leader["name"], "a replica's lease has nothing to do with the term"

    try:
        asyncio.run(asyncio.wait_for(body(), TIMEOUT_S))
    finally:
        for proc in procs.values():
            proc.stop()


async def _absent(names: Any, name: str) -> bool:
    return name not in await names()


async def _present(names: Any, name: str) -> bool:
    return name in await names()


def test_a_receive_waiting_on_a_paused_primary_is_not_answered_after_its_term(
    etcd: EtcdProcess, tmp_path: Path
) -> None:
    """A long-polling receive is waiting on the primary when it is paused; a successor is elected
    and redelivers the in-flight message. The old primary, awake again, must not answer that
    receive (its term is over): before, it delivered the same stored copy a second time, under the
    same handle version as the successor's delivery, and closing its store under the still-running
    pop logged rocksdict.DbClosedError."""
    procs: dict[str, ServerProcess] = {}
    group = "readers"

    async def body() -> None:
        await asyncio.to_thread(_start_group, tmp_path, etcd, procs)
        leader = await _wait_for("a leader", lambda: _etcd_json(etcd, "leader"))
        await _wait_for("three members in sync", lambda: _in_sync(etcd, 3))
        # A client that does not take the paused primary's silence for a cut: this is about what the
        # primary answers when it wakes (the proxy's default keepalive would cut the call first).
        old = RemoteBroker(GROUP, leader["address"], keepalive_s=PAUSE_KEEPALIVE_S, timeout_s=3)
        await old.create_topic(TopicSpec(TOPIC, queue_count=1))
        await old.create_group(GroupSpec(group, consume_from=ConsumeFrom.EARLIEST))
        await asyncio.sleep(1.0)  # a group change reaches the replicas within 0.5 s (not waited for)
        await _send(old, "m")
        popped = await old.pop(PopRequest(group, TOPIC, invisible_ms=30_000))
        assert len(popped) == 1
        # Visible again in 2 s; waiting for the replicas' STATE_ACK, so every member holds the entry.
        await old.change_invisible_duration(group, TOPIC, popped[0].receipt_handle, 2_000)
        waiting = asyncio.create_task(old.pop(PopRequest(group, TOPIC, invisible_ms=30_000, long_poll_ms=20_000)))
        await asyncio.sleep(0.2)
        paused = procs[leader["name"]]
        paused.child.signal(signal.SIGSTOP)
        try:

            async def new_leader() -> dict[str, Any] | None:
                got = await _etcd_json(etcd, "leader")
                return got if got is not None and got["name"] != leader["name"] else None

            successor = await _wait_for("a new leader while the old one is paused", new_leader)
            fresh = RemoteBroker(GROUP, successor["address"], timeout_s=3)

            async def redelivered() -> list[StoredMessage]:
                try:
                    return await fresh.pop(PopRequest(group, TOPIC, invisible_ms=30_000, long_poll_ms=1_000))
                except SluiceError:
                    return []

            again = await _wait_for("the successor's redelivery", redelivered)
        finally:
            paused.child.signal(signal.SIGCONT)
        try:
            late = await asyncio.wait_for(waiting, 30)
        except SluiceError as exc:
            assert "fenced primary" in exc.message, exc.message
            late = []
        new_version = receipt.decode(again[0].receipt_handle).version
        assert [receipt.decode(m.receipt_handle).version for m in late if m.message_id == again[0].message_id] == [], (
            f"the deposed primary delivered {late} after its successor delivered version {new_version}"
        )
        await _wait_for("the old primary back in sync as a replica", lambda: _in_sync(etcd, 3))
        await old.close()
        await fresh.close()
        for noise in ("Traceback", "DbClosedError", "Task was destroyed"):
            assert noise not in paused.output(), f"{noise} in {leader['name']}'s log:\n{paused.output()[-4000:]}"

    try:
        asyncio.run(asyncio.wait_for(body(), TIMEOUT_S))
    finally:
        for proc in procs.values():
            proc.stop()


def test_writes_pass_as_soon_as_the_other_replica_holds_them_when_one_stops_answering(
    etcd: EtcdProcess, tmp_path: Path
) -> None:
    """Three members, min_insync 2, one replica paused (SIGSTOP: its connection stays open, it
    just stops acknowledging). The primary and the other replica hold every write, so writes go
    through within their call's deadline: the paused replica leaves the in-sync set (in etcd first,
    so it cannot be elected) after `stall_ms`, not after `max_lag_ms` (20 s here; before, every
    send timed out meanwhile). Resumed, it catches up and is in sync again."""
    procs: dict[str, ServerProcess] = {}

    async def body() -> None:
        await asyncio.to_thread(_start_group, tmp_path, etcd, procs, max_lag_ms=20_000)
        leader = await _wait_for("a leader", lambda: _etcd_json(etcd, "leader"))
        await _wait_for("three members in sync", lambda: _in_sync(etcd, 3))
        remote = RemoteBroker(GROUP, leader["address"], timeout_s=5)
        await remote.create_topic(TopicSpec(TOPIC, queue_count=3))
        await _send(remote, "before")
        paused = next(n for n in sorted(procs) if n != leader["name"])
        procs[paused].child.signal(signal.SIGSTOP)
        try:
            for i in range(5):
                await _send(remote, f"during-{i}")  # each within its 5-s deadline, or it raises
            insync = await _etcd_json(etcd, "insync")
            assert insync is not None and paused not in insync["members"], insync
            assert len(insync["members"]) == 2
        finally:
            procs[paused].child.signal(signal.SIGCONT)
        await _wait_for("the paused replica in sync again", lambda: _in_sync(etcd, 3))
        after = await _etcd_json(etcd, "leader")
        assert after is not None and after["name"] == leader["name"], "a replica's pause costs the primary nothing"
        await remote.close()

    try:
        asyncio.run(asyncio.wait_for(body(), TIMEOUT_S))
    finally:
        for proc in procs.values():
            proc.stop()


def test_the_primary_keeps_its_term_through_an_etcd_pause_past_its_deadline(etcd: EtcdProcess, tmp_path: Path) -> None:
    """etcd paused longer than the primary's term deadline (TTL - margin after its last refresh:
    at most 1.6 s here) but shorter than the lease (at least 2 s after the last refresh etcd saw).
    Nobody can be elected meanwhile; the primary refuses while it cannot prove its term, and the
    first refresh etcd answers afterwards proves the lease (so the leader key) alive: it serves on
    in the same epoch. Before, the deadline ended its term and the group failed over."""
    procs: dict[str, ServerProcess] = {}

    async def body() -> None:
        await asyncio.to_thread(_start_group, tmp_path, etcd, procs, lease_ttl_s=3, fence_margin_s=1.4)
        leader = await _wait_for("a leader", lambda: _etcd_json(etcd, "leader"))
        await _wait_for("three members in sync", lambda: _in_sync(etcd, 3))
        remote = RemoteBroker(GROUP, leader["address"], timeout_s=3)
        await remote.create_topic(TopicSpec(TOPIC, queue_count=3))
        await _send(remote, "before")
        for _ in range(3):  # the old code noticed a passed deadline only between its etcd reads: often, not always
            etcd.child.signal(signal.SIGSTOP)
            try:
                await asyncio.sleep(1.8)
            finally:
                etcd.child.signal(signal.SIGCONT)
            await _wait_for("sends after the pause", lambda: _try_send(remote))
        after = await _etcd_json(etcd, "leader")
        assert after is not None and (after["name"], after["epoch"]) == (leader["name"], leader["epoch"]), (
            f"the group failed over for an etcd pause shorter than the lease: {leader} -> {after}"
        )
        assert "term over" not in procs[leader["name"]].output()
        await remote.close()

    try:
        asyncio.run(asyncio.wait_for(body(), TIMEOUT_S))
    finally:
        for proc in procs.values():
            proc.stop()
