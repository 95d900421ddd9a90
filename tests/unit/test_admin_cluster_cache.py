"""`Cluster.reuse`: a slowly changing answer (the proxies' client reports) is asked once per cache
time when the Cluster caches (the console), and every time when it does not (`sluice admin`); and
`nameserver list` says which NameServer does not answer."""

from __future__ import annotations

import asyncio

import pytest

from admin.cluster import Cluster, view
from admin.nameservers import list_nameservers
from common.errors import Unavailable

CLOSED = "127.0.0.1:1"


def asks(cache_s: float, calls: int) -> int:
    count = 0

    async def ask() -> int:
        nonlocal count
        count += 1
        return count

    async def main() -> None:
        async with Cluster(CLOSED, nameserver_cache_s=cache_s) as cluster:
            answers = [await cluster.reuse("clients", ask) for _ in range(calls)]
            assert answers == ([1] * calls if cache_s else list(range(1, calls + 1)))

    asyncio.run(main())
    return count


def test_a_reused_answer_is_asked_once_per_cache_time_and_always_without_a_cache() -> None:
    assert asks(cache_s=60, calls=3) == 1
    assert asks(cache_s=0, calls=3) == 3


def test_a_view_reuses_only_what_it_asked_itself() -> None:
    """A console page (a view) never shows an answer asked before it began: the AMQP page showed 0
    consumers from a client list its sampler had read, right after `sluice admin` showed 1."""
    count = 0

    async def ask() -> int:
        nonlocal count
        count += 1
        return count

    async def main() -> None:
        async with Cluster(CLOSED, nameserver_cache_s=60) as cluster:
            assert await cluster.reuse("clients", ask) == 1  # the sampler, or an earlier page
            with view():
                assert [await cluster.reuse("clients", ask) for _ in range(3)] == [2, 2, 2]  # once per page
            with view():
                assert await cluster.reuse("clients", ask) == 3
            assert await cluster.reuse("clients", ask) == 3  # outside a view: anything within the cache time

    asyncio.run(main())


def test_a_reused_broker_failure_keeps_its_own_message() -> None:
    async def ask() -> int:
        raise Unavailable("broker b1 is down")

    async def main() -> None:
        async with Cluster(CLOSED, nameserver_cache_s=60) as cluster:
            with pytest.raises(Unavailable, match="broker b1 is down"):  # not "cannot reach any NameServer"
                await cluster.reuse("clients", ask)

    asyncio.run(main())


def test_a_nameserver_that_does_not_answer_is_listed_as_unreachable() -> None:
    report = asyncio.run(list_nameservers(CLOSED, timeout_s=1))
    assert [(r["nameserver"], r["health"], r["brokers"]) for r in report.rows] == [(CLOSED, "unreachable", None)]
    assert report.rows[0]["error"] and report.note == "1 NameServer(s), 1 not answering"
