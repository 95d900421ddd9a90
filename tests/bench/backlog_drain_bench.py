#!/usr/bin/env python3
"""How fast a new consumer group drains a backlog that sits on one broker, against the same backlog
spread over both (issue 30), separated topology (NameServer, two brokers, two proxies).

    .venv/bin/python tests/bench/backlog_drain_bench.py [--messages 5000] [--rounds 2]
                                                        [--client python|node|both] [--json]

Each case makes a 4-queue topic on both brokers and puts `--messages` 1 KiB messages on it with the
official Python client (8 sending threads): "one broker" makes the topic read-only on broker-b
first (`sluice admin topic update --perm r --brokers broker-b`), so every message lands on
broker-a while consumers still poll both; "spread" leaves it writable on both. Then a new group
(`--consume-from earliest`) drains it with one official SimpleConsumer (`receive(32, 30)` with the
client's 3 s await, an ack per message); the time from the first receive to the last message is
measured, and the CPU the servers (proxies with their workers, brokers, NameServer) used per
message meanwhile: steadier than the rate on a shared machine. `--client node` drains with the
official Node.js client instead (tests/bench/clients/node_drain.js, the same receives and acks,
through the first proxy: it takes one endpoint; npm installs it into tests/e2e/node/node_modules
as the end-to-end tests do); `both` drains each case with each client (a topic per drain). Round r
runs both cases, "spread" first in even rounds and "one broker" first in odd ones (the second case
of a round drains on stores the first one has just used). The ratio is taken over all rounds
(messages over seconds, per case and client). The issue's bar: one broker at least 0.8x the rate
of spread. Every process is stopped by PID and the temp dir removed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from rocketmq import FilterExpression

from bench.cpu import process_cpu_s
from tests.e2e.support.clients import message, producer, simple_consumer
from tests.e2e.support.cluster import Cluster, start_separated

BODY = b"x" * 1024
SENDERS = 8
DRAIN_TIMEOUT_S = 600.0
NODE_DIR = Path(__file__).resolve().parents[1] / "e2e" / "node"
NODE_DRAIN = Path(__file__).resolve().parent / "clients" / "node_drain.js"


def _node_modules() -> Path:
    """Where npm installed the official Node.js client (installing it first if needed)."""
    modules = NODE_DIR / "node_modules"
    if not (modules / "rocketmq-client-nodejs").exists():
        subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--loglevel=error"], cwd=NODE_DIR,
                       capture_output=True, timeout=300, check=False)  # fmt: skip
    if not (modules / "rocketmq-client-nodejs").exists():
        raise SystemExit(f"the official Node.js client is not installed in {modules} (node and npm needed)")
    return modules


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


def _drain_node(cluster: Cluster, topic: str, group: str, count: int) -> tuple[float, dict[str, int]]:
    opts = {"endpoint": cluster.first_proxy, "topic": topic, "group": group, "count": count,
            "timeoutS": DRAIN_TIMEOUT_S, "modulesDir": str(_node_modules())}  # fmt: skip
    proc = subprocess.run(["node", str(NODE_DRAIN), json.dumps(opts)], capture_output=True, text=True,
                          timeout=DRAIN_TIMEOUT_S + 60, check=False)  # fmt: skip
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise SystemExit(f"node drain gave no result (exit {proc.returncode}): {proc.stderr[-500:]}")
    result = json.loads(lines[-1])
    if result["error"]:
        raise SystemExit(f"node drain failed: {result['error']}")
    return float(result["seconds"]), {str(k): int(v) for k, v in result["by"].items()}


def _case(cluster: Cluster, name: str, count: int, one_broker: bool, round_: int, client: str) -> dict[str, object]:
    topic = cluster.create_topic(f"drain-{name}-{client}-{round_}-{int(time.time())}", queues=4)
    if one_broker:
        cluster.admin("topic", "update", topic, "--perm", "r", "--brokers", "broker-b")
        time.sleep(2.5)  # the proxies' route refresh (1 s here)
    _fill(cluster, topic, count)
    group = cluster.create_group(f"g-{topic}", consume_from="earliest")
    servers = tuple(child.pid for child in cluster.processes.values())
    cpu_before = process_cpu_s(servers)
    seconds, by_broker = (_drain_node if client == "node" else _drain)(cluster, topic, group, count)
    cpu_ms = (process_cpu_s(servers) - cpu_before) * 1000 / count
    return {"round": round_, "client": client, "case": name, "messages": count, "seconds": round(seconds, 2),
            "msg_s": round(count / seconds, 1), "server_cpu_ms_per_msg": round(cpu_ms, 3),
            "delivered_by": by_broker}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=2, help="rounds of both cases, the order alternating")
    parser.add_argument("--client", choices=("python", "node", "both"), default="python")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="sluice-drain-bench-"))
    config = root / "sluice.toml"
    config.write_text("[proxy]\nroute_refresh_s = 1.0\n")
    cluster = start_separated(root / "cluster", config=config)
    clients = ["python", "node"] if args.client == "both" else [args.client]
    rows: list[dict[str, object]] = []
    try:
        for n in range(args.rounds):
            for one_broker in (False, True) if n % 2 == 0 else (True, False):
                name = "one-broker" if one_broker else "spread"
                for client in clients:
                    rows.append(_case(cluster, name, args.messages, one_broker, n, client))
    finally:
        problems = cluster.stop()
        shutil.rmtree(root, ignore_errors=True)

    def rate(client: str, case: str) -> float:
        picked = [r for r in rows if r["case"] == case and r["client"] == client]
        return sum(float(str(r["messages"])) for r in picked) / sum(float(str(r["seconds"])) for r in picked)

    ratios = {client: round(rate(client, "one-broker") / rate(client, "spread"), 2) for client in clients}
    if args.json:
        print(json.dumps({"rows": rows, "one_broker_vs_spread": ratios}))
    else:
        for r in rows:
            print(f"round {r['round']} {r['client']:>6} {r['case']:>10}: {r['messages']} messages drained in "
                  f"{r['seconds']} s = {r['msg_s']} msg/s, servers' CPU {r['server_cpu_ms_per_msg']} ms/msg "
                  f"(delivered by {r['delivered_by']})")  # fmt: skip
        for client, ratio in ratios.items():
            print(f"{client}: one broker / spread over {args.rounds} round(s): {ratio:.2f}x "
                  "(issue 30's bar: at least 0.8x)")  # fmt: skip
    if problems:
        print("teardown: " + "; ".join(problems), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
