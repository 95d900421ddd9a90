"""The edge's admission (proxy/grpc/guard.py): which resources and actions each RPC needs, the
in-flight bound, and that auth-off proxies accept anonymous requests while limits still apply."""

from __future__ import annotations

import dataclasses

import pytest

from common.errors import Forbidden, TooManyRequests, Unauthorized, Unavailable
from common.security import Action, Limit, LimitScope, ResourceKind, Rule, SecurityDoc, User, parse_pattern
from proto.apache.rocketmq.v2 import definition_pb2 as pb
from proto.apache.rocketmq.v2 import service_pb2 as spb
from proxy.app import ProxyApp
from proxy.config import AuthConfig, FlowConfig, ProxyConfig
from proxy.context import RequestContext
from proxy.core.auth import sign
from proxy.grpc import guard

TOPIC, GROUP = ResourceKind.TOPIC, ResourceKind.GROUP
DATE = "20261122T032501Z"


class NoBrokers:
    def on_silent(self, callback: object) -> None:
        pass

    def broker_names(self) -> list[str]:
        return []


def context(namespace: str = "", user: tuple[str, str] | None = None) -> RequestContext:
    auth = ""
    if user is not None:
        auth = f"MQv2-HMAC-SHA1 Credential={user[0]}, SignedHeaders=x-mq-date-time, Signature={sign(user[1], DATE)}"
    return RequestContext(request_id="rid", client_id="cid", namespace=namespace, language="PYTHON",
                          client_version="5.1.2", peer="peer", authorization=auth, date_time=DATE)  # fmt: skip


def app(*, auth: bool = False, max_in_flight: int = 10) -> ProxyApp:
    config = ProxyConfig(auth=AuthConfig(enabled=auth), flow=FlowConfig(max_in_flight=max_in_flight))
    return ProxyApp(config, NoBrokers())  # type: ignore[arg-type]


def res(name: str, namespace: str = "") -> pb.Resource:
    return pb.Resource(name=name, resource_namespace=namespace)


def queue(topic: str) -> pb.MessageQueue:
    return pb.MessageQueue(topic=res(topic))


@pytest.mark.parametrize(
    ("request_", "needs"),
    [
        (spb.QueryRouteRequest(topic=res("t")), [(TOPIC, "t", (Action.PUB, Action.SUB))]),
        (spb.SendMessageRequest(messages=[pb.Message(topic=res("t")), pb.Message(topic=res("u"))]),
         [(TOPIC, "t", (Action.PUB,)), (TOPIC, "u", (Action.PUB,))]),
        (spb.ReceiveMessageRequest(group=res("g"), message_queue=queue("t")),
         [(GROUP, "g", (Action.SUB,)), (TOPIC, "t", (Action.SUB,))]),
        (spb.AckMessageRequest(group=res("g"), topic=res("t")),
         [(GROUP, "g", (Action.SUB,)), (TOPIC, "t", (Action.SUB,))]),
        (spb.QueryOffsetRequest(message_queue=queue("t")), [(TOPIC, "t", (Action.SUB,))]),
        (spb.EndTransactionRequest(topic=res("t")), [(TOPIC, "t", (Action.PUB,))]),
        (spb.HeartbeatRequest(group=res("g")), [(GROUP, "g", (Action.SUB,))]),
        (spb.HeartbeatRequest(), []),
        (spb.NotifyClientTerminationRequest(group=res("g")), []),
    ],
)  # fmt: skip
def test_each_rpc_needs_its_resources(
    request_: object, needs: list[tuple[ResourceKind, str, tuple[Action, ...]]]
) -> None:
    got = [(kind, name, actions) for kind, _, name, actions in guard.resources(request_, context("hdr"))]
    assert got == needs


def test_resource_namespace_wins_over_the_header() -> None:
    request = spb.QueryRouteRequest(topic=res("t", "own"))
    assert [ns for _, ns, _, _ in guard.resources(request, context("hdr"))] == ["own"]
    assert [ns for _, ns, _, _ in guard.resources(spb.QueryRouteRequest(topic=res("t")), context("hdr"))] == ["hdr"]


def test_in_flight_bound_refuses_quickly() -> None:
    proxy = app(max_in_flight=2)
    proxy.in_flight = 3  # the servicer counts the request being admitted
    with pytest.raises(TooManyRequests, match="working on 2 requests"):
        guard.admit(proxy, context(), spb.QueryRouteRequest(topic=res("t")))
    proxy.in_flight = 2
    guard.admit(proxy, context(), spb.QueryRouteRequest(topic=res("t")))


def test_auth_off_accepts_anonymous_but_limits_apply() -> None:
    proxy = app()
    proxy.flow.update([Limit(LimitScope.TOPIC, "", "t", messages_per_s=1.0)])
    send = spb.SendMessageRequest(messages=[pb.Message(topic=res("t"), body=b"x") for _ in range(3)])
    guard.admit(proxy, context(), send)
    with pytest.raises(TooManyRequests):
        guard.admit(proxy, context(), send)


def test_auth_on_before_any_document_is_retriable() -> None:
    with pytest.raises(Unavailable, match="not loaded"):
        guard.admit(app(auth=True), context(user=("a", "s")), spb.QueryRouteRequest(topic=res("t")))


def test_auth_on_checks_signature_then_rules() -> None:
    proxy = app(auth=True)
    rule = Rule("a", "ns", parse_pattern("topic:t"), frozenset({Action.PUB}))
    proxy.access.update(SecurityDoc(1, (User("a", "s"),), (rule,)))
    route = spb.QueryRouteRequest(topic=res("t"))
    guard.admit(proxy, context("ns", ("a", "s")), route)
    with pytest.raises(Unauthorized):
        guard.admit(proxy, context("ns", ("a", "wrong")), route)
    with pytest.raises(Unauthorized):
        guard.admit(proxy, dataclasses.replace(context("ns"), authorization=""), route)
    with pytest.raises(Forbidden, match="may not SUB on group g in namespace ns"):
        guard.admit(
            proxy, context("ns", ("a", "s")), spb.ReceiveMessageRequest(group=res("g"), message_queue=queue("t"))
        )
