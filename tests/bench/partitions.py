#!/usr/bin/env python3
"""Partitions between hosts (issue 43): how long an application goes without an acknowledged send.

    .venv/bin/python tests/bench/partitions.py [--topologies separated merged replicated] [--cut-s 6]
        [--repeat N]

As root, on network-namespace hosts (tests/helpers/hosts.py; every Sluice process on 0.0.0.0 in a
host of its own, the official Python client on a client host; tests/e2e/support/hosttopologies.py),
per topology one cluster and, one after another, each of its hosts' cuts while the client produces
one message at a time (a FIFO topic with 4 message groups for the replicated group's primary) and
consumes: separated, broker-b's host (another broker of the topic stays healthy), each proxy's host
(the client was given both; its gRPC channel for routes dials p1, the lower address), the
NameServer's; merged, node-2's host (the client was given node n1); replicated, a replica's host
and then the primary's (another member takes the group). One JSON line per cut: the longest time
without an acknowledged send during the cut and after the heal, the sends acknowledged during the
cut (with a cut longer than the client's 30-s route refresh: whether routes stopped sending it to
the cut host, proxy/reach.py), the first receive after the heal,
sends failed after the client's own retries, and the history verdict (lost, redelivered after ack,
FIFO order). With `--repeat N` each topology's cuts run N times on its cluster (a fresh topic
each time): where a cut lands in the client's round of queues is chance, so one cut is one draw.
Every process, namespace and bridge is removed at the end. Figures on a shared machine are noisy.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from tests.e2e.support import hosttopologies as topo  # noqa: E402
from tests.e2e.support.hostlab import HostCluster  # noqa: E402
from tests.helpers.hosts import Lab, unavailable  # noqa: E402

WARM_S, AFTER_S = 3.0, 5.0
PRIMARY_CUT_S = 4.0  # past the 2-s lease: another member takes the group


def _topic(cluster: HostCluster, fifo: bool = False) -> tuple[str, str]:
    tag = uuid.uuid4().hex[:8]
    topic, group = f"bench-t-{tag}", f"bench-g-{tag}"
    cluster.admin("topic", "create", topic, "--queues", "4", "--type", "fifo" if fifo else "normal")
    cluster.admin("group", "create", group, *(["--fifo"] if fifo else []))
    return topic, group


def separated(cluster: HostCluster, cut_s: float) -> list[dict[str, object]]:
    endpoints = ";".join(cluster.lab.hosts[p].endpoint(topo.PROXY_PORT) for p in ("p1", "p2"))
    return [
        topo.cut_during_traffic(cluster, cluster.lab.hosts[victim], endpoints, *_topic(cluster), warm_s=WARM_S,
                                cut_s=cut_s, after_s=AFTER_S).figures()
        for victim in ("b2", "p1", "p2", "ns")
    ]  # fmt: skip


def merged(cluster: HostCluster, cut_s: float) -> list[dict[str, object]]:
    n1, n2 = cluster.lab.hosts["n1"], cluster.lab.hosts["n2"]
    cut = topo.cut_during_traffic(cluster, n2, n1.endpoint(topo.PROXY_PORT), *_topic(cluster), warm_s=WARM_S,
                                  cut_s=cut_s, after_s=AFTER_S)  # fmt: skip
    return [cut.figures()]


def replicated(cluster: HostCluster, cut_s: float) -> list[dict[str, object]]:
    proxy = cluster.lab.hosts["px"].endpoint(topo.PROXY_PORT)
    primary = topo.wait_for_primary(cluster)
    replica = cluster.lab.hosts[next(m for m in topo.MEMBERS if m != primary)]
    rows = [topo.cut_during_traffic(cluster, replica, proxy, *_topic(cluster), warm_s=WARM_S, cut_s=cut_s,
                                    after_s=AFTER_S).figures()]  # fmt: skip
    primary = topo.wait_for_primary(cluster)
    cut = topo.cut_during_traffic(cluster, cluster.lab.hosts[primary], proxy, *_topic(cluster, fifo=True),
                                  warm_s=WARM_S, cut_s=PRIMARY_CUT_S, after_s=AFTER_S, fifo_groups=4)  # fmt: skip
    return [*rows, {**cut.figures(), "primary_after": topo.routed_primary(cluster)}]


Build = Callable[[Lab, Path], HostCluster]
Run = Callable[[HostCluster, float], list[dict[str, object]]]
SCENARIOS: dict[str, tuple[Build, Run]] = {
    "separated": (topo.separated, separated),
    "merged": (topo.merged, merged),
    "replicated": (topo.replicated, replicated),
}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--topologies", nargs="+", choices=sorted(SCENARIOS), default=list(SCENARIOS))
    parser.add_argument("--cut-s", type=float, default=6.0, help="how long a host stays cut off (default 6)")
    parser.add_argument("--repeat", type=int, default=1, help="each topology's cuts this many times (default 1)")
    args = parser.parse_args()
    reason = unavailable()
    if reason:
        raise SystemExit(f"partitions bench: {reason}")
    for name in args.topologies:
        build, run = SCENARIOS[name]
        with tempfile.TemporaryDirectory(prefix=f"partitions-{name}-") as tmp, Lab() as lab:
            cluster = build(lab, Path(tmp))
            for _ in range(args.repeat):
                for row in run(cluster, args.cut_s):
                    print(json.dumps({"topology": name, **row}), flush=True)


if __name__ == "__main__":
    main()
