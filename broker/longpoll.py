"""Long polling without threads: consumers wait on keys (a topic, a consumer group) and are woken
when something that could satisfy them happens (a dispatch into the topic, a message of the group
becoming visible again, a FIFO message group being released).

Each key has a version counter. A waiter snapshots the versions of its keys *before* it looks for
messages and waits only if none changed since, so a wakeup between "found nothing" and "started
waiting" is never missed. Event-loop thread only; `notify_threadsafe` is for the store's dispatch, on any thread.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Iterable

from broker.store.dispatcher import call_soon_from_any_thread


class LongPollHub:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._versions: collections.Counter[str] = collections.Counter()
        self._waiters: dict[str, set[asyncio.Future[None]]] = {}
        self.waiting = 0

    def snapshot(self, keys: Iterable[str]) -> tuple[tuple[str, int], ...]:
        return tuple((k, self._versions[k]) for k in keys)

    async def wait(self, snapshot: tuple[tuple[str, int], ...], timeout_s: float) -> bool:
        """Wait until any key changes after `snapshot`, or the timeout; True if woken."""
        if timeout_s <= 0:
            return False
        if any(self._versions[k] != v for k, v in snapshot):
            return True
        fut: asyncio.Future[None] = self._loop.create_future()
        keys = [k for k, _ in snapshot]
        for k in keys:
            self._waiters.setdefault(k, set()).add(fut)
        self.waiting += 1
        try:
            await asyncio.wait_for(fut, timeout_s)
            return True
        except TimeoutError:
            return False
        finally:
            self.waiting -= 1
            for k in keys:
                ws = self._waiters.get(k)
                if ws is not None:
                    ws.discard(fut)
                    if not ws:
                        del self._waiters[k]

    def notify(self, keys: Iterable[str]) -> None:
        for k in keys:
            self._versions[k] += 1
            for fut in self._waiters.pop(k, ()):
                if not fut.done():
                    fut.set_result(None)

    def forget(self, key: str) -> None:
        """Drop the version of a key nobody waits on (a departed lite consumer's)."""
        if key not in self._waiters:
            self._versions.pop(key, None)

    def notify_threadsafe(self, keys: Iterable[str]) -> None:
        """`notify` from a dispatch listener: the writer's thread, or the loop's own when it wrote inline."""
        call_soon_from_any_thread(self._loop, self.notify, list(keys))


def topic_key(topic: str) -> str:
    return f"t:{topic}"


def group_key(group: str) -> str:
    return f"g:{group}"


def lite_client_key(group: str, client_id: str) -> str:
    """One lite consumer: woken by what concerns its own lite topics, not by the whole group's."""
    return f"l:{group}\0{client_id}"
