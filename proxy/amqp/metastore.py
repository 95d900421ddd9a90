"""`MetaStore`: this proxy's copy of the AMQP metadata, and the one way to change it.

The document lives on the metadata home broker: the first broker by name this proxy knows (the
in-process broker in the merged topology). A change is compare-and-set: read what is newer,
apply the change to a copy, write it as the next version; when another proxy wrote first the
write is refused and the change is applied again to what it wrote. Every proxy polls the home
broker every `refresh_ms` (a poll that finds nothing newer carries no document), so a declare
on one proxy is seen by the others within that time.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
from collections.abc import Callable
from typing import TypeVar

from broker.client.amqpmeta import AmqpMetaApi
from common.errors import PreconditionFailed, SluiceError, Unavailable
from common.logs import kv
from proxy.amqp.meta import MetaDoc, decode, encode

log = logging.getLogger("sluice.proxy.amqp")

T = TypeVar("T")
_MAX_ATTEMPTS = 32  # compare-and-set rounds before a change gives up (only under heavy contention)


class MetaStore:
    def __init__(self, home: Callable[[], tuple[str, AmqpMetaApi]], *, refresh_ms: int) -> None:
        self._home = home
        self._refresh_s = refresh_ms / 1000
        self.doc = MetaDoc()
        self._lock = asyncio.Lock()  # one change at a time from this proxy

    def home_broker(self) -> str:
        return self._home()[0]

    async def refresh(self) -> None:
        _, api = self._home()
        version, data = await api.get_amqp_meta(self.doc.version)
        if version > self.doc.version:
            self.doc = decode(version, data)

    async def reload(self) -> None:
        """Take what the home broker holds, even an older version (the home broker changed)."""
        _, api = self._home()
        self.doc = decode(*await api.get_amqp_meta(0))

    async def change(self, apply: Callable[[MetaDoc], T]) -> T:
        """Apply `apply` to the newest document and store the result; `apply`'s answer. `apply`
        may raise (an AmqpError: nothing is stored) and may leave the document unchanged (nothing
        is written)."""
        async with self._lock:
            for _ in range(_MAX_ATTEMPTS):
                await self.refresh()
                base = self.doc
                new = copy.deepcopy(base)
                result = apply(new)
                data = encode(new)
                if data == encode(base):
                    return result
                new.version = base.version + 1
                _, api = self._home()
                try:
                    await api.put_amqp_meta(new.version, data)
                except PreconditionFailed:  # another proxy wrote first (or the home broker changed):
                    await self.reload()  # apply the change to what it holds
                    continue
                if self.doc.version < new.version:
                    self.doc = new
                return result
        raise Unavailable("the AMQP metadata is being changed by others too often; try again")

    async def run(self, stop: asyncio.Event) -> None:
        failing = False
        while not stop.is_set():
            try:
                await self.refresh()
                if failing:
                    log.info("AMQP metadata reachable again", extra=kv(version=self.doc.version))
                failing = False
            except SluiceError as exc:
                if not failing:
                    log.warning("AMQP metadata not reachable; keeping the last copy", extra=kv(error=exc.message))
                failing = True
            except Exception:  # never let a bug stop the refreshes
                log.exception("AMQP metadata refresh failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._refresh_s)
