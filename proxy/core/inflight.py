"""In-flight request bytes: how much request data this proxy holds at once, in all and per client.

Every RPC is charged the size of its request as it arrived on the wire, from the moment it is
admitted until it is answered (a long poll, a send waiting for its broker). A request that would
take the proxy's total or its client's share past the configured maximum is refused at once with
TOO_MANY_REQUESTS — nothing queues — so a few clients sending large requests, or many sending
small ones to a slow broker, cannot grow the proxy's memory without bound. Use from the event
loop's thread only.
"""

from __future__ import annotations

from common.errors import TooManyRequests

_MIB = 1024 * 1024


def _mib(n: int) -> str:
    return f"{n / _MIB:.1f} MiB"


class InFlightBytes:
    def __init__(self, max_total: int, max_per_client: int) -> None:
        self.max_total = max_total
        self.max_per_client = max_per_client
        self.total = 0
        self._clients: dict[str, int] = {}
        self.refused = 0  # requests refused since start (for logs and tests)

    def acquire(self, client_id: str, size: int) -> None:
        """Charge `size` bytes to `client_id`, or raise TooManyRequests (and charge nothing)."""
        held = self._clients.get(client_id, 0)
        if self.total + size > self.max_total:
            self.refused += 1
            raise TooManyRequests(f"this proxy holds {_mib(self.total)} of requests in flight (at most "
                                  f"{_mib(self.max_total)}); retry shortly")  # fmt: skip
        if held + size > self.max_per_client:
            self.refused += 1
            raise TooManyRequests(f"client {client_id or '(no id)'} has {_mib(held)} of requests in flight on this "
                                  f"proxy (at most {_mib(self.max_per_client)} per client); wait for answers "
                                  "before sending more")  # fmt: skip
        self.total += size
        self._clients[client_id] = held + size

    def release(self, client_id: str, size: int) -> None:
        self.total -= size
        left = self._clients.get(client_id, 0) - size
        if left > 0:
            self._clients[client_id] = left
        else:
            self._clients.pop(client_id, None)

    def client_bytes(self, client_id: str) -> int:
        return self._clients.get(client_id, 0)
