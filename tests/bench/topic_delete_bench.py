#!/usr/bin/env python3
"""How long deleting a topic takes on one broker, and what it leaves (docs/operations.md, "Deleting a topic").

    PYTHONPATH=$PWD .venv/bin/python tests/bench/topic_delete_bench.py [--messages 200000] [--queues 8]
        [--groups 4] [--in-flight 2000] [--timers 2000]

A `LocalBroker` in a temporary directory (no replication, no tiering): a topic with `--messages`
1 KiB messages over `--queues` queues, `--groups` groups each holding `--in-flight` of them popped
and not acked, and `--timers` DELAY messages pending; plus another topic as big, which the deletion
must leave alone. Then `delete_topic`, timed (wall time on the event loop, and the event loop's
longest stall while it ran, measured by a ticker every millisecond); then what is left: the
topic's queue bounds, and the CommitLog bytes, which only retention gives back.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from pathlib import Path

from broker.client.api import ConsumeFrom, GroupSpec, PopRequest, TopicSpec
from broker.config import BrokerConfig
from broker.local import LocalBroker
from common.model import MessageType
from common.record import outgoing

BODY = (b"sluice-benchmark-" * 64)[:1024]
BATCH = 64
TYPES = frozenset({MessageType.NORMAL, MessageType.DELAY})


async def fill(broker: LocalBroker, topic: str, queues: int, messages: int) -> None:
    for start in range(0, messages, BATCH):
        n = min(BATCH, messages - start)
        records = [outgoing(body=BODY, message_id=f"{topic}-{start + i:012d}") for i in range(n)]
        await broker.send(topic, (start // BATCH) % queues, records)


async def run(args: argparse.Namespace, directory: Path) -> None:
    broker = LocalBroker(BrokerConfig(name="bench", data_dir=directory))
    await broker.start()
    try:
        for topic in ("doomed", "kept"):
            await broker.create_topic(TopicSpec(topic, args.queues, TYPES))
        t0 = time.perf_counter()
        for topic in ("doomed", "kept"):
            await fill(broker, topic, args.queues, args.messages)
        due = int(time.time() * 1000) + 3_600_000
        for start in range(0, args.timers, BATCH):
            timers = [outgoing(body=BODY, message_id=f"timer-{start + i}", message_type=MessageType.DELAY,
                               delivery_timestamp_ms=due) for i in range(min(BATCH, args.timers - start))]  # fmt: skip
            await broker.send("doomed", 0, timers)
        for g in range(args.groups):
            group = f"g{g}"
            await broker.create_group(GroupSpec(group, consume_from=ConsumeFrom.EARLIEST))
            popped = 0
            while popped < args.in_flight:
                got = await broker.pop(PopRequest(group, "doomed", max_messages=32, invisible_ms=3_600_000))
                popped += len(got)
        shape = f"{args.queues} queues, {args.groups} groups x {args.in_flight} in flight, {args.timers} timers"
        print(f"filled in {time.perf_counter() - t0:.1f} s: 2 topics x {args.messages} messages over {shape}")

        stalls: list[float] = []
        done = asyncio.Event()

        async def ticker() -> None:
            last = time.perf_counter()
            while not done.is_set():
                await asyncio.sleep(0.001)
                now = time.perf_counter()
                stalls.append(now - last)
                last = now

        ticking = asyncio.create_task(ticker())
        before = broker.store.stats().commitlog_end - broker.store.stats().commitlog_min
        t0 = time.perf_counter()
        await broker.delete_topic("doomed")
        took = time.perf_counter() - t0
        done.set()
        await ticking
        print(f"delete_topic: {took * 1000:.0f} ms wall, longest event-loop stall {max(stalls) * 1000:.0f} ms")
        bounds = [broker.store.queue_bounds("doomed", q) for q in range(args.queues)]
        kept = [broker.store.queue_bounds("kept", q) for q in range(args.queues)]
        inflight = broker.pop_state.inflight
        held = sum(inflight[(f"g{g}", "doomed", q)] for g in range(args.groups) for q in range(args.queues))
        print(f"after: doomed queue bounds {bounds[:3]}..., kept {kept[:3]}..., pending timers "
              f"{broker.timers.pending_count('doomed')}, in flight {held}")  # fmt: skip
        after = broker.store.stats().commitlog_end - broker.store.stats().commitlog_min
        print(f"CommitLog: {before / 2**20:.0f} MiB before, {after / 2**20:.0f} MiB after (retention reclaims it)")
    finally:
        await broker.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--queues", type=int, default=8)
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--in-flight", type=int, default=2_000)
    ap.add_argument("--timers", type=int, default=2_000)
    args = ap.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="sluice-delete-bench-"))
    try:
        asyncio.run(run(args, directory))
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
