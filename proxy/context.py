"""The typed request context built once at the edge and passed first to every core call."""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RequestContext:
    client_id: str
    namespace: str
    language: str
    client_version: str
    request_id: str
    peer: str
    deadline: float | None  # time.monotonic() value, None = no deadline
    authorization: str = ""  # the signature header, checked by proxy/grpc/guard.py when auth is on
    date_time: str = ""  # x-mq-date-time, the signed value

    def remaining_s(self) -> float | None:
        return None if self.deadline is None else self.deadline - time.monotonic()
