"""Navigation by zone across two subnets (issue 43 item 6): a navigation server, a NameServer and two
brokers, proxy pa in zone-a on subnet 1 and pb in zone-b on subnet 2 (a router joins them), and the
official Python client on subnet 1 configured with navigation's answer for zone-a. Routes spread
queues over every proxy they list, so a proxy listing the other zone's sent half of the client's
sends and acks across zones; with a healthy proxy in its zone, at least 99% must stay there."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterator

import pytest

from tests.e2e.support.hostlab import HostCluster
from tests.helpers.hosts import Host, Lab, unavailable

NAMESRV_PORT, NAV_PORT, NAV_HTTP_PORT, BROKER_PORT, PROXY_PORT, METRICS_PORT = 9876, 9877, 9878, 10911, 8081, 9081
CONFIG = """
[broker]
heartbeat_interval_s = 1.0
[proxy]
route_refresh_s = 1.0
navigation_heartbeat_s = 1.0
endpoints_cache_s = 1.0
"""
CALLS = ("SendMessage", "ReceiveMessage", "AckMessage")
IN_ZONE_SHARE = 0.99


@pytest.fixture(scope="module")
def zones(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostCluster]:
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("hosts-zones")
    config = root / "sluice.toml"
    config.write_text(CONFIG)
    with Lab(subnets=2) as lab:
        ns, nav, b1 = lab.add_host("ns", 1), lab.add_host("nav", 1), lab.add_host("b1", 1)
        b2, pa, pb = lab.add_host("b2", 2), lab.add_host("pa", 1), lab.add_host("pb", 2)
        client = lab.add_host("client", 1)
        cluster = HostCluster(lab, root, client, namesrv=ns.endpoint(NAMESRV_PORT))
        cluster.start(ns, "nameserver", "nameserver", "--host", "0.0.0.0", "--port", str(NAMESRV_PORT),
                      port=NAMESRV_PORT)  # fmt: skip
        cluster.start(nav, "navigation", "navigation", "--host", "0.0.0.0", "--port", str(NAV_PORT),
                      "--http-port", str(NAV_HTTP_PORT), port=NAV_HTTP_PORT)  # fmt: skip
        for name, host in (("broker-a", b1), ("broker-b", b2)):
            cluster.start(host, name, "broker", "--host", "0.0.0.0", "--name", name, "--namesrv", cluster.namesrv,
                          "--data-dir", str(root / name), "--config", str(config), port=BROKER_PORT)  # fmt: skip
        cluster.wait_brokers(2)
        for name, host, zone in (("pa", pa, "zone-a"), ("pb", pb, "zone-b")):
            cluster.start(host, name, "proxy", "--host", "0.0.0.0", "--namesrv", cluster.namesrv, "--navigation",
                          nav.endpoint(NAV_PORT), "--zone", zone, "--proxy-id", name, "--workers", "1",
                          "--drain-s", "0", "--metrics-port", str(METRICS_PORT), "--config", str(config),
                          port=PROXY_PORT)  # fmt: skip
        yield cluster


def _get(cluster: HostCluster, url: str) -> str:
    code = f"import urllib.request; print(urllib.request.urlopen({url!r}, timeout=10).read().decode())"
    return cluster.client.run([sys.executable, "-c", code]).stdout


def calls_at(cluster: HostCluster, proxy: Host) -> int:
    """The data-plane calls `proxy` answered (its /metrics, read from the client host)."""
    text = _get(cluster, f"http://{proxy.endpoint(METRICS_PORT)}/metrics")
    pattern = re.compile(r'^sluice_proxy_rpc_requests_total\{code="[A-Z_]+",rpc="(\w+)"\} ([0-9.e+]+)$', re.M)
    return int(sum(float(n) for rpc, n in pattern.findall(text) if rpc in CALLS))


def test_a_client_s_calls_stay_in_its_zone(zones: HostCluster, unique: Callable[[str], str]) -> None:
    pa, pb, nav = (zones.lab.hosts[n] for n in ("pa", "pb", "nav"))
    endpoints = ""
    for _ in range(50):  # until navigation lists both proxies (they announce every second)
        endpoints = _get(zones, f"http://{nav.endpoint(NAV_HTTP_PORT)}/v1/endpoints?zone=zone-a&format=text").strip()
        if len(endpoints.split(";")) == 2:
            break
    assert endpoints == f"{pa.endpoint(PROXY_PORT)};{pb.endpoint(PROXY_PORT)}", endpoints
    topic, group = unique("t"), unique("g")
    zones.admin("topic", "create", topic, "--queues", "4")
    zones.admin("group", "create", group)
    before = calls_at(zones, pa), calls_at(zones, pb)
    child, events = zones.traffic(endpoints, topic, group, produce_s=4)
    seen = zones.finish(child, events, 4 + 30)
    seen.history.verdict().assert_nothing_lost()
    in_zone, across = calls_at(zones, pa) - before[0], calls_at(zones, pb) - before[1]
    print(f"zone-a client: {in_zone} calls through pa (zone-a), {across} through pb (zone-b)")
    assert in_zone / (in_zone + across) >= IN_ZONE_SHARE, (in_zone, across)
