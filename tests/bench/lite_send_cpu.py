#!/usr/bin/env python3
"""Broker CPU per message of lite against normal sends (issue 19), for A/B runs of two trees.

    .venv/bin/python tests/bench/lite_send_cpu.py [--active 1000] [--messages 40000] [--rounds 6]
                                                  [--random] [--subscribe]

A `sluice broker` child (lite_bench.py's settings) driven through `RemoteBroker`, 32 messages per
send, 8 in flight, as lite_bench.py's throughput phase: `--messages` lite messages over `--active`
lite topics (created by an unmeasured warm-up), then as many to a NORMAL topic, alternating in
`--rounds` turns. Prints each turn's broker CPU per message (user + system, all threads, from
/proc: steadier on a shared machine than a rate) and the medians. `--random`: each message's lite
topic drawn at random (else round robin); `--subscribe`: every lite topic subscribed (one client per
10,000, as lite_bench.py), so dispatches mark them ready. To compare two trees, run this script
from each in turn (`cd TREE && .venv/bin/python tests/bench/lite_send_cpu.py`).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[2])]

import lite_bench as LB  # noqa: E402

from broker.client.api import GroupSpec, LiteAction, LiteSync, TopicSpec  # noqa: E402
from broker.client.remote import RemoteBroker  # noqa: E402
from common.model import MessageType  # noqa: E402
from tests.helpers.broker_fixtures import start_broker_process  # noqa: E402


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def run(args: argparse.Namespace) -> dict[str, list[float]]:
    root = Path(tempfile.mkdtemp(prefix="lite-send-cpu-"))
    proc = start_broker_process(root, settings=LB.SETTINGS, name=LB.BROKER)
    pid, rnd = proc.child.pid, random.Random(7)
    out: dict[str, list[float]] = {"lite": [], "normal": []}
    try:
        api = RemoteBroker(LB.BROKER, proc.address, timeout_s=120.0)
        try:
            active = args.active
            await api.create_topic(TopicSpec("L", 1, frozenset({MessageType.LITE}), max_lite_topics=active + 1))
            await api.create_topic(TopicSpec("N", 1))
            names = [f"l{i}" for i in range(active)]
            if args.subscribe:
                await api.create_group(GroupSpec("g"))
                for k in range(0, active, 10_000):
                    sync = LiteSync("g", "L", f"c{k}", LiteAction.COMPLETE_ADD, tuple(names[k : k + 10_000]))
                    await api.sync_lite_subscription(sync)
            warm = max(active, 2_000)
            await LB.send_rate(api, "L", [LB.lite(names[i % active], i, f"w{i}") for i in range(warm)])
            await LB.send_rate(api, "N", [LB.plain(f"wn{i}") for i in range(2_000)])
            n, sent = args.messages, 0
            for r in range(args.rounds):
                for kind in ("lite", "normal") if r % 2 == 0 else ("normal", "lite"):
                    if kind == "lite":
                        picks = [rnd.randrange(active) if args.random else (sent + i) % active for i in range(n)]
                        msgs = [LB.lite(names[p], i, f"r{r}-{i}") for i, p in enumerate(picks)]
                        sent += n
                    else:
                        msgs = [LB.plain(f"rn{r}-{i}") for i in range(n)]
                    before = cpu_s(pid)
                    await LB.send_rate(api, "L" if kind == "lite" else "N", msgs)
                    out[kind].append((cpu_s(pid) - before) / n * 1e6)
        finally:
            await api.close()
    finally:
        proc.stop()
        shutil.rmtree(root, ignore_errors=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--active", type=int, default=1_000)
    ap.add_argument("--messages", type=int, default=40_000)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--random", action="store_true")
    ap.add_argument("--subscribe", action="store_true")
    args = ap.parse_args()
    out = asyncio.run(run(args))
    for kind, values in out.items():
        print(f"{kind:<6} broker µs/msg {' '.join(f'{v:.1f}' for v in values)}  median {statistics.median(values):.1f}")
    print(f"normal/lite CPU {statistics.median(out['normal']) / statistics.median(out['lite']):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
