"""Routes a client sees with several proxies: consecutive queues go through different proxies, so
the official clients' retry on the next queue reaches another proxy when one is gone."""

from __future__ import annotations

import itertools

from common.model import MessageType, Permission
from proxy.core.routing import real_broker, route_queues
from proxy.directory import BrokerRoute

TYPES = frozenset({MessageType.NORMAL})


def test_consecutive_queues_alternate_proxies() -> None:
    routes = [BrokerRoute("b", 4, Permission.READ_WRITE, TYPES), BrokerRoute("a", 2, Permission.READ_WRITE, TYPES)]
    queues = route_queues(routes, ["p1:1", "p2:2"])
    assert len(queues) == 2 * (4 + 2)
    assert all(x.endpoint != y.endpoint for x, y in itertools.pairwise(queues))
    # Every broker's every queue through every proxy, under one virtual name per proxy.
    assert {(q.broker, q.queue_id, q.endpoint) for q in queues} == {
        (f"{b}@{i}", qid, e)
        for b, n in (("a", 2), ("b", 4))
        for i, e in enumerate(["p1:1", "p2:2"])
        for qid in range(n)
    }
    assert {real_broker(q.broker) for q in queues} == {"a", "b"}


def test_one_proxy_lists_each_broker_under_its_own_name() -> None:
    queues = route_queues([BrokerRoute("a", 3, Permission.READ_WRITE, TYPES)], ["p1:1"])
    assert [(q.broker, q.queue_id) for q in queues] == [("a", 0), ("a", 1), ("a", 2)]
