"""Auto renew: keeps push consumers' messages invisible while the consumer still holds them.

Push consumers receive with `auto_renew` and no invisible duration, may process for minutes
(FIFO local retries), and ack with the handle of the delivery. The proxy that delivered a message
leases it: every `renew_interval_ms` it extends, in the broker, the invisibility of leases that
are about to run out (the handle stays valid, see BrokerApi.renew). Leases end on ack, nack or
dead-lettering, when the client goes away (then the messages become visible again after
`release_invisible_ms`), or after `max_auto_renew_ms`.

All of this is soft state: if the proxy dies, the leases simply expire in the broker and the
messages are redelivered.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass

from common.errors import SluiceError
from common.logs import kv
from proxy.config import ReceiveConfig
from proxy.directory import BrokerDirectory

log = logging.getLogger("sluice.proxy.renew")

RELEASE_INVISIBLE_MS = 1_000


@dataclass(slots=True)
class Lease:
    broker: str
    group: str
    topic: str
    client_id: str
    until_ms: int
    started_ms: int


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class AutoRenewer:
    def __init__(self, directory: BrokerDirectory, config: ReceiveConfig) -> None:
        self._dir = directory
        self._cfg = config
        self.leases: dict[str, Lease] = {}
        self._releasing: set[asyncio.Task[None]] = set()  # releases under way; `run` waits for them

    def add(self, client_id: str, broker: str, group: str, topic: str, handle: str, until_ms: int) -> None:
        if len(self.leases) >= self._cfg.max_leases:
            return  # bounded: beyond this the message is redelivered after its invisibility
        self.leases[handle] = Lease(broker, group, topic, client_id, until_ms, _now_ms())

    def remove(self, handle: str) -> None:
        self.leases.pop(handle, None)

    def release_client(self, client_id: str) -> None:
        """The client went away: make its leased messages visible again soon."""
        handles = [h for h, lease in self.leases.items() if lease.client_id == client_id]
        if not handles:
            return
        leases = [(h, self.leases.pop(h)) for h in handles]
        log.info("releasing messages of a departed client", extra=kv(client_id=client_id, messages=len(leases)))
        task = asyncio.get_running_loop().create_task(self._release(leases), name=f"release-{client_id}")
        self._releasing.add(task)
        task.add_done_callback(self._releasing.discard)

    async def _release(self, leases: list[tuple[str, Lease]]) -> None:
        for handle, lease in leases:
            with contextlib.suppress(SluiceError):
                api = self._dir.broker(lease.broker)
                await api.change_invisible_duration(lease.group, lease.topic, handle, RELEASE_INVISIBLE_MS)

    async def renew_due(self) -> int:
        now = _now_ms()
        horizon = now + self._cfg.renew_ahead_ms
        due: dict[tuple[str, str, str], list[str]] = {}
        for handle, lease in list(self.leases.items()):
            if now - lease.started_ms > self._cfg.max_auto_renew_ms:
                del self.leases[handle]  # held too long: let it become visible and be redelivered
            elif lease.until_ms <= horizon:
                due.setdefault((lease.broker, lease.group, lease.topic), []).append(handle)
        renewed = 0
        for (broker, group, topic), handles in due.items():
            try:
                results = await self._dir.broker(broker).renew(group, topic, handles, self._cfg.auto_renew_invisible_ms)
            except SluiceError as exc:
                log.warning("auto renew failed", extra=kv(broker=broker, group=group, error=exc.message))
                continue
            until = _now_ms() + self._cfg.auto_renew_invisible_ms
            for r in results:
                held = self.leases.get(r.receipt_handle)
                if held is None:
                    continue
                if r.ok:
                    held.until_ms = until
                    renewed += 1
                else:
                    del self.leases[r.receipt_handle]  # acked, dead-lettered or expired meanwhile
        return renewed

    async def run(self, stop: asyncio.Event) -> None:
        interval = self._cfg.renew_interval_ms / 1000.0
        try:
            while not stop.is_set():
                try:
                    await self.renew_due()
                except Exception:
                    log.exception("auto renew round failed")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), interval)
        finally:
            for task in list(self._releasing):  # the messages become visible when their invisibility ends
                task.cancel()
            await asyncio.gather(*self._releasing, return_exceptions=True)
