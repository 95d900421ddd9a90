#!/usr/bin/env python3
"""Seeded fault schedules against a replicated group (docs/replication.md), history-checked.

    .venv/bin/python tests/bench/failover_soak.py [--seeds 1 2 3] [--faults 8] [--gap-s 4] [--partitions] [--hosts]

Per seed: etcd, a NameServer, one group of three `sluice broker --group g1 --min-insync 2` and two
proxies listing each other in routes (`lease_ttl_s` 2), a producer of a normal topic and one of a
FIFO topic (4 message groups, sent in order) through the official Python client given both proxies,
a SimpleConsumer of the normal topic and two of the FIFO topic's group, acking everything.
`--faults` faults drawn from the seed, `--gap-s` apart: SIGKILL of the primary (restarted after it
was replaced), SIGSTOP of the primary for 4 s, SIGKILL of a replica (restarted after 3 s), SIGSTOP
of etcd for 1.5 s, SIGKILL of the proxy the FIFO sends go through (restarted after 3 s); with
`--partitions` also one replica's replication path cut for 3 s (blackhole or resets) and both
replicas' paths blackholed for 3 s (tests/e2e/support/schedules.py; the e2e suite runs two of the
seeds, 2 and 27 with partitions, in tests/e2e/test_failover_schedules.py). One JSON line per seed: per
topic the sends acknowledged and failed after the client's own retries and the history verdict
(lost, redelivered after ack, FIFO order, a handle version delivered twice); per fault kind the
longest span without an acknowledged send from the fault on, and the sends that failed after the
client's retries from the fault on (until the next one). Every process is stopped at the end.
With `--hosts` (root) the same runs across network-namespace hosts, every process on a host of its
own and the client on another, and the partitions take hosts off the network instead of cutting
relays: a replica's host, both replicas' hosts, the primary's host until another member took the
group (tests/e2e/support/hostschedules.py). Figures on a shared machine are noisy.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from tests.e2e.support.hostschedules import draw_on_hosts, run_host_schedule  # noqa: E402
from tests.e2e.support.schedules import draw, run_schedule  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--faults", type=int, default=8)
    parser.add_argument("--gap-s", type=float, default=4.0)
    parser.add_argument("--partitions", action="store_true", help="draw partitions between members too")
    parser.add_argument("--hosts", action="store_true", help="across namespace hosts (root); partitions by links")
    args = parser.parse_args()
    drawn, run = (draw_on_hosts, run_host_schedule) if args.hosts else (draw, run_schedule)
    for seed in args.seeds:
        with tempfile.TemporaryDirectory(prefix=f"soak-{seed}-") as tmp:
            faults = drawn(seed, args.faults, partitions=args.partitions)
            result = run(Path(tmp), faults, args.gap_s, name=f"soak-{seed}")
            print(json.dumps({"seed": seed, **result}), flush=True)


if __name__ == "__main__":
    main()
