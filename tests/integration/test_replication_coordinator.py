"""The group coordinator against a real etcd (started by the test on loopback ports).

Election happens only from the in-sync set and exactly once per vacancy; epochs are numbered in
order with their start offsets; the in-sync set can be written only by the current leader; a
member whose lease is gone (revoked, or etcd unreachable past the TTL) is fenced.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.replication.coordinator import Coordinator, InSync, MemberInfo
from broker.replication.epochs import Epoch
from common.errors import Unavailable
from tests.helpers.etcd import EtcdProcess, start_etcd

TTL_S = 2
TIMEOUT_S = 30


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdProcess]:
    proc = start_etcd(tmp_path_factory.mktemp("etcd"))
    yield proc
    proc.stop()


def _member(etcd: EtcdProcess, group: str, name: str) -> Coordinator:
    info = MemberInfo(name, f"127.0.0.1:1{name[-1]}", f"127.0.0.1:2{name[-1]}")
    return Coordinator(etcd.url, "test", group, info, lease_ttl_s=TTL_S, fence_margin_s=0.3)


def _run(coro: object) -> object:
    return asyncio.run(asyncio.wait_for(coro, TIMEOUT_S))  # type: ignore[arg-type]


def test_one_winner_per_vacancy_and_epochs_in_order(etcd: EtcdProcess) -> None:
    async def body() -> None:
        a, b, c = (_member(etcd, "g-elect", n) for n in ("m1", "m2", "m3"))
        for m in (a, b, c):
            await m.start()
        won = await asyncio.gather(a.campaign(100), b.campaign(90), c.campaign(80))
        winners = [w for w in won if w is not None]
        assert len(winners) == 1
        first = winners[0]
        assert first.epoch == 1 and (await a.leader()) == first
        assert await a.epochs() == [Epoch(1, first.start_offset)]
        insync, _ = await a.insync()
        assert insync == InSync(1, (first.name,))
        primary = {"m1": a, "m2": b, "m3": c}[first.name]
        others = [m for m in (a, b, c) if m is not primary]
        # Only the leader may publish the in-sync set; a campaign while a leader exists loses.
        assert await primary.set_insync(first, [m.member.name for m in others])
        assert not await others[0].set_insync(first, [others[0].member.name])
        assert await others[0].campaign(500) is None
        # The primary leaves: a member of the in-sync set takes over with the next epoch, and the
        # old primary is dropped from the set.
        await primary.close()
        second = await others[0].campaign(120)
        assert second is not None and second.epoch == 2 and second.name == others[0].member.name
        assert [e.number for e in await others[0].epochs()] == [1, 2]
        insync, _ = await others[0].insync()
        assert (
            insync is not None
            and first.name not in insync.members
            and set(insync.members) == {m.member.name for m in others}
        )
        for m in others:
            await m.close()

    _run(body())


def test_only_in_sync_members_may_campaign(etcd: EtcdProcess) -> None:
    async def body() -> None:
        a, b = _member(etcd, "g-insync", "m1"), _member(etcd, "g-insync", "m2")
        await a.start()
        await b.start()
        leader = await a.campaign(0)
        assert leader is not None
        assert await a.set_insync(leader, [])  # b lags: not in sync
        await a.close()  # the primary is gone, the leader key with it
        assert await b.leader() is None
        assert await b.campaign(10) is None, "a member outside the in-sync set must not be elected"
        await b.close()

    _run(body())


def test_revoked_lease_fences_the_member(etcd: EtcdProcess) -> None:
    async def body() -> None:
        a = _member(etcd, "g-fence", "m1")
        await a.start()
        assert a.term_valid()
        assert await a.refresh()
        lease = a._lease
        await a._client.revoke_lease(lease.id)  # what etcd does when the TTL runs out
        assert not await a.refresh()
        assert not a.term_valid()
        assert await a.campaign(0) is None
        await a.close()

    _run(body())


def test_term_ends_when_etcd_is_unreachable(etcd: EtcdProcess, tmp_path: Path) -> None:
    async def body() -> None:
        a = _member(etcd, "g-outage", "m1")
        await a.start()
        assert await a.refresh()
        etcd.child.signal(signal.SIGSTOP)  # etcd hangs: refreshes time out
        try:
            with pytest.raises(Unavailable):
                await a.refresh()
            # The deadline was set from the last refresh that succeeded: at most a TTL later.
            await asyncio.sleep(max(0.0, a.term_deadline - asyncio.get_running_loop().time()) + 0.05)
            assert not a.term_valid()
        finally:
            etcd.child.signal(signal.SIGCONT)
        await a.close()

    _run(body())


def test_a_member_that_lost_its_lease_joins_again_and_may_lead(etcd: EtcdProcess) -> None:
    """After etcd expired its lease (a long pause), a member joins again with a new lease that its
    keep-alive refreshes: its term is valid again past a TTL, and it can be elected."""

    async def body() -> None:
        a = _member(etcd, "g-rejoin", "m1")
        await a.start()
        stop = asyncio.Event()
        keeper = asyncio.create_task(a.keep_alive(stop))
        try:
            await a._client.revoke_lease(a._lease.id)  # what etcd does to the lease of a paused member
            for _ in range(100):
                if a.lease_lost:
                    break
                await asyncio.sleep(0.05)
            assert a.lease_lost and not a.term_valid()
            await a.close()  # what GroupMember does on a lost lease: leave, then join again
            await a.start()
            await asyncio.sleep(TTL_S * 1.5)  # past the new lease's first TTL: refreshed meanwhile
            assert not a.lease_lost and a.term_valid()
            assert await a.campaign(0) is not None
        finally:
            stop.set()
            await keeper
            await a.close()

    _run(body())


def test_a_restarted_member_joins_on_a_whole_lease(etcd: EtcdProcess) -> None:
    """A member restarted right after a SIGKILL waits out its previous lease (up to a TTL) before
    its name is free. Nothing refreshes its new lease meanwhile, so `start()` must hand over a
    lease with a whole TTL ahead: joining on one granted before the wait left it under a second
    (0 s by etcd's count) and a keep-alive a little late on a loaded machine lost the member key."""

    async def body() -> None:
        killed = _member(etcd, "g-restart", "m1")
        await killed.start()  # never refreshed nor revoked from here on: the process died
        again = _member(etcd, "g-restart", "m1")
        await again.start()
        left = await again._client.get_lease_info(again._lease.id)
        assert left.TTL >= TTL_S - 1, f"joined on a lease with {left.TTL} s left"
        await asyncio.sleep(0.5)  # the first refresh, late
        assert await again.refresh(), "the new lease expired before its first refresh"
        await again.close()
        await killed._client.close()

    _run(body())
