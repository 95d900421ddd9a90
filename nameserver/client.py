"""Clients of the NameServer: `NameServerClient` for proxies and tools, `BrokerRegistrar` for brokers.

NameServers are independent copies of the same picture (brokers register with every one), so:
- reads (`list_brokers`, `list_topics`) ask one NameServer and fail over to the next when it is
  unreachable; the one that answered is asked first next time. `get_route` asks them all and
  merges their answers (one may have restarted a moment ago and not know every broker yet);
- writes (`register`, `unregister`) go to all NameServers concurrently and succeed when at least
  one accepted.

Errors are `SluiceError`s: a coded answer of a NameServer becomes the same class here (through
`proto.rpc.error_from_rpc`); unreachable NameServers become `Unavailable`. Every call has a deadline
(`timeout_s`). Callers use one client from one event loop. The machinery shared with the navigation
client is `proto.servers`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from common.errors import InternalError, SluiceError, TopicNotFound, Unavailable
from common.logs import kv
from nameserver import convert
from nameserver.config import DEFAULT_MAX_MESSAGE_BYTES
from nameserver.model import BrokerRegistration, BrokerStatus, TopicRoute, TopicSummary, merge_routes, split_address
from proto.servers import ADDRESS_SEPARATOR as ADDRESS_SEPARATOR  # re-exported: this module's API
from proto.servers import Failures, HeartbeatSender, Outcomes, ServerKind, ServerSetClient
from proto.sluice.internal.v1 import nameserver_pb2 as pb
from proto.sluice.internal.v1 import nameserver_pb2_grpc as pb_grpc

log = logging.getLogger("sluice.nameserver.client")

# How long a route lookup over several NameServers waits for the others once a NameServer that is
# not young has answered (a hung one would otherwise hold every lookup for its whole timeout).
MERGE_WAIT_S = 0.5
DEFAULT_HEARTBEAT_INTERVAL_S = 5.0

_KIND = ServerKind(
    name="NameServer",
    prefix="NameServer",
    example_port=9876,
    split_address=split_address,
    log=log,
    log_key="nameserver",
    max_message_bytes=DEFAULT_MAX_MESSAGE_BYTES,
)


def parse_addresses(text: str) -> list[str]:
    """`host:port;host:port` as a list (order kept, duplicates dropped); ConfigError if malformed."""
    return _KIND.parse_addresses(text)


class NameServerClient(ServerSetClient):
    """Reads routes from, and registers brokers with, a set of independent NameServers."""

    KIND = _KIND
    STUB = pb_grpc.NameServerStub

    # -- reads: one NameServer, failing over -----------------------------------------------------

    async def get_route(self, topic: str) -> TopicRoute:
        """The route of `topic`. TopicNotFound if no reachable NameServer knows it; Unavailable if none answered.

        With several NameServers, every one is asked at once and their answers are merged
        (`merge_routes`): a broker is in the route when any NameServer holds it live. Once one
        NameServer that is not young has answered, the others get `MERGE_WAIT_S` more.
        """
        request = pb.GetRouteRequest(topic=topic)
        if len(self.addresses) == 1:
            response = await self._first_answer("GetRoute", request)
            return convert.route_from_pb(response.route)
        tasks = {asyncio.create_task(self._servers.call(a, "GetRoute", request), name=f"route-{a}"): a
                 for a in self.addresses}  # fmt: skip
        answers: list[TopicRoute] = []
        failures: Failures = []
        loop = asyncio.get_running_loop()
        settle_at: float | None = None
        pending = set(tasks)
        try:
            while pending:
                timeout = None if settle_at is None else max(0.0, settle_at - loop.time())
                done, pending = await asyncio.wait(pending, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                if not done:
                    break  # a mature answer is in; the slow ones are not waited for
                for task in done:
                    exc = task.exception()
                    if isinstance(exc, SluiceError):
                        failures.append((tasks[task], exc))
                    elif exc is not None:
                        raise exc
                    else:
                        route = convert.route_from_pb(task.result().route)
                        answers.append(route)
                        if not route.young and settle_at is None:
                            settle_at = loop.time() + MERGE_WAIT_S
        finally:
            for task in pending:
                task.cancel()
        if not answers:
            for _, exc in failures:
                if not (exc.retriable or isinstance(exc, (InternalError, TopicNotFound))):
                    raise exc  # bad input: every NameServer says the same
            raise _KIND.no_answer(failures, (TopicNotFound,))
        return merge_routes(answers)

    async def list_brokers(self, cluster_name: str = "") -> list[BrokerStatus]:
        response = await self._first_answer("ListBrokers", pb.ListBrokersRequest(cluster_name=cluster_name))
        return [convert.broker_status_from_pb(b) for b in response.brokers]

    async def list_topics(self) -> list[TopicSummary]:
        response = await self._first_answer("ListTopics", pb.ListTopicsRequest())
        return [convert.topic_summary_from_pb(t) for t in response.topics]

    # -- writes: every NameServer at once --------------------------------------------------------

    async def register(self, registration: BrokerRegistration) -> int:
        """Register with every NameServer; returns how many accepted. Raises only if none did."""
        outcomes = await self.register_each(registration)
        return _KIND.accepted_or_raise(outcomes, f"registration of broker {registration.broker_name}")

    async def register_each(self, registration: BrokerRegistration) -> Outcomes:
        """Register with every NameServer concurrently; the outcome per NameServer, never raises."""
        request = pb.RegisterBrokerRequest(registration=convert.registration_to_pb(registration))
        return await self._servers.on_all("RegisterBroker", request)

    async def unregister(self, broker_name: str, *, instance_id: str = "") -> int:
        """Remove a broker from every NameServer; returns how many answered. Raises only if none did."""
        request = pb.UnregisterBrokerRequest(broker_name=broker_name, instance_id=instance_id)
        outcomes = await self._servers.on_all("UnregisterBroker", request)
        return _KIND.accepted_or_raise(outcomes, f"unregistration of broker {broker_name}")

    # -- internals ------------------------------------------------------------------------------

    async def _first_answer(self, method: str, request: Any) -> Any:
        # Another NameServer can answer differently when this one lacks the topic (restarted and
        # not yet re-registered), besides when it is unreachable, overloaded or failed internally.
        return await self._servers.first_answer(method, request, unknown_here=(TopicNotFound,))


class BrokerRegistrar(HeartbeatSender[BrokerRegistration]):
    """Keeps one broker registered with every NameServer; owned by the broker.

    `registration()` is called for every send, so what is sent is always the broker's current
    state. Each send is stamped with this registrar's `instance_id` and an increasing sequence, so a
    NameServer never lets an older in-flight heartbeat overwrite a newer topic list.

    `may_register()` is asked before every send: a broker group's primary registers only while its
    term is valid. One paused past its term wakes while a successor serves under the same broker
    name; a heartbeat then would route the group back to the deposed member (and its unregistering
    as it steps down would then take the group out of every route until the successor's next
    heartbeat).
    """

    def __init__(
        self,
        client: NameServerClient,
        registration: Callable[[], BrokerRegistration],
        *,
        heartbeat_interval_s: float = DEFAULT_HEARTBEAT_INTERVAL_S,
        unregister_on_stop: bool = True,
        may_register: Callable[[], bool] = lambda: True,
    ) -> None:
        super().__init__(
            _KIND, registration, heartbeat_interval_s=heartbeat_interval_s, unregister_on_stop=unregister_on_stop
        )
        self._client = client
        self._may_register = may_register

    async def run(self, stop: asyncio.Event) -> None:
        """Heartbeat every `heartbeat_interval_s` until `stop`, then unregister (if configured).

        NameServers that are down are logged (once per change) and retried at the next heartbeat;
        this never raises for them. An exception from `registration()` propagates (a broker bug).
        """
        await self._every_interval(stop, self._send)
        if self._unregister_on_stop:
            await self._leave()

    async def report_now(self) -> int:
        """Push the current registration to every NameServer now; returns how many accepted.

        Returns when every NameServer answered or timed out, so all reachable ones hold the new
        state. Raises Unavailable (or the NameServers' coded error) if none accepted; the next
        heartbeat retries either way.
        """
        if not self._may_register():
            raise Unavailable("broker registration withheld: a primary past its term does not register")
        outcomes = await self._send()
        return _KIND.accepted_or_raise(outcomes, "broker registration")

    async def _send(self) -> Outcomes:
        if not self._may_register():
            return {}  # not now (see the class doc); the next heartbeat asks again
        registration = self._stamped()
        outcomes = await self._client.register_each(registration)
        self._note_all(outcomes, broker=registration.broker_name)
        return outcomes

    async def _leave(self) -> None:
        broker_name = self._registration().broker_name
        try:
            count = await self._client.unregister(broker_name, instance_id=self.instance_id)
        except SluiceError as exc:
            log.warning("could not unregister from any nameserver", extra=kv(broker=broker_name, error=exc))
            return
        log.info("unregistered from nameservers", extra=kv(broker=broker_name, nameservers=count))
