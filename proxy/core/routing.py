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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from fractions import Fraction

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
    # Further proxies a client may use for this queue when `endpoint` is gone (`route_queues`).
    fallbacks: tuple[str, ...] = ()


VIRTUAL_SEPARATOR = "@"


def route_queues(routes: list[BrokerRoute], endpoints: list[str], *, fifo_fallbacks: bool = False) -> list[RouteQueue]:
    """The queues of a topic as clients see them.

    With one proxy endpoint, each broker appears under its own name. With several, each broker
    appears once per endpoint as `<broker>@<i>` with all its queues, so clients that use only queue
    0 of each broker (Node) still spread over every proxy; `real_broker` maps a name back. A broker
    whose route names its own endpoint (the merged node that owns it, docs/shards.md) appears once,
    under its name, with that endpoint: clients then call the owner directly. Across several
    endpoints the queues alternate them (queue 0 through each proxy, then queue 1, ...), and
    unless the topic takes FIFO messages only, they are spread over hosts (`spread`): a client
    retrying a send on the next queue of the list (the official Python client does) reaches
    another proxy or node, so one proxy's or host's loss costs a send one attempt, not all of them.

    A FIFO message group is different: clients send every message of a group to the one queue its
    hash picks, retries included, so a group on a dead proxy's queue would fail for the whole
    outage. With `fifo_fallbacks` (for clients whose gRPC channel takes several addresses and moves
    to the next when one fails: the official Python client), each queue of a FIFO topic also lists
    the other proxies as `fallbacks`, after its own.
    """
    out = []
    for r in sorted(routes, key=lambda r: r.broker):
        own = [r.endpoint] if r.endpoint else endpoints
        several = fifo_fallbacks and len(own) > 1 and MessageType.FIFO in r.message_types
        for qid in range(r.queue_count):
            for i, endpoint in enumerate(own):
                name = r.broker if len(own) == 1 else f"{r.broker}{VIRTUAL_SEPARATOR}{i}"
                fallbacks = (*own[i + 1 :], *own[:i]) if several else ()
                out.append(RouteQueue(name, qid, r.permission, r.message_types, endpoint, fallbacks))
    return spread(out) if any(r.message_types - FIFO_ONLY for r in routes) else out


FIFO_ONLY = frozenset({MessageType.FIFO})


def spread(queues: list[RouteQueue]) -> list[RouteQueue]:
    """`queues` in an order where consecutive ones are on different hosts (the host of their
    endpoint) as far as the counts allow: each host's queues spread evenly over the list, their
    order among themselves kept.

    Why: the official Python client retries a failed send on the next queue of the route (it has
    no endpoint isolation), each attempt waiting its request timeout on a host cut off from the
    network. With a merged node's queues consecutive, all its attempts landed on the cut node;
    spread, the retry after the first timeout reaches another host. Only the order clients see
    changes: the proxy places a message group by its own order of the route (`QueueSelector`), so
    no group moves; a FIFO send of a topic that also takes other messages, hashed by the Python
    client over this order, may reach another node than the owner and is forwarded there
    (docs/shards.md). A topic that takes FIFO messages only keeps the order by broker
    (`route_queues`), and so do the nodes of one machine (`sluice up`'s shards, cut off together).
    """
    hosts: dict[str, list[RouteQueue]] = {}
    for q in queues:
        hosts.setdefault(q.endpoint.rpartition(":")[0], []).append(q)
    if len(hosts) < 2:
        return queues
    shares = list(hosts.values())
    # The k-th of a host's n queues at (2k+1)/2n of the list (ties in order of first appearance).
    placed = sorted((Fraction(2 * k + 1, 2 * len(share)), rank, k) for rank, share in enumerate(shares)
                    for k in range(len(share)))  # fmt: skip
    return [shares[rank][k] for _, rank, k in placed]


