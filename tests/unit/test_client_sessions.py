"""Client sessions leave `sluice admin client list` on time (issue 35): a terminated session is
reported to the brokers at once, a silent one expires within 30 s with the default settings."""

from __future__ import annotations

import asyncio

from broker.client.api import ConnectedClient
from proxy.app import ProxyApp
from proxy.config import ProxyConfig
from proxy.core.clientreport import ClientReporter
from proxy.core.sessions import SessionRegistry

SILENT_BOUND_S = 30.0
LONG_INTERVAL_S = 3600.0  # no report falls due by time within a test
HANG_S = 10.0  # only against a hang


class RecordingBroker:
    def __init__(self) -> None:
        self.reports: list[list[str]] = []
        self.arrived = asyncio.Event()

    async def report_clients(self, proxy: str, clients: list[ConnectedClient], ttl_ms: int) -> None:
        self.reports.append([c.client_id for c in clients])
        self.arrived.set()


class OneBroker:
    def __init__(self, broker: RecordingBroker) -> None:
        self._broker = broker

    def on_silent(self, callback: object) -> None:
        pass

    def broker_names(self) -> list[str]:
        return ["broker-a"]

    def broker(self, name: str) -> RecordingBroker:
        return self._broker


def test_the_default_expiry_drops_a_silent_client_within_30_s() -> None:
    config = ProxyConfig()
    sessions = SessionRegistry(config.client_expiry_s)
    # expiry, then at worst one sweep interval; the sweep's report goes out at once (below)
    assert config.client_expiry_s + sessions.sweep_interval_s < SILENT_BOUND_S
    assert config.client_expiry_s > 10.0  # official clients heartbeat every 10 s: one beat may be late


def test_the_sweep_follows_a_short_expiry() -> None:
    assert SessionRegistry(2.0).sweep_interval_s == 0.5
    assert SessionRegistry(120.0).sweep_interval_s == 5.0


def test_a_terminated_client_is_reported_at_once() -> None:
    async def scenario() -> list[list[str]]:
        broker = RecordingBroker()
        app = ProxyApp(ProxyConfig(client_report_s=LONG_INTERVAL_S), OneBroker(broker))  # type: ignore[arg-type]
        app.sessions.touch("client-1", language="PYTHON")
        app.sessions.touch("client-2", language="PYTHON")
        stop = asyncio.Event()
        task = asyncio.create_task(app.client_reporter.run(stop))
        await asyncio.wait_for(broker.arrived.wait(), HANG_S)  # the first report, at start
        broker.arrived.clear()
        app.sessions.terminate("client-1")  # NotifyClientTermination
        await asyncio.wait_for(broker.arrived.wait(), HANG_S)
        stop.set()
        await task
        return broker.reports

    assert asyncio.run(scenario()) == [["client-1", "client-2"], ["client-2"]]


def test_an_expired_client_is_reported_at_once() -> None:
    async def scenario() -> list[list[str]]:
        broker = RecordingBroker()
        expired: list[str] = []
        sessions = SessionRegistry(0.0, on_expire=expired.append)
        reporter = ClientReporter(OneBroker(broker), sessions, "127.0.0.1:8081", LONG_INTERVAL_S)  # type: ignore[arg-type]
        sessions.touch("client-1")
        stop = asyncio.Event()
        task = asyncio.create_task(reporter.run(stop))
        await asyncio.wait_for(broker.arrived.wait(), HANG_S)
        broker.arrived.clear()
        assert sessions.sweep() == ["client-1"] == expired
        reporter.wake()  # what ProxyApp's on_expire does
        await asyncio.wait_for(broker.arrived.wait(), HANG_S)
        stop.set()
        await task
        return broker.reports

    assert asyncio.run(scenario()) == [["client-1"], []]
