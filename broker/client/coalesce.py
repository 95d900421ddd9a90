"""Acks to a remote broker, coalesced: one Ack call for the acks that arrive together.

The official clients acknowledge one message per AckMessage, so a proxy serving many consumers
makes one internal Ack call per message: each costs the proxy and the broker a whole gRPC call,
where the broker's work per handle is small. Here acks of one (group, topic) leave one call at a
time; acks made while it is in flight wait and leave together in the next, up to `max_handles`
per call. At low load an ack leaves at once (on the loop's next turn); under load one call carries
many (the same scheme as sends, `RemoteBroker._drain_sends`). Each caller gets the results of its
own handles, in its order; a failed call fails each of its callers with that error.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import TypeVar

from broker.client.api import AckResult
from common.errors import RequestTimeout, Unavailable

T = TypeVar("T")

# (group, topic, handles, timeout_s, (request id, client id) to carry)
AckCall = Callable[[str, str, list[str], float, tuple[str, str]], Awaitable[list[AckResult]]]


@dataclass(slots=True)
class _Waiting:
    handles: list[str]
    future: asyncio.Future[list[AckResult]]
    deadline: float | None  # time.monotonic() of its client's deadline; None: none
    ids: tuple[str, str]  # request id and client id of the request it serves


@dataclass(slots=True)
class _Lane:
    waiting: collections.deque[_Waiting] = field(default_factory=collections.deque)
    task: asyncio.Task[None] | None = None


class AckCoalescer:
    """Acks per (group, topic), one call in flight per pair; `call` makes the Ack call."""

    def __init__(self, call: AckCall, *, max_handles: int, timeout_s: float, target: str) -> None:
        self._call = call
        self._max = max_handles
        self._timeout_s = timeout_s
        self._target = target
        self._lanes: dict[tuple[str, str], _Lane] = {}

    async def ack(
        self, group: str, topic: str, handles: list[str], deadline: float | None, ids: tuple[str, str]
    ) -> list[AckResult]:
        key = (group, topic)
        lane = self._lanes.get(key)
        if lane is None:
            lane = self._lanes[key] = _Lane()
        future: asyncio.Future[list[AckResult]] = asyncio.get_running_loop().create_future()
        lane.waiting.append(_Waiting(handles, future, deadline, ids))
        if lane.task is None:
            lane.task = asyncio.get_running_loop().create_task(self._drain(key, lane), name=f"acks-{self._target}")
        return await future

    async def _drain(self, key: tuple[str, str], lane: _Lane) -> None:
        try:
            while taken := self._take(lane):
                await self._send(key, taken)
        finally:
            lane.task = None
            for w in lane.waiting:  # only when this task was cancelled (the loop is shutting down)
                settle(w.future, Unavailable(f"{self._target}: the ack was cancelled"))
            lane.waiting.clear()
            if self._lanes.get(key) is lane:
                del self._lanes[key]

    def _take(self, lane: _Lane) -> list[_Waiting]:
        """The oldest waiting acks within one call's bound; those whose client gave up are settled."""
        taken: list[_Waiting] = []
        count = 0
        now = time.monotonic()
        while lane.waiting and (not taken or count + len(lane.waiting[0].handles) <= self._max):
            w = lane.waiting.popleft()
            if w.deadline is not None and w.deadline <= now:
                settle(w.future, RequestTimeout(f"{self._target}: the client's deadline passed before the ack left"))
            if not w.future.done():
                taken.append(w)
                count += len(w.handles)
        return taken

    async def _send(self, key: tuple[str, str], taken: list[_Waiting]) -> None:
        handles = [h for w in taken for h in w.handles]
        timeout = batch_timeout((w.deadline for w in taken), self._timeout_s)
        try:
            # A lone ack carries its request's ids, as a call of its own would; several carry none.
            ids = taken[0].ids if len(taken) == 1 else ("", "")
            results = await self._call(key[0], key[1], handles, timeout, ids)
        except asyncio.CancelledError:
            for w in taken:
                settle(w.future, Unavailable(f"{self._target}: the ack was cancelled"))
            raise
        except Exception as exc:
            for w in taken:
                settle(w.future, exc)
            return
        start = 0
        for w in taken:
            settle(w.future, results[start : start + len(w.handles)])
            start += len(w.handles)


def batch_timeout(deadlines: Iterable[float | None], timeout_s: float) -> float:
    """How long to wait for the answer to one call serving several callers: `timeout_s`, or less
    when every caller stops waiting sooner (the latest of their deadlines, on time.monotonic(); at
    least a millisecond). A caller without a deadline waits `timeout_s`."""
    latest = 0.0
    for deadline in deadlines:
        if deadline is None:
            return timeout_s
        latest = max(latest, deadline)
    return max(0.001, min(timeout_s, latest - time.monotonic()))


def settle(future: asyncio.Future[T], outcome: T | BaseException) -> None:
    """Give a waiting caller its outcome, unless it stopped waiting (was cancelled) meanwhile."""
    if future.done():
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)
