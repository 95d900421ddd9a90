"""Sluice topologies on namespace hosts, and a host cut off while an application runs (issue 43).

Every Sluice process listens on 0.0.0.0 in a host of its own and advertises its host's address;
the official clients run on a client host (support/hostlab.py, tests/helpers/hosts.py):

- `merged`: `sluice up --shards 2` on n1 (the NameServer and two merged nodes, AMQP on 5672, MQTT
  on 1883) and `sluice node` on n2 joining it;
- `separated`: a NameServer on ns, brokers broker-a on b1 and broker-b on b2, proxies on p1 and p2
  listing each other (`--peers`; AMQP on 5672, MQTT on 1883);
- `replicated`: etcd (on 0.0.0.0 too), a NameServer, members m1-m3 of group g1 (`--min-insync 2`,
  lease 2 s) and a proxy on px (or several, px1, px2, ..., listing each other; AMQP on 5672).

`cut_during_traffic` runs the official Producer and SimpleConsumer on the client host, takes a host
off the network for a while, plugs it back, and returns what the application saw with the moments
of the cut and the heal. Used by tests/e2e/test_hosts_*.py (history checks) and
tests/bench/partitions.py (the figures: time without an acknowledged send during a cut and after
the heal).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tests.e2e.support.hostclient import Seen
from tests.e2e.support.hostlab import HostCluster
from tests.helpers.hosts import Host, Lab

NAMESRV_PORT, BROKER_PORT, REPL_PORT, PROXY_PORT, ETCD_PORT = 9876, 10911, 10912, 8081, 2379
AMQP_PORT, MQTT_PORT = 5672, 1883
GROUP = "g1"
MEMBERS = ("m1", "m2", "m3")
CONFIG = """
[broker]
heartbeat_interval_s = 1.0
[broker.replication]
lease_ttl_s = 2
max_lag_ms = 1500
[proxy]
route_refresh_s = 1.0
"""
DRAIN_S = 30.0  # the client's last acknowledged sends are consumed within this after producing ends
TRAFFIC_SLACK_S = 60.0


def _config(root: Path) -> Path:
    path = root / "sluice.toml"
    path.write_text(CONFIG)
    return path


def merged(lab: Lab, root: Path) -> HostCluster:
    n1, n2, client = lab.add_host("n1"), lab.add_host("n2"), lab.add_host("client")
    cluster = HostCluster(lab, root, client, namesrv=n1.endpoint(NAMESRV_PORT))
    cluster.start(n1, "up", "up", "--host", "0.0.0.0", "--shards", "2", "--data-dir", str(root / "n1"),
                  "--console-port", "-1", "--amqp-port", str(AMQP_PORT), "--mqtt-port", str(MQTT_PORT),
                  "--no-auto-create", port=PROXY_PORT)  # fmt: skip
    cluster.start(n2, "node", "node", "--host", "0.0.0.0", "--namesrv", cluster.namesrv, "--name", "node-2",
                  "--data-dir", str(root / "n2"), "--no-auto-create", port=PROXY_PORT)  # fmt: skip
    cluster.wait_brokers(3)
    return cluster


def separated(lab: Lab, root: Path) -> HostCluster:
    config = _config(root)
    ns, b1, b2 = lab.add_host("ns"), lab.add_host("b1"), lab.add_host("b2")
    p1, p2, client = lab.add_host("p1"), lab.add_host("p2"), lab.add_host("client")
    cluster = HostCluster(lab, root, client, namesrv=ns.endpoint(NAMESRV_PORT))
    cluster.start(ns, "nameserver", "nameserver", "--host", "0.0.0.0", "--port", str(NAMESRV_PORT), port=NAMESRV_PORT)
    cluster.start_together([
        (host, name, ["broker", "--host", "0.0.0.0", "--name", name, "--namesrv", cluster.namesrv,
                      "--data-dir", str(root / name), "--config", str(config)], BROKER_PORT)
        for name, host in (("broker-a", b1), ("broker-b", b2))
    ])  # fmt: skip
    cluster.wait_brokers(2)
    peers = ";".join(h.endpoint(PROXY_PORT) for h in (p1, p2))
    cluster.start_together([
        (host, name, ["proxy", "--host", "0.0.0.0", "--namesrv", cluster.namesrv, "--peers", peers, "--workers", "1",
                      "--drain-s", "0", "--config", str(config), "--amqp-port", str(AMQP_PORT),
                      "--mqtt-port", str(MQTT_PORT)], PROXY_PORT)
        for name, host in (("proxy-1", p1), ("proxy-2", p2))
    ])  # fmt: skip
    return cluster


def replicated(lab: Lab, root: Path, *, proxies: int = 1) -> HostCluster:
    """With several `proxies` (px1, px2, ...), each lists the others in routes (`--peers`)."""
    config = _config(root)
    etcd, ns = lab.add_host("etcd"), lab.add_host("ns")
    members = [lab.add_host(name) for name in MEMBERS]
    fronts = [lab.add_host("px" if proxies == 1 else f"px{i + 1}") for i in range(proxies)]
    client = lab.add_host("client")
    cluster = HostCluster(lab, root, client, namesrv=ns.endpoint(NAMESRV_PORT))
    cluster.start_together([
        (etcd, "etcd", ["etcd", "--host", "0.0.0.0", "--port", str(ETCD_PORT), "--data-dir", str(root / "etcd"),
                        "--log-level", "warning"], ETCD_PORT),
        (ns, "nameserver", ["nameserver", "--host", "0.0.0.0", "--port", str(NAMESRV_PORT)], NAMESRV_PORT),
    ])  # fmt: skip
    etcd_url = f"http://{etcd.endpoint(ETCD_PORT)}"
    cluster.start_together([
        (host, host.name, ["broker", "--host", "0.0.0.0", "--name", host.name, "--port", str(BROKER_PORT),
                           "--data-dir", str(root / host.name), "--namesrv", cluster.namesrv, "--group", GROUP,
                           "--etcd", etcd_url, "--min-insync", "2", "--repl-port", str(REPL_PORT),
                           "--config", str(config)], BROKER_PORT)
        for host in members
    ])  # fmt: skip
    cluster.wait_brokers(1)
    peers = ["--peers", ";".join(h.endpoint(PROXY_PORT) for h in fronts)] if proxies > 1 else []
    cluster.start_together([
        (px, px.name, ["proxy", "--host", "0.0.0.0", "--namesrv", cluster.namesrv, "--workers", "1", "--drain-s", "0",
                       "--config", str(config), "--amqp-port", str(AMQP_PORT), *peers], PROXY_PORT)
        for px in fronts
    ])  # fmt: skip
    return cluster


def routed_primary(cluster: HostCluster) -> str | None:
    """The member host the NameServer routes group g1 to (None while it routes it nowhere)."""
    address = next((r["address"] for r in cluster.brokers() if r["broker"] == GROUP), None)
    host = None if address is None else address.rsplit(":", 1)[0]
    return next((h.name for h in cluster.lab.hosts.values() if h.address == host), None)


def wait_for_primary(cluster: HostCluster, other_than: str | None = None, timeout_s: float = 30.0) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        name = routed_primary(cluster)
        if name is not None and name != other_than:
            return name
        assert time.monotonic() < deadline, f"no primary other than {other_than} within {timeout_s} s"
        time.sleep(0.3)


@dataclass
class Cut:
    what: str
    seen: Seen
    cut_at: float
    healed_at: float
    after_s: float

    def figures(self) -> dict[str, object]:
        """Seconds without an acknowledged send during the cut and after the heal, sends acknowledged
        during the cut, the first receive after the heal, failed sends (after the client's own
        retries) and the history verdict."""
        received = self.seen.first_after(self.healed_at, self.seen.received_at)
        verdict = self.seen.history.verdict()
        return {
            "cut": self.what,
            "cut_s": round(self.healed_at - self.cut_at, 2),
            "no_ack_during_cut_s": round(self.seen.longest_gap(self.cut_at, self.healed_at), 2),
            "acked_during_cut": sum(1 for t in self.seen.sent_at if self.cut_at <= t <= self.healed_at),
            "no_ack_after_heal_s": round(self.seen.longest_gap(self.healed_at, self.healed_at + self.after_s), 2),
            "first_receive_after_heal_s": None if received is None else round(received, 2),
            "failed_sends": len(self.seen.failed_at),
            "acknowledged": verdict.acknowledged,
            "lost": len(verdict.lost),
            "redelivered_after_ack": len(verdict.redelivered_after_ack),
            "out_of_order": len(verdict.out_of_order),
        }


def cut_during_traffic(
    cluster: HostCluster, victim: Host, endpoints: str, topic: str, group: str, *, warm_s: float, cut_s: float,
    after_s: float, fifo_groups: int = 0, while_cut: Callable[[], None] | None = None,
) -> Cut:  # fmt: skip
    """Traffic on the client host while `victim` is off the network for `cut_s` (after `warm_s`);
    `while_cut` runs once the cut began (the cut lasts at least until it returns)."""
    produce_s = warm_s + cut_s + after_s
    child, events = cluster.traffic(endpoints, topic, group, produce_s=produce_s, drain_s=DRAIN_S,
                                    fifo_groups=fifo_groups)  # fmt: skip
    time.sleep(warm_s)
    cut_at = time.monotonic()
    victim.cut()
    try:
        if while_cut is not None:
            while_cut()
        time.sleep(max(0.0, cut_at + cut_s - time.monotonic()))
    finally:
        victim.heal()
    healed_at = time.monotonic()
    seen = cluster.finish(child, events, produce_s + DRAIN_S + TRAFFIC_SLACK_S)
    return Cut(f"{victim.name} cut", seen, cut_at, healed_at, after_s)
