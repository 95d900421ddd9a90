"""Client sessions: soft state about connected clients, keyed by client id.

What a session knows comes from Settings (Telemetry) and Heartbeats: client type, language, group,
topics. Nothing here is needed to serve data-plane calls (clients may send before their Settings
arrive); sessions feed settings replies, auto-renew ownership, and later transaction check-backs.
Sessions without activity for `expiry_s` (and no open telemetry stream) are dropped by `sweep`,
which runs every `sweep_interval_s`; a client's NotifyClientTermination drops its session at once.
Either way their owners are told (`on_expire`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class ClientSession:
    client_id: str
    language: str = ""
    client_type: int = 0
    group: str = ""  # cluster-wide (namespace-wrapped) group name
    topics: set[str] = field(default_factory=set)
    version: str = ""
    address: str = ""  # the peer as gRPC names it (ipv4:HOST:PORT)
    streams: int = 0
    last_seen: float = field(default_factory=time.monotonic)


class SessionRegistry:
    def __init__(self, expiry_s: float, on_expire: Callable[[str], None] | None = None) -> None:
        self._expiry_s = expiry_s
        # A quarter of the expiry, at most 5 s: a silent client is gone within 1.25 expiries.
        self.sweep_interval_s = max(0.1, min(5.0, expiry_s / 4))
        self._on_expire = on_expire
        self.sessions: dict[str, ClientSession] = {}

    def touch(self, client_id: str, **fields: object) -> ClientSession:
        session = self.sessions.get(client_id)
        if session is None:
            session = self.sessions[client_id] = ClientSession(client_id)
        for name, value in fields.items():
            if value:
                setattr(session, name, value)
        session.last_seen = time.monotonic()
        return session

    def stream_opened(self, client_id: str) -> None:
        self.touch(client_id).streams += 1

    def stream_closed(self, client_id: str) -> None:
        session = self.sessions.get(client_id)
        if session is not None:
            session.streams = max(0, session.streams - 1)
            session.last_seen = time.monotonic()

    def terminate(self, client_id: str) -> None:
        if self.sessions.pop(client_id, None) is not None and self._on_expire is not None:
            self._on_expire(client_id)

    def sweep(self) -> list[str]:
        now = time.monotonic()
        gone = [cid for cid, s in self.sessions.items() if s.streams == 0 and now - s.last_seen > self._expiry_s]
        for cid in gone:
            self.terminate(cid)
        return gone

    def count_by_client(self) -> dict[tuple[str, str], int]:
        """Sessions by (language, version); unknown parts as UNKNOWN."""
        out: dict[tuple[str, str], int] = {}
        for s in self.sessions.values():
            key = (s.language or "UNKNOWN", s.version or "UNKNOWN")
            out[key] = out.get(key, 0) + 1
        return out
