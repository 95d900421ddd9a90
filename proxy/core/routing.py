"""Which queues a client sees for a topic, and where the proxy sends a produced message.

Routes list the real brokers' queues; each queue's endpoint is a proxy endpoint (this proxy, or
the fleet's from navigation), because clients send all data-plane calls to route endpoints
(the route's endpoints, never the address they connected to). Every broker has a queue 0, which the Node client needs.

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


VIRTUAL_SEPARATOR = "@"


def route_queues(routes: list[BrokerRoute], endpoints: list[str]) -> list[RouteQueue]:
    """The queues of a topic as clients see them.

    With one proxy endpoint, each broker appears under its own name. With several, each broker
    appears once per endpoint as `<broker>@<i>` with all its queues, so clients that use only queue
    0 of each broker (Node) still spread over every proxy; `real_broker` maps a name back. The
    queues alternate endpoints (queue 0 through each proxy, then queue 1, ...): a client retrying
    a send on the next queue of the list (the official clients do) reaches another proxy, so one
    proxy's loss costs a send one attempt, not all of them.
    """
    out = []
    for r in sorted(routes, key=lambda r: r.broker):
        for qid in range(r.queue_count):
            for i, endpoint in enumerate(endpoints):
                name = r.broker if len(endpoints) == 1 else f"{r.broker}{VIRTUAL_SEPARATOR}{i}"
                out.append(RouteQueue(name, qid, r.permission, r.message_types, endpoint))
    return out


def real_broker(name: str) -> str:
    return name.split(VIRTUAL_SEPARATOR, 1)[0]


class QueueSelector:
    """Picks the (broker, queue) for produced messages of one topic."""

    def __init__(self) -> None:
        self._counter = itertools.count()
        # The writable queues of the last routes seen: directories hand out the same list object
        # until a topic's route changes, so the list is rebuilt only then (not once per send).
        self._routes: list[BrokerRoute] | None = None
        self._writable: list[tuple[str, int]] = []

    def pick(self, topic: str, routes: list[BrokerRoute], message_group: str | None) -> tuple[str, int]:
        if routes is not self._routes:
            self._writable = [(r.broker, q) for r in sorted(routes, key=lambda r: r.broker) if r.permission.writable
                              for q in range(r.queue_count)]  # fmt: skip
            self._routes = routes
        writable = self._writable
        if not writable:
            raise Forbidden(f"topic {topic} has no writable queue")
        if message_group:
            digest = hashlib.blake2b(message_group.encode(), digest_size=8).digest()
            return writable[int.from_bytes(digest, "big") % len(writable)]
        return writable[next(self._counter) % len(writable)]


def lite_broker(topic: str, routes: list[BrokerRoute], lite_topic: str) -> str:
    """The broker that holds a lite topic: a hash of its name over the bind topic's writable brokers,
    so its messages form one ordered queue and its subscriptions go to the same broker."""
    brokers = sorted(r.broker for r in routes if r.permission.writable)
    if not brokers:
        raise Forbidden(f"topic {topic} has no writable queue")
    digest = hashlib.blake2b(lite_topic.encode(), digest_size=8).digest()
    return brokers[int.from_bytes(digest, "big") % len(brokers)]
