"""Acks coalesced per (group, topic) (broker/client/coalesce.py): one call in flight per pair, the
acks made meanwhile leave together in the next, each caller gets its own results in its order, a
failed call fails each of its callers, a caller past its deadline never leaves."""

from __future__ import annotations

import asyncio
import time

import pytest

from broker.client.api import AckResult
from broker.client.coalesce import AckCoalescer
from common.errors import InvalidReceiptHandle, RequestTimeout, Unavailable


class Broker:
    """Answers every handle OK except those starting with 'bad'; records each call."""

    def __init__(self, fail: BaseException | None = None) -> None:
        self.calls: list[tuple[str, str, list[str], tuple[str, str]]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.fail = fail

    async def call(
        self, group: str, topic: str, handles: list[str], timeout_s: float, ids: tuple[str, str]
    ) -> list[AckResult]:
        self.calls.append((group, topic, list(handles), ids))
        await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        return [AckResult(h, InvalidReceiptHandle("spent") if h.startswith("bad") else None) for h in handles]


def test_acks_made_while_one_is_in_flight_leave_together() -> None:
    async def run() -> None:
        broker = Broker()
        acks = AckCoalescer(broker.call, max_handles=100, timeout_s=5.0, target="b")
        broker.gate.clear()
        first = asyncio.create_task(acks.ack("g", "t", ["h0"], None, ("r0", "c0")))
        await asyncio.sleep(0)  # the first call is now in flight
        await asyncio.sleep(0)
        rest = [asyncio.create_task(acks.ack("g", "t", [f"h{i}", f"bad{i}"], None, (f"r{i}", "c"))) for i in (1, 2, 3)]
        other = asyncio.create_task(acks.ack("g", "other-topic", ["x"], None, ("rx", "c")))
        await asyncio.sleep(0.01)
        broker.gate.set()
        assert [r.receipt_handle for r in await first] == ["h0"]
        for i, task in zip((1, 2, 3), rest, strict=True):
            results = await task
            assert [(r.receipt_handle, r.error is None) for r in results] == [(f"h{i}", True), (f"bad{i}", False)]
        assert [r.receipt_handle for r in await other] == ["x"]
        calls = {(g, t, tuple(h)): ids for g, t, h, ids in broker.calls}
        assert calls == {
            ("g", "t", ("h0",)): ("r0", "c0"),  # alone: its own request's ids
            ("g", "t", ("h1", "bad1", "h2", "bad2", "h3", "bad3")): ("", ""),  # three callers, one call
            ("g", "other-topic", ("x",)): ("rx", "c"),
        }

    asyncio.run(run())


def test_a_call_carries_at_most_max_handles() -> None:
    async def run() -> None:
        broker = Broker()
        acks = AckCoalescer(broker.call, max_handles=4, timeout_s=5.0, target="b")
        results = await asyncio.gather(*(acks.ack("g", "t", [f"h{i}a", f"h{i}b"], None, ("", "")) for i in range(5)))
        assert [[r.receipt_handle for r in rs] for rs in results] == [[f"h{i}a", f"h{i}b"] for i in range(5)]
        assert all(len(handles) <= 4 for _, _, handles, _ in broker.calls)

    asyncio.run(run())


def test_a_failed_call_fails_each_caller_and_an_expired_one_never_leaves() -> None:
    async def run() -> None:
        broker = Broker(fail=Unavailable("broker gone"))
        acks = AckCoalescer(broker.call, max_handles=100, timeout_s=5.0, target="b")
        broker.gate.clear()
        first = asyncio.create_task(acks.ack("g", "t", ["h0"], None, ("", "")))
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        late = asyncio.create_task(acks.ack("g", "t", ["late"], time.monotonic() + 0.001, ("", "")))
        waiting = asyncio.create_task(acks.ack("g", "t", ["h1"], None, ("", "")))
        await asyncio.sleep(0.02)  # the late one's deadline passes while the first call is in flight
        broker.gate.set()
        for task in (first, waiting):
            with pytest.raises(Unavailable, match="broker gone"):
                await task
        with pytest.raises(RequestTimeout):
            await late
        assert all("late" not in handles for _, _, handles, _ in broker.calls)

    asyncio.run(run())
