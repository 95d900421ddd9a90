"""Routes a client sees with several proxies: consecutive queues go through different proxies, so
the official clients' retry on the next queue reaches another proxy when one is gone."""

from __future__ import annotations

import itertools

from common.model import MessageType, Permission
from proto.apache.rocketmq.v2 import definition_pb2 as pb
from proxy.core.routing import RouteQueue, real_broker, route_queues
from proxy.directory import BrokerRoute
from proxy.grpc.route import endpoints_pb

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


def test_fifo_queues_list_the_other_proxies_for_clients_that_take_address_lists() -> None:
    """A FIFO message group is sent to one queue, retries included: for a client whose channel
    moves to the next address of a queue's endpoints, every proxy is listed, the queue's own first."""
    fifo = frozenset({MessageType.FIFO})
    routes = [BrokerRoute("a", 2, Permission.READ_WRITE, fifo), BrokerRoute("b", 1, Permission.READ_WRITE, TYPES)]
    proxies = ["p1:1", "p2:2", "p3:3"]
    queues = route_queues(routes, proxies, fifo_fallbacks=True)
    for q in queues:
        if real_broker(q.broker) == "a":
            assert (q.endpoint, *q.fallbacks) in {("p1:1", "p2:2", "p3:3"), ("p2:2", "p3:3", "p1:1"),
                                                  ("p3:3", "p1:1", "p2:2")}  # fmt: skip
        else:  # a normal topic: the client's retry on the next queue already reaches another proxy
            assert q.fallbacks == ()
    assert all(q.fallbacks == () for q in route_queues(routes, proxies))  # clients that cannot take them


def test_endpoints_of_several_ipv4_addresses_and_one_name() -> None:
    both = endpoints_pb("127.0.0.1:1", ("127.0.0.2:2",))
    assert both.scheme == pb.IPv4 and [(a.host, a.port) for a in both.addresses] == [("127.0.0.1", 1), ("127.0.0.2", 2)]
    # A domain name scheme allows one address (the Python client refuses more): the queue's own only.
    named = endpoints_pb("proxy-0.example:8081", ("127.0.0.2:2",))
    assert named.scheme == pb.DOMAIN_NAME and [a.host for a in named.addresses] == ["proxy-0.example"]


def _host(q: RouteQueue) -> str:
    return q.endpoint.rpartition(":")[0]


def test_merged_nodes_queues_alternate_hosts_so_a_retry_leaves_a_cut_node() -> None:
    """Issue 43: the Python client retries a failed send on the next queue of the route. With a
    node's queues consecutive, all three attempts waited on a node cut off from the network; now the
    queue after each of the smaller host's is another host's (cyclically: the client wraps around)."""
    routes = [
        BrokerRoute("node-2", 4, Permission.READ_WRITE, TYPES, "10.0.0.2:8081"),
        BrokerRoute("shard-0", 4, Permission.READ_WRITE, TYPES, "10.0.0.1:8081"),
        BrokerRoute("shard-1", 4, Permission.READ_WRITE, TYPES, "10.0.0.1:8082"),
    ]
    queues = route_queues(routes, ["10.0.0.1:8081"])
    assert sorted((q.broker, q.queue_id) for q in queues) == sorted((r.broker, i) for r in routes for i in range(4))
    following = itertools.pairwise([*queues, queues[0]])
    assert all(_host(b) != "10.0.0.2" for a, b in following if _host(a) == "10.0.0.2"), [q.broker for q in queues]
    # Within a host the order by broker stays.
    on_first = [(q.broker, q.queue_id) for q in queues if _host(q) == "10.0.0.1"]
    assert on_first == [(b, i) for b in ("shard-0", "shard-1") for i in range(4)]
    # One machine's nodes (`sluice up`'s shards, cut off together): the order by broker, unchanged.
    one_machine = [BrokerRoute(f"shard-{i}", 2, Permission.READ_WRITE, TYPES, f"10.0.0.1:808{i}") for i in (1, 0)]
    assert [(q.broker, q.queue_id) for q in route_queues(one_machine, ["10.0.0.1:8080"])] == [
        ("shard-0", 0), ("shard-0", 1), ("shard-1", 0), ("shard-1", 1)
    ]  # fmt: skip


def test_equal_shares_alternate_all_the_way_round() -> None:
    routes = [BrokerRoute(f"n{i}", 3, Permission.READ_WRITE, TYPES, f"10.0.0.{i}:8081") for i in (1, 2, 3)]
    queues = route_queues(routes, ["10.0.0.1:8081"])
    assert all(_host(a) != _host(b) for a, b in itertools.pairwise([*queues, queues[0]])), [q.broker for q in queues]


def test_a_fifo_only_topic_keeps_the_order_by_broker_the_python_client_hashes_over() -> None:
    """Every send of a FIFO-only topic carries a message group, which the Python client hashes over
    the route order as a merged node's proxy does over the brokers' queues (QueueSelector): that order
    stays, so its sends reach the owning node with no hop. A topic that also takes messages without a
    group is spread; its groups keep their queues (the proxy places them by its own order)."""
    fifo = frozenset({MessageType.FIFO})
    routes = [BrokerRoute("node-2", 2, Permission.READ_WRITE, fifo, "10.0.0.2:8081"),
              BrokerRoute("node-1", 2, Permission.READ_WRITE, fifo, "10.0.0.1:8081")]  # fmt: skip
    assert [(q.broker, q.queue_id) for q in route_queues(routes, ["10.0.0.1:8081"])] == [
        ("node-1", 0), ("node-1", 1), ("node-2", 0), ("node-2", 1)
    ]  # fmt: skip
    mixed = [BrokerRoute(r.broker, r.queue_count, r.permission, frozenset(MessageType), r.endpoint) for r in routes]
    assert [(q.broker, q.queue_id) for q in route_queues(mixed, ["10.0.0.1:8081"])] == [
        ("node-1", 0), ("node-2", 0), ("node-1", 1), ("node-2", 1)
    ]  # fmt: skip