def reachable_only(routes: list[BrokerRoute], reachable: Callable[[str], bool]) -> list[BrokerRoute]:
    """The routes to answer a client with: a broker whose queues carry the endpoint of a node this
    proxy cannot reach now (proxy/reach.py) has them marked neither writable nor readable, so the
    client's next route refresh stops it dialling a host cut off from the network, and the refresh
    after the node answers again gets them back. A topic that takes FIFO messages only is answered
    complete: every send of it carries a message group, the proxy places each group by its own
    order of the route whatever the client sees (`QueueSelector`), and the Python client's hash
    over the whole route is what keeps its sends hop-free; a group of the cut node fails either way.
    The same list object when nothing is left out."""
    if all(not r.endpoint or reachable(r.endpoint) for r in routes):
        return routes
    if not any(r.message_types - FIFO_ONLY for r in routes):
        return routes
    return [r if not r.endpoint or reachable(r.endpoint) else replace(r, permission=Permission.NONE) for r in routes]


def real_broker(name: str) -> str:
    return name.split(VIRTUAL_SEPARATOR, 1)[0]


class QueueSelector:
    """Picks the (broker, queue) for produced messages of one topic.

    With a `home` broker (a merged node among several, docs/shards.md), messages without a group
    stay on the home broker's queues when it has writable ones: the client chose this node by the
    queue's endpoint, and storing here costs no hop. A message group is hashed over every writable
    queue of the topic, the same on every node, so a group keeps one queue whichever node it reaches;
    there the hash is the official Python client's (SHA-256 of the group, big-endian, modulo the
    writable queues in route order), so its FIFO sends reach the owning node at once (other clients'
    are forwarded). Without a home the hash stays BLAKE2b: changing it would move groups between
    queues across an upgrade.
    """

    def __init__(self, home: str | None = None) -> None:
        self._counter = itertools.count()
        self._home = home
        # The writable queues of the last routes seen: directories hand out the same list object
        # until a topic's route changes, so the list is rebuilt only then (not once per send).
        self._routes: list[BrokerRoute] | None = None
        self._writable: list[tuple[str, int]] = []
        self._home_writable: list[tuple[str, int]] = []

    def pick(
        self, topic: str, routes: list[BrokerRoute], message_group: str | None,
        usable: Callable[[str], bool] | None = None,
    ) -> tuple[str, int]:  # fmt: skip
        """`usable(broker)` False: skip that broker's queues while another broker's are usable
        (proxy/core/health.py); a message group keeps its queue regardless."""
        if routes is not self._routes:
            self._writable = [(r.broker, q) for r in sorted(routes, key=lambda r: r.broker) if r.permission.writable
                              for q in range(r.queue_count)]  # fmt: skip
            self._home_writable = [w for w in self._writable if w[0] == self._home]
            self._routes = routes
        writable = self._writable if message_group or not self._home_writable else self._home_writable
        if not writable:
            raise Forbidden(f"topic {topic} has no writable queue")
        if message_group:
            if self._home is not None:
                return writable[int.from_bytes(hashlib.sha256(message_group.encode()).digest(), "big") % len(writable)]
            digest = hashlib.blake2b(message_group.encode(), digest_size=8).digest()
            return writable[int.from_bytes(digest, "big") % len(writable)]
        turn = next(self._counter)
        choice = writable[turn % len(writable)]
        if usable is None or usable(choice[0]):
            return choice
        healthy = [w for w in writable if usable(w[0])]
        return healthy[turn % len(healthy)] if healthy else choice


def lite_broker(topic: str, routes: list[BrokerRoute], lite_topic: str) -> str:
    """The broker that holds a lite topic: a hash of its name over the bind topic's writable brokers,
    so its messages form one ordered queue and its subscriptions go to the same broker."""
    brokers = writable_brokers(routes)
    if not brokers:
        raise Forbidden(f"topic {topic} has no writable queue")
    return lite_owner(brokers, lite_topic)


def writable_brokers(routes: Sequence[BrokerRoute]) -> list[str]:
    """The route's brokers that take sends, sorted (what `lite_owner` hashes over)."""
    return sorted(r.broker for r in routes if r.permission.writable)


def lite_owner(brokers: Sequence[str], lite_topic: str) -> str:
    """`lite_broker` over these writable brokers (sorted, at least one)."""
    digest = hashlib.blake2b(lite_topic.encode(), digest_size=8).digest()
    return brokers[int.from_bytes(digest, "big") % len(brokers)]
