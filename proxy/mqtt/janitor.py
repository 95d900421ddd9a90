"""The janitor every proxy runs for MQTT sessions (docs/mqtt.md, "Sessions"), every
`janitor_interval_s`, reading only the state store's indexes (proxy/mqtt/state.py), so a round's
work follows what expired and which proxies died, never how many sessions exist:

- **Heartbeat.** The proxy writes its own `h` entry (when it starts, then each round).
- **Expiry.** The `x` entries due (a range scan from the start of the index up to now, at most
  `SWEEP_PAGE`): each such session is dropped (its filters, group, state and record) unless its
  record changed since (compare-and-set: a reconnect moved it on).
- **Proxies that died.** A proxy whose `h` entry is older than `DEAD_ROUNDS` rounds died: the
  sessions its `w` entries name (at most `SWEEP_PAGE` a round) are marked disconnected, their wills
  published (their records keep the will of the connection), and a kick of a later epoch is written
  for that proxy in case it only paused (it then closes those connections as taken over). Once it
  owns none, its `h` entry goes.

Several proxies' janitors may meet the same entry: each change is a compare-and-set of the record,
so one of them makes it.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING

from common.errors import PreconditionFailed
from common.logs import kv
from proxy.mqtt import convert, state
from proxy.mqtt.sessions import will_from_json

if TYPE_CHECKING:
    from proxy.mqtt.sessions import SessionManager

log = logging.getLogger("sluice.proxy.mqtt")

SWEEP_PAGE = 256  # index entries one round looks at, per kind (the rest are left for the next round)
DEAD_ROUNDS = 3  # a proxy whose heartbeat is older than this many rounds died


class Janitor:
    def __init__(self, sessions: SessionManager, interval_s: float) -> None:
        self._sessions = sessions
        self.svc = sessions.svc
        self._dead_after_ms = int(DEAD_ROUNDS * interval_s * 1000)

    async def heartbeat(self) -> None:
        key = state.heartbeat_key(self.svc.proxy_id)
        await self.svc.state.write([(key, state.heartbeat_value(convert.now_ms()))])

    async def round(self) -> None:
        await self.heartbeat()
        await self.expire()
        await self.orphans()

    async def expire(self) -> None:
        """Drop the sessions whose expiry passed (at most SWEEP_PAGE of them)."""
        now = convert.now_ms()
        for key, _ in await self.svc.state.scan(state.EXPIRES, limit=SWEEP_PAGE):
            due, namespace, client_id = state.parse_expiry(key)
            if due > now:
                return
            skey = state.session_key(namespace, client_id)
            raw = await self.svc.state.get_one(skey)
            rec = None if raw is None else state.SessionRecord.decode(raw)
            if raw is None or rec is None or key not in state.index_keys(namespace, client_id, rec):
                await self.svc.state.write([], [key])  # an entry its record no longer has
                continue
            try:
                await self.svc.state.write([(skey, raw)], expect=[(skey, raw)])  # still as read: ours to drop
            except PreconditionFailed:
                continue
            log.info("MQTT session expired", extra=kv(client=client_id, namespace=namespace))
            await self._sessions.drop_stored(namespace, client_id, rec)

    async def orphans(self) -> None:
        """Mark disconnected the sessions of proxies that died (at most SWEEP_PAGE a round)."""
        now = convert.now_ms()
        budget = SWEEP_PAGE
        for key, value in await self.svc.state.scan(state.HEARTBEAT, limit=SWEEP_PAGE):
            proxy, last_ms = state.parse_heartbeat(key, value)
            if proxy == self.svc.proxy_id or now - last_ms < self._dead_after_ms:
                continue
            owned = await self.svc.state.scan(state.owned_prefix(proxy), limit=budget)
            if not owned:
                await self._forget(proxy, key, value)
                continue
            for okey, _ in owned:
                await self._orphaned(proxy, okey)
            budget -= len(owned)
            if budget <= 0:
                return

    async def _forget(self, proxy: str, key: bytes, value: bytes) -> None:
        """A dead proxy that owns no session: its kicks (no one reads them) go, then its heartbeat."""
        kicks = [k for k, _ in await self.svc.state.scan(state.kick_prefix(proxy), limit=SWEEP_PAGE)]
        with contextlib.suppress(PreconditionFailed):  # the heartbeat as read: the proxy did not come back
            await self.svc.state.write([], kicks or [key], expect=[(key, value)])

    async def _orphaned(self, proxy: str, okey: bytes) -> None:
        namespace, client_id = state.parse_owned(okey, proxy)
        skey = state.session_key(namespace, client_id)
        raw = await self.svc.state.get_one(skey)
        rec = None if raw is None else state.SessionRecord.decode(raw)
        if rec is None or rec.owner != proxy:
            await self.svc.state.write([], [okey])  # an entry its record no longer has
            return
        before = state.index_keys(namespace, client_id, rec)
        will = rec.will
        rec.owner, rec.gone_ms, rec.will = "", convert.now_ms(), None
        rec.epoch += 1  # a connection the proxy still has (it only paused) is closed by the kick
        puts, deletes = state.record_write(namespace, client_id, before, rec)
        kick = (state.kick_key(proxy, namespace, client_id), str(rec.epoch).encode())
        try:
            await self.svc.state.write([*puts, kick], deletes, expect=[(skey, raw)])
        except PreconditionFailed:
            return
        log.info("MQTT session of a proxy that stopped marked disconnected", extra=kv(client=client_id, proxy=proxy))
        if will is not None:
            await self._sessions.publish_will(namespace, f"{namespace}\x00{client_id}", will_from_json(will))
        if rec.expiry_s == 0:
            await self._sessions.drop_stored(namespace, client_id, rec)
