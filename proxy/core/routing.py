"""Which queues a client sees for a topic, and where the proxy sends a produced message.

Routes list the real brokers' queues; each queue's endpoint is a proxy endpoint (this proxy, or
the fleet's from navigation), because clients send all data-plane calls to route endpoints
(PROTOCOL.md §1.8). Every broker has a queue 0, which the Node client needs.

The client's queue choice on send is only a hint (clients hash FIFO message groups differently,
and Python always reports queue 0): the proxy picks the queue. A FIFO message group always maps to
the same (broker, queue) while the route is unchanged, so its messages stay in one queue, in order.
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass

from common.errors import Forbidden
from common.model import MessageType, Permission
from proxy.directory import BrokerRoute


@dataclass(frozen=True, slots=True)
class RouteQueue:
    broker: str
    queue_id: int
    permission: Permission
    message_types: frozenset[MessageType]
    endpoint: str


def route_queues(routes: list[BrokerRoute], endpoints: list[str]) -> list[RouteQueue]:
    """The queues of a topic as clients see them; endpoints are spread over brokers stably."""
    out = []
    for i, r in enumerate(sorted(routes, key=lambda r: r.broker)):
        endpoint = endpoints[i % len(endpoints)]
        for qid in range(r.queue_count):
            out.append(RouteQueue(r.broker, qid, r.permission, r.message_types, endpoint))
    return out


class QueueSelector:
    """Picks the (broker, queue) for produced messages of one topic."""

    def __init__(self) -> None:
        self._counter = itertools.count()

    def pick(self, topic: str, routes: list[BrokerRoute], message_group: str | None) -> tuple[str, int]:
        writable = [(r.broker, q) for r in sorted(routes, key=lambda r: r.broker) if r.permission.writable
                    for q in range(r.queue_count)]  # fmt: skip
        if not writable:
            raise Forbidden(f"topic {topic} has no writable queue")
        if message_group:
            digest = hashlib.blake2b(message_group.encode(), digest_size=8).digest()
            return writable[int.from_bytes(digest, "big") % len(writable)]
        return writable[next(self._counter) % len(writable)]
