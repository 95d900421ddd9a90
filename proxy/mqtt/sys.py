"""`$SYS/broker/...` topics as Mosquitto publishes them (docs/mqtt.md, "$SYS"): this proxy's
counters, sent every `sys_interval_s` (and at once on subscribe) to the sessions connected here
that subscribe to them, QoS 0 with RETAIN set. They are the proxy's own (each proxy, each shard of
`sluice up`, answers for itself, as each Mosquitto does) and are never stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING

from common.litefilter import matches
from common.version import sluice_version
from proxy.mqtt import convert
from proxy.mqtt.subscriptions import Subscription

if TYPE_CHECKING:
    from proxy.mqtt.server import Gateway
    from proxy.mqtt.session import Session


class SysTopics:
    def __init__(self, gateway: Gateway) -> None:
        self.gw = gateway
        self.started = time.monotonic()

    def values(self) -> dict[str, str]:
        stats = self.gw.svc.stats
        sessions = self.gw.sessions.connections
        subs = sum(len(c.session.subs) for c in sessions.values() if c.session is not None)
        return {
            "$SYS/broker/version": f"sluice {sluice_version()}",
            "$SYS/broker/uptime": f"{int(time.monotonic() - self.started)} seconds",
            "$SYS/broker/clients/connected": str(len(sessions)),
            "$SYS/broker/clients/total": str(len(sessions)),
            "$SYS/broker/messages/received": str(stats.messages_received),
            "$SYS/broker/messages/sent": str(stats.messages_sent),
            "$SYS/broker/publish/messages/received": str(stats.messages_received),
            "$SYS/broker/publish/messages/sent": str(stats.messages_sent),
            "$SYS/broker/publish/messages/dropped": str(stats.publish_dropped),
            "$SYS/broker/bytes/received": str(stats.bytes_received),
            "$SYS/broker/bytes/sent": str(stats.bytes_sent),
            "$SYS/broker/subscriptions/count": str(subs),
        }

    def send_all(self, session: Session, sub: Subscription, values: dict[str, str] | None = None) -> None:
        for topic, value in (values or self.values()).items():
            if matches(sub.filter.filter, topic):
                ob = convert.Outbound(topic, value.encode(), 0, True, "", 0, {})
                session.deliver_retained(ob, sub)

    async def run(self, stop: asyncio.Event) -> None:
        interval = self.gw.svc.config.sys_interval_s
        if interval <= 0:
            return
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)
            values = self.values()
            for conn in list(self.gw.sessions.connections.values()):
                session = conn.session
                if session is None:
                    continue
                for sub in list(session.subs):
                    if sub.local:
                        self.send_all(session, sub, values)
