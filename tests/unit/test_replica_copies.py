"""A replica's copies in flight (broker/replication/replica.py `_Copies`): waiting for room or for
every copy to be written never misses the change it waits for, whatever order the acknowledging
task and the waiter run in (an `asyncio.Event` cleared by one and awaited by the other could)."""

from __future__ import annotations

import asyncio

from broker.replication.replica import COPY_PIPELINE_DEPTH, _Copies

BOUND_S = 5.0  # only catches a hang


async def _acknowledge(copies: _Copies, acked: list[int]) -> None:
    while True:
        await copies.written()
        acked.append(len(acked))


def test_drained_sees_a_copy_finished_before_it_started_waiting() -> None:
    async def body() -> None:
        loop = asyncio.get_running_loop()
        copies, acked = _Copies(), []
        acker = asyncio.ensure_future(_acknowledge(copies, acked))
        for _ in range(50):
            fut: asyncio.Future[object] = loop.create_future()
            copies.add(fut)
            await asyncio.sleep(0)  # the acknowledging task waits for it
            drained = asyncio.ensure_future(copies.drained(acker))
            fut.set_result(None)  # done before `drained` first runs
            await asyncio.wait_for(drained, BOUND_S)
        assert len(acked) == 50
        acker.cancel()

    asyncio.run(body())


def test_room_waits_for_the_oldest_copy() -> None:
    async def body() -> None:
        loop = asyncio.get_running_loop()
        copies, acked = _Copies(), []
        acker = asyncio.ensure_future(_acknowledge(copies, acked))
        futs: list[asyncio.Future[object]] = [loop.create_future() for _ in range(COPY_PIPELINE_DEPTH)]
        for fut in futs:
            await asyncio.wait_for(copies.room(acker), BOUND_S)
            copies.add(fut)
        room = asyncio.ensure_future(copies.room(acker))
        await asyncio.sleep(0)
        assert not room.done()
        futs[0].set_result(None)
        await asyncio.wait_for(room, BOUND_S)
        for fut in futs[1:]:
            fut.set_result(None)
        await asyncio.wait_for(copies.settled(), BOUND_S)
        acker.cancel()

    asyncio.run(body())
