"""What the proxies last reported of their connected clients (`sluice admin client list`).

Soft state in memory: each proxy (each worker) reports its whole list every few seconds to every
broker it knows, replacing its previous report, which is forgotten once its time to live passes
(a proxy that stopped, or lost its way to this broker). Nothing is stored on disk.
"""

from __future__ import annotations

from broker.client.api import ConnectedClient
from common.clock import SYSTEM_CLOCK, Clock
from common.errors import BadRequest

MAX_REPORTING_PROXIES = 1_000
MAX_CLIENTS_PER_REPORT = 100_000
MAX_TTL_MS = 3_600_000


class ClientTable:
    def __init__(self, clock: Clock = SYSTEM_CLOCK) -> None:
        """`clock`: a report's time to live is measured on it (common/clock.py)."""
        self._clock = clock
        self._reports: dict[str, tuple[float, list[ConnectedClient]]] = {}  # proxy -> (expires, clients)

    def report(self, proxy: str, clients: list[ConnectedClient], ttl_ms: int) -> None:
        if not proxy:
            raise BadRequest("a client report must name its proxy")
        if not 0 < ttl_ms <= MAX_TTL_MS:
            raise BadRequest(f"a client report's ttl must be between 1 and {MAX_TTL_MS} ms, got {ttl_ms}")
        if len(clients) > MAX_CLIENTS_PER_REPORT:
            raise BadRequest(f"{len(clients)} clients in one report; at most {MAX_CLIENTS_PER_REPORT}")
        now = self._clock.monotonic()
        self._expire(now)
        if proxy not in self._reports and len(self._reports) >= MAX_REPORTING_PROXIES:
            raise BadRequest(f"more than {MAX_REPORTING_PROXIES} proxies report clients to this broker")
        self._reports[proxy] = (now + ttl_ms / 1000, list(clients))

    def clients(self) -> list[ConnectedClient]:
        self._expire(self._clock.monotonic())
        return [c for _, clients in self._reports.values() for c in clients]

    def _expire(self, now: float) -> None:
        for proxy in [p for p, (expires, _) in self._reports.items() if expires <= now]:
            del self._reports[proxy]
