"""`PolicySource`: keeps this proxy's copy of the cluster security document current.

Every broker holds a copy of the document (broker/security_store.py); the proxy asks every broker
it knows (the one in-process broker in the merged topology, the NameServer's brokers in the
separated one) every `refresh_s`, takes the highest version, and hands a newer one to its
listeners (access control, flow control). When no broker answers, the last good copy stays in
force and the outage is logged once; a proxy that never got a copy refuses signed requests with
a retriable error rather than guessing. Runs on the proxy's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence

from common.errors import SluiceError
from common.logs import kv
from common.security import SecurityDoc, SecurityStoreApi, decode

log = logging.getLogger("sluice.proxy.policy")

Listener = Callable[[SecurityDoc], None]


class PolicySource:
    def __init__(self, stores: Callable[[], Sequence[object]], *, refresh_s: float) -> None:
        self._stores = stores
        self._refresh_s = refresh_s
        self._listeners: list[Listener] = []
        self.doc: SecurityDoc | None = None
        self._failing = False

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)
        if self.doc is not None:
            listener(self.doc)

    async def refresh(self) -> bool:
        """Ask every store once; True if a newer document was put in force."""
        stores = [s for s in self._stores() if isinstance(s, SecurityStoreApi)]
        answers = await asyncio.gather(*(s.get_security() for s in stores), return_exceptions=True)
        good = [a for a in answers if isinstance(a, tuple)]
        failed = [a for a in answers if isinstance(a, BaseException)]
        if not good:
            if not self._failing:
                self._failing = True
                errors = "; ".join(str(e) for e in failed) or "no broker known yet"
                log.warning("no broker answered for the security document; keeping the last good copy",
                            extra=kv(version=self.doc.version if self.doc else None, error=errors))  # fmt: skip
            return False
        if self._failing:
            self._failing = False
            log.info("security document reachable again")
        # Highest version wins; equal versions (a rare concurrent edit) are ordered by content,
        # so every proxy picks the same copy.
        version, data = max(good, key=lambda a: (a[0], a[1]))
        if self.doc is not None and version <= self.doc.version:
            return False
        try:
            doc = decode(data)
        except SluiceError as exc:
            log.error("security document cannot be read; keeping the last good copy", extra=kv(error=exc.message))
            return False
        doc = SecurityDoc(version, doc.users, doc.rules, doc.limits)
        self.doc = doc
        for listener in self._listeners:
            listener(doc)
        counts = kv(version=version, users=len(doc.users), rules=len(doc.rules), limits=len(doc.limits))
        log.info("security document in force", extra=counts)
        return True

    async def run(self, stop: asyncio.Event) -> None:
        """Refresh every `refresh_s` until `stop`."""
        while not stop.is_set():
            try:
                await self.refresh()
            except Exception:  # never let a bug stop the refreshes; the last good copy stays
                log.exception("security document refresh failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._refresh_s)
