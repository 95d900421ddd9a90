"""`ProxyApp`: the proxy's protocol-free core, assembled: directory of brokers, produce and consume
services, client sessions and auto renew. The gRPC servicer is a thin edge over it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

from common import metrics
from common.errors import Unavailable
from common.security import SecurityDoc
from navigation.model import ProxyLoad
from proxy.config import ProxyConfig
from proxy.core.auth import AccessControl, AuthSettings
from proxy.core.checkback import CheckBackRegistry, OrphanChecker
from proxy.core.clientreport import ClientReporter
from proxy.core.consumer import ConsumerService
from proxy.core.health import BrokerHealth
from proxy.core.inflight import InFlightBytes
from proxy.core.limits import FlowControl
from proxy.core.lite import LiteRouter
from proxy.core.producer import ProducerService
from proxy.core.renewer import AutoRenewer
from proxy.core.routing import reachable_only
from proxy.core.sessions import SessionRegistry
from proxy.directory import BrokerDirectory, BrokerRoute
from proxy.fleet import Fleet
from proxy.policy import PolicySource
from proxy.reach import ReachWatch

log = logging.getLogger("sluice.proxy")


class ProxyApp:
    def __init__(self, config: ProxyConfig, directory: BrokerDirectory, *, home: str | None = None) -> None:
        """`home`: the broker in this process when it is one merged node among several (docs/shards.md)."""
        self.config = config
        self.directory = directory
        self.renewer = AutoRenewer(directory, config.receive)
        self.checkbacks = CheckBackRegistry()
        self.sessions = SessionRegistry(config.client_expiry_s, on_expire=self._client_gone)
        self.health = health = BrokerHealth(config.send_health, probe=self._probe)
        directory.on_silent(health.silent)
        self.producer = ProducerService(directory, topics_max=config.caches.topics_max, home=home, health=health)
        self.consumer = ConsumerService(directory, self.renewer, config.receive)
        self.consumer.usable = health.usable
        self.lite = LiteRouter(directory, config.settings.lite_subscription_quota, config.settings.lite_removal_poll_ms,
                               config.caches.lite_clients_max)  # fmt: skip
        self.consumer.lite = self.lite
        self._touched_groups: set[str] = set()
        self.in_flight = 0
        self.in_flight_bytes = InFlightBytes(config.flow.max_in_flight_bytes, config.flow.max_client_in_flight_bytes)
        self.fleet = Fleet(config, self._load)
        self.reach = ReachWatch(config.reach, {config.advertised_address, *self.fleet.networks().values()})
        self.orphans = OrphanChecker(directory, self.checkbacks, config.transaction)
        auth = config.auth
        self.access = AccessControl(AuthSettings(auth.signature_cache_s, auth.signature_cache_max,
                                                 auth.decision_cache_max))  # fmt: skip
        self.flow = FlowControl(proxy_count=config.flow.proxy_count, burst_s=config.flow.burst_s)
        self.policy = PolicySource(self._security_stores, refresh_s=auth.policy_refresh_s)
        self.policy.subscribe(self._apply_policy)
        self.client_reporter = ClientReporter(directory, self.sessions, config.advertised_address,
                                              config.client_report_s)  # fmt: skip

    def _client_gone(self, client_id: str) -> None:
        self.renewer.release_client(client_id)
        self.checkbacks.forget_client(client_id)
        self.client_reporter.wake()  # `client list` drops it now, not at the next report

    def _load(self) -> ProxyLoad:
        return ProxyLoad(in_flight_requests=self.in_flight, connected_clients=len(self.sessions.sessions))

    async def endpoints(self, namespace: str, network: str, access_point: Sequence[str] = ()) -> list[str]:
        """Proxy endpoints to advertise in routes: the fleet's best (navigation; in the zone of the
        client's `access_point`), else this proxy; those this proxy cannot reach now left out
        (proxy/reach.py), unless that would leave none."""
        found = await self.fleet.endpoints(namespace, network, access_point)
        return [e for e in found if self.reach.reachable(e)] or found

    def client_routes(self, routes: list[BrokerRoute]) -> list[BrokerRoute]:
        """`routes` as clients are answered them: the queues of a merged node this proxy cannot
        reach now marked unusable (proxy/core/routing.py `reachable_only`)."""
        return reachable_only(routes, self.reach.reachable)

    async def touch_group(self, group: str) -> None:
        if group in self._touched_groups:
            return
        await self.consumer.touch_group(group)
        if len(self._touched_groups) >= self.config.caches.groups_max:
            self._touched_groups.clear()
        self._touched_groups.add(group)

    def metric_samples(self) -> list[metrics.Sample]:
        """Scrape-time metrics of this proxy: connected clients and RPCs in flight."""
        out: list[metrics.Sample] = [
            (metrics.PROXY_IN_FLIGHT, (), float(self.in_flight)),
            (metrics.PROXY_IN_FLIGHT_BYTES, (), float(self.in_flight_bytes.total)),
        ]
        for (language, version), n in self.sessions.count_by_client().items():
            out.append((metrics.PROXY_CLIENTS, (language, version), float(n)))
        return out

    async def run(self, stop: asyncio.Event) -> None:
        """Background work until `stop`: auto renew, session expiry, announcing to navigation."""
        unregister = metrics.register_source(self.metric_samples)
        try:
            async with asyncio.TaskGroup() as tasks:  # each ends on `stop`; all are cancelled if run is
                tasks.create_task(self.renewer.run(stop), name="auto-renew")
                tasks.create_task(self.fleet.run(stop), name="navigation-announcer")
                tasks.create_task(self.orphans.run(stop), name="transaction-check-back")
                tasks.create_task(self.policy.run(stop), name="security-policy")
                tasks.create_task(self.client_reporter.run(stop), name="client-report")
                tasks.create_task(self.lite.run(stop), name="lite-removals")
                tasks.create_task(self.reach.run(stop), name="route-endpoint-reach")
                while not stop.is_set():
                    self.sessions.sweep()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), self.sessions.sweep_interval_s)
        finally:
            unregister()
            await self.health.close()
            await self.fleet.close()

    async def _probe(self, broker: str) -> None:
        """Whether `broker` answers (proxy/core/health.py): a BrokerInfo call, Unavailable if unknown."""
        api = await self.directory.lookup(broker)
        if api is None:
            raise Unavailable(f"broker {broker} is not known to this proxy")
        await api.broker_info()

    def _security_stores(self) -> list[object]:
        """Every broker this proxy knows: each holds a copy of the security document."""
        return [self.directory.broker(name) for name in self.directory.broker_names()]

    def _apply_policy(self, doc: SecurityDoc) -> None:
        self.access.update(doc)
        self.flow.update(doc.limits)
