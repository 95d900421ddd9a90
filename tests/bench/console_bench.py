#!/usr/bin/env python3
"""How fast the console's pages answer on a cluster with 1,000 topics and 1,000 consumer groups.

    .venv/bin/python tests/bench/console_bench.py [--topics 1000] [--groups 1000] [--rounds 50] [--json]

Starts one merged `sluice up` (its console on a free port, data in a temp dir), creates the topics
and groups through the admin functions (`admin.topics.create_topic`, `groups.create_group`),
produces a few messages with keys and dead-letters one, then fetches every page `--rounds` times
over plain HTTP (one page at a time, as one operator would) and prints p50, p99 and max per page
(every GET page of the console: cluster, topic and group lists and pages, message searches and a
message, dead letters, access, and a page that does not exist).
Target: every page's p99 under 300 ms. The first fetch of each page is left out (it loads templates).
The figures depend on the machine: on a shared 2-core machine, rerun on a quiet one.
Every process is stopped by PID and the temp dir removed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import shutil
import statistics
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from admin import dlq, groups, topics  # noqa: E402
from admin.cluster import Cluster  # noqa: E402
from broker.client.api import ConsumeFrom, FilterSpec, GroupSpec, PopRequest  # noqa: E402
from common.model import MessageType  # noqa: E402
from common.record import outgoing  # noqa: E402
from tests.helpers.broker_fixtures import SLUICE_ARGV  # noqa: E402
from tests.helpers.procs import LOOPBACK, free_port, start_process  # noqa: E402

TARGET_MS = 300.0
START_TIMEOUT_S = 60.0
CONCURRENCY = 16


async def populate(namesrv: str, topic_count: int, group_count: int) -> dict[str, str]:
    """Create the topics and groups; send keyed messages to the first topic; dead-letter one. Names used."""
    async with Cluster(namesrv, timeout_s=30) as cluster:
        gate = asyncio.Semaphore(CONCURRENCY)

        async def bounded(make: Any) -> None:
            async with gate:
                await make()

        normal = frozenset({MessageType.NORMAL})
        await asyncio.gather(*(bounded(lambda i=i: topics.create_topic(cluster, f"topic-{i:04d}", normal, 4))
                               for i in range(topic_count)))  # fmt: skip
        await asyncio.gather(*(bounded(lambda i=i: groups.create_group(cluster, GroupSpec(
            f"group-{i:04d}", max_delivery_attempts=1, consume_from=ConsumeFrom.EARLIEST)))
            for i in range(group_count)))  # fmt: skip
        (broker,) = await cluster.brokers()
        remote = cluster.broker(broker.broker_name, broker.address)
        sent = []
        for q in range(4):
            batch = [outgoing(body=b'{"n": %d}' % i, message_id=dlq.new_message_id(), keys=(f"k{i}",),
                                     born_timestamp_ms=int(time.time() * 1000)) for i in range(25)]  # fmt: skip
            await remote.send("topic-0000", q, batch)
            sent += batch
        # One delivery with a 1 s invisibility and no ack: with max 1 attempt, it becomes a dead letter.
        await remote.pop(PopRequest("group-0000", "topic-0000", queue_id=0, max_messages=1, invisible_ms=1000,
                                    filter=FilterSpec()))  # fmt: skip
        for _ in range(100):
            if await dlq.read_dead_letters(cluster, "group-0000"):
                break
            await asyncio.sleep(0.2)
        return {"topic": "topic-0000", "group": "group-0000", "message_id": sent[0].message_id}


def pages(names: dict[str, str], topic_count: int, group_count: int) -> dict[str, str]:
    t, g, m = names["topic"], names["group"], names["message_id"]
    return {
        "cluster": "/cluster",
        "topics (page 1)": "/topics",
        f"topics (page {topic_count // 50})": f"/topics?page={topic_count // 50}",
        "topics (filtered)": "/topics?q=-09",
        "topic": f"/topics/{t}",
        "groups (page 1)": "/groups",
        f"groups (page {group_count // 50})": f"/groups?page={group_count // 50}",
        "group": f"/groups/{g}",
        "messages by time": f"/messages?topic={t}",
        "messages by key": f"/messages?topic={t}&key=k3",
        "message": f"/messages/{t}/{m}",
        "dead-letter groups": "/dlq",
        "dead letters": f"/dlq/{g}",
        "access": "/access",
        "messages (form)": "/messages",
        "messages by id": f"/messages?topic={t}&id={m}",
        "not found": "/no-such-page",
    }


EXPECTED_STATUS = {"/no-such-page": 404}


def fetch_ms(console: str, path: str) -> float:
    started = time.perf_counter()
    try:
        with urllib.request.urlopen(console + path, timeout=30) as answer:
            answer.read()
            status = answer.status
    except urllib.error.HTTPError as refused:
        refused.read()
        status = refused.code
    if status != EXPECTED_STATUS.get(path, 200):
        raise RuntimeError(f"{path}: HTTP {status}")
    return (time.perf_counter() - started) * 1000


def measure(console: str, paths: dict[str, str], rounds: int) -> dict[str, dict[str, float]]:
    for path in paths.values():
        fetch_ms(console, path)  # warm: templates compiled, channels open
    samples: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(rounds):
        for name, path in paths.items():
            samples[name].append(fetch_ms(console, path))
    return {name: {"p50_ms": statistics.median(s), "p99_ms": percentile(s, 0.99), "max_ms": max(s)}
            for name, s in samples.items()}  # fmt: skip


def percentile(samples: list[float], share: float) -> float:
    """The nearest-rank percentile: the smallest sample at or above `share` of them."""
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(len(ordered) * share) - 1)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topics", type=int, default=1000)
    parser.add_argument("--groups", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="console-bench-"))
    port, ns_port, broker_port, console_port = free_port(), free_port(), free_port(), free_port()
    argv = [*SLUICE_ARGV, "up", "--data-dir", str(root / "data"), "--port", str(port), "--namesrv-port",
            str(ns_port), "--broker-port", str(broker_port), "--console-port", str(console_port),
            "--flush", "async", "--log-level", "warning", "--no-auto-create"]  # fmt: skip
    child = start_process(argv, port=console_port, log_path=root / "up.log", name="sluice-up",
                          timeout_s=START_TIMEOUT_S)  # fmt: skip
    try:
        started = time.monotonic()
        names = asyncio.run(populate(f"{LOOPBACK}:{ns_port}", args.topics, args.groups))
        print(f"created {args.topics} topics and {args.groups} groups in {time.monotonic() - started:.0f} s",
              file=sys.stderr)  # fmt: skip
        figures = measure(f"http://{LOOPBACK}:{console_port}", pages(names, args.topics, args.groups), args.rounds)
    finally:
        child.stop()
        shutil.rmtree(root, ignore_errors=True)
    worst = max(f["p99_ms"] for f in figures.values())
    if args.json:
        print(json.dumps({"topics": args.topics, "groups": args.groups, "pages": figures, "target_ms": TARGET_MS}))
    else:
        print(f"{'page':<24} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
        for name, f in figures.items():
            print(f"{name:<24} {f['p50_ms']:>8.1f} {f['p99_ms']:>8.1f} {f['max_ms']:>8.1f}")
        print(f"worst p99 {worst:.1f} ms: {'within' if worst < TARGET_MS else 'OVER'} the {TARGET_MS:.0f} ms target")
    return 0 if worst < TARGET_MS else 1


if __name__ == "__main__":
    sys.exit(main())
