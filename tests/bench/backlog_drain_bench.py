#!/usr/bin/env python3
"""How fast a new consumer group drains a backlog that sits on one broker, against the same backlog
spread over both (issue 30), separated topology (NameServer, two brokers, two proxies).

    .venv/bin/python tests/bench/backlog_drain_bench.py [--messages 5000] [--rounds 2] [--json]

Each case makes a 4-queue topic on both brokers and puts `--messages` 1 KiB messages on it with the
official Python client (8 sending threads): "one broker" makes the topic read-only on broker-b
first (`sluice admin topic update --perm r --brokers broker-b`), so every message lands on
broker-a while consumers still poll both; "spread" leaves it writable on both. Then a new group
(`--consume-from earliest`) drains it with one official SimpleConsumer (`receive(32, 30)` with the
client's 3 s await, an ack per message); the time from the first receive to the last message is
measured. Round r runs both cases, "spread" first in even rounds and "one broker" first in odd
ones (the second case of a round drains on stores the first one has just used). The ratio is
taken over all rounds (messages over seconds, per case). The issue's bar: one broker at least
0.8x the rate of spread. Every process is stopped by PID and the temp dir removed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from rocketmq import FilterExpression

from tests.e2e.support.clients import message, producer, simple_consumer
from tests.e2e.support.cluster import Cluster, start_separated

BODY = b"x" * 1024
SENDERS = 8
DRAIN_TIMEOUT_S = 600.0


def _fill(cluster: Cluster, topic: str, count: int) -> None:
    with producer(cluster.endpoints, topic) as p:

        def send(share: int) -> None:
            for _ in range(share):
                p.send(message(topic, BODY))

        threads = [threading.Thread(target=send, args=(count // SENDERS + (i < count % SENDERS),))
                   for i in range(SENDERS)]  # fmt: skip
        for t in threads:
            t.start()
        for t in threads:
            t.join()


def _drain(cluster: Cluster, topic: str, group: str, count: int) -> tuple[float, dict[str, int]]:
    """Seconds to receive `count` messages, and how many each broker delivered."""
    by_broker: dict[str, int] = {}
    with simple_consumer(cluster.endpoints, group, {topic: FilterExpression()}, await_duration_s=3) as c:
        got = 0
        start = time.monotonic()
        while got < count:
            if time.monotonic() - start > DRAIN_TIMEOUT_S:
                raise SystemExit(f"drained {got} of {count} in {DRAIN_TIMEOUT_S} s")
            for m in c.receive(32, 30):
                c.ack(m)
                broker = m.receipt_handle.split("~", 1)[0]
                by_broker[broker] = by_broker.get(broker, 0) + 1
                got += 1
        return time.monotonic() - start, by_broker


def _case(cluster: Cluster, name: str, count: int, one_broker: bool, round_: int) -> dict[str, object]:
    topic = cluster.create_topic(f"drain-{name}-{round_}-{int(time.time())}", queues=4)
    if one_broker:
        cluster.admin("topic", "update", topic, "--perm", "r", "--brokers", "broker-b")
        time.sleep(2.5)  # the proxies' route refresh (1 s here)
    _fill(cluster, topic, count)
    group = cluster.create_group(f"g-{topic}", consume_from="earliest")
    seconds, by_broker = _drain(cluster, topic, group, count)
    return {"round": round_, "case": name, "messages": count, "seconds": round(seconds, 2),
            "msg_s": round(count / seconds, 1), "delivered_by": by_broker}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=2, help="rounds of both cases, the order alternating")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="sluice-drain-bench-"))
    config = root / "sluice.toml"
    config.write_text("[proxy]\nroute_refresh_s = 1.0\n")
    cluster = start_separated(root / "cluster", config=config)
    rows: list[dict[str, object]] = []
    try:
        for n in range(args.rounds):
            for one_broker in (False, True) if n % 2 == 0 else (True, False):
                name = "one-broker" if one_broker else "spread"
                rows.append(_case(cluster, name, args.messages, one_broker=one_broker, round_=n))
    finally:
        problems = cluster.stop()
        shutil.rmtree(root, ignore_errors=True)

    def rate(case: str) -> float:
        picked = [r for r in rows if r["case"] == case]
        return sum(float(str(r["messages"])) for r in picked) / sum(float(str(r["seconds"])) for r in picked)

    ratio = rate("one-broker") / rate("spread")
    if args.json:
        print(json.dumps({"rows": rows, "one_broker_vs_spread": round(ratio, 2)}))
    else:
        for r in rows:
            print(f"round {r['round']} {r['case']:>10}: {r['messages']} messages drained in {r['seconds']} s = "
                  f"{r['msg_s']} msg/s (delivered by {r['delivered_by']})")  # fmt: skip
        print(f"one broker / spread over {args.rounds} round(s): {ratio:.2f}x (issue 30's bar: at least 0.8x)")
    if problems:
        print("teardown: " + "; ".join(problems), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
