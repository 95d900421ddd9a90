#!/usr/bin/env python3
"""Seeded fault schedules against a replicated group (docs/replication.md), history-checked.

    .venv/bin/python tests/bench/failover_soak.py [--seeds 1 2 3] [--faults 8] [--gap-s 4]

Per seed: etcd, a NameServer, one group of three `sluice broker --group g1 --min-insync 2` and one
proxy (tests/e2e/support/replicated.py, `lease_ttl_s` 2), a producer of a normal topic and one of a
FIFO topic (4 message groups, sent in order) through the official Python client, a SimpleConsumer
acking everything. `--faults` faults drawn from the seed, `--gap-s` apart: SIGKILL of the primary
(restarted after it was replaced), SIGSTOP of the primary for 4 s, SIGKILL of a replica (restarted
after 3 s), SIGSTOP of etcd for 1.5 s. Reported per seed and fault kind: sends acknowledged and
failed after the client's own retries, the longest span without an acknowledged send around each
fault, and the history verdict (lost, redelivered after ack, FIFO order). Every process is stopped
at the end. Figures on a shared machine are noisy.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from rocketmq import FilterExpression, Producer  # noqa: E402

from tests.e2e.support.clients import message, producer, simple_consumer  # noqa: E402
from tests.e2e.support.cluster import Cluster  # noqa: E402
from tests.e2e.support.history import History  # noqa: E402
from tests.e2e.support.replicated import (  # noqa: E402
    MEMBERS,
    consume,
    new_primary,
    primary,
    restart,
    retrying,
    start_replicated,
    wait,
)
from tests.helpers.etcd import EtcdProcess, start_etcd  # noqa: E402

FAULTS = ("kill-primary", "stop-primary", "kill-replica", "stop-etcd")
FIFO_GROUPS = 4


class Sends:
    """What the producers saw: each acknowledged send's time, and sends that failed after retries."""

    def __init__(self) -> None:
        self.acked_at: list[float] = []
        self.failed = 0
        self.lock = threading.Lock()

    def ok(self) -> None:
        with self.lock:
            self.acked_at.append(time.monotonic())

    def fail(self) -> None:
        with self.lock:
            self.failed += 1

    def longest_gap(self, start: float, end: float) -> float:
        with self.lock:
            stamps = [start, *(t for t in self.acked_at if start <= t <= end), end]
        return max(b - a for a, b in itertools.pairwise(stamps))


def produce(client: Producer, topic: str, history: History, sends: Sends, stop: threading.Event, fifo: bool) -> None:
    rng, n = random.Random(7), Counter[str]()
    while not stop.is_set():
        key = f"k{rng.randrange(FIFO_GROUPS)}" if fifo else "n"
        body = f"{topic}:{key}:{n[key]}"
        try:
            client.send(message(topic, body.encode(), group=key if fifo else None))
        except Exception:  # failed after the client's own retries
            sends.fail()
            time.sleep(0.05)
            continue  # a FIFO group tries the same number again: its order stays defined
        history.sent(body, stream=key if fifo else None)
        sends.ok()
        n[key] += 1


def inject(cluster: Cluster, etcd: EtcdProcess, fault: str) -> None:
    victim = primary(cluster)
    if fault == "kill-primary":
        cluster.kill(victim)
        wait("a new primary", lambda: new_primary(cluster, victim))
        restart(cluster, victim)
    elif fault == "stop-primary":
        cluster.processes[victim].signal(signal.SIGSTOP)
        time.sleep(4.0)
        cluster.processes[victim].signal(signal.SIGCONT)
    elif fault == "kill-replica":
        replica = next(m for m in MEMBERS if m != victim)
        cluster.kill(replica)
        time.sleep(3.0)
        restart(cluster, replica)
    else:
        etcd.child.signal(signal.SIGSTOP)
        time.sleep(1.5)
        etcd.child.signal(signal.SIGCONT)


def run_seed(seed: int, faults: int, gap_s: float, root: Path) -> dict[str, Any]:
    rng = random.Random(seed)
    etcd = start_etcd(root)
    cluster = start_replicated(root, etcd.url)
    try:
        # Retried: on a loaded machine the group may change primaries while it settles.
        normal, fifo, group_n, group_f = f"soak-n-{seed}", f"soak-f-{seed}", f"soak-gn-{seed}", f"soak-gf-{seed}"
        retrying("create the normal topic", lambda: cluster.create_topic(normal))
        retrying("create the FIFO topic", lambda: cluster.create_topic(fifo, message_type="fifo"))
        retrying("create a group", lambda: cluster.create_group(group_n))
        retrying("create a FIFO group", lambda: cluster.create_group(group_f, fifo=True))
        # One history per topic: a history knows stored copies by (queue, offset), not by topic.
        history_n, history_f, sends, stop = History(), History(), Sends(), threading.Event()
        per_fault: dict[str, list[float]] = {f: [] for f in FAULTS}
        with producer(cluster.endpoints, normal, fifo) as client, \
                simple_consumer(cluster.endpoints, group_n, {normal: FilterExpression()}) as cn, \
                simple_consumer(cluster.endpoints, group_f, {fifo: FilterExpression()}) as cf:  # fmt: skip
            held: list[Any] = []
            threads = [
                threading.Thread(target=produce, args=(client, normal, history_n, sends, stop, False)),
                threading.Thread(target=produce, args=(client, fifo, history_f, sends, stop, True)),
                threading.Thread(target=consume, args=(cn, history_n, held, stop.is_set), kwargs={"hold": False,
                                                                                                "timeout_s": 3600}),
                threading.Thread(target=consume, args=(cf, history_f, held, stop.is_set), kwargs={"hold": False,
                                                                                                "timeout_s": 3600}),
            ]  # fmt: skip
            for t in threads:
                t.start()
            try:
                time.sleep(gap_s)
                for _ in range(faults):
                    fault = rng.choice(FAULTS)
                    start = time.monotonic()
                    inject(cluster, etcd, fault)
                    time.sleep(gap_s)
                    per_fault[fault].append(round(sends.longest_gap(start, time.monotonic()), 2))
            finally:
                stop.set()
                for t in threads:
                    t.join(120)
            for consumer, history in ((cn, history_n), (cf, history_f)):
                everything = set(history.sends)
                consume(consumer, history, held, lambda h=history, e=everything: e <= h.settled(), hold=False)
        attempts = len(sends.acked_at) + sends.failed
        return {
            "seed": seed,
            "acknowledged": len(sends.acked_at),
            "failed_after_retries": sends.failed,
            "failed_pct": round(100 * sends.failed / max(1, attempts), 2),
            "longest_gap_s_per_fault": {f: g for f, g in per_fault.items() if g},
            "verdict": {"normal": history_n.verdict().summary(), "fifo": history_f.verdict().summary()},
        }
    finally:
        cluster.stop()
        etcd.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--faults", type=int, default=8)
    parser.add_argument("--gap-s", type=float, default=4.0)
    args = parser.parse_args()
    for seed in args.seeds:
        with tempfile.TemporaryDirectory(prefix=f"soak-{seed}-") as tmp:
            print(json.dumps(run_seed(seed, args.faults, args.gap_s, Path(tmp))), flush=True)


if __name__ == "__main__":
    main()
