#!/usr/bin/env python3
"""Lite topic and priority benchmark on a real broker process (docs/lite-topics.md, docs/priority.md).

    .venv/bin/python tests/bench/lite_bench.py [--lite-topics 1000000] [--bind-topics 10]
        [--active 1000,100000] [--messages 20000] [--subscribe 10000] [--priority-backlog 100000] [--json]

A `sluice broker` child process (async flush) is driven over loopback gRPC through `RemoteBroker`,
as a proxy drives it. Phases (each skipped when its flag is 0):

1. Scale, on a broker of its own: `--lite-topics` lite topics over `--bind-topics` bind topics, one
   message each. Reports the growth of the index directory (RocksDB, measured after a clean stop, so
   memtables are on disk) per lite topic and the broker's RSS growth. Targets: < 200 bytes of index per lite topic,
   < 300 MiB RSS growth.
2. Throughput at each `--active` count: `--messages` lite messages sent round robin over that many
   lite topics (32 per send), then received by consumers subscribed to all of them (pop 32, ack),
   against a NORMAL topic's send and pop+ack rates measured in the same run. Target: >= 80%.
   The sends again in the shape a proxy forwards the official clients' (one message per send, many
   in flight, a normal topic's spread over its 8 queues): `send_forwarded_msg_s`.
3. COMPLETE_ADD of `--subscribe` lite topics (created by it) answered in < 1 s.
4. Priority: a `--priority-backlog` over 10 levels consumed strictly highest first (checked), at
   >= 80% of a NORMAL topic's consume rate in the same run.

Phases 2-4 share a second broker. The run stops by itself; each child is stopped by PID and its
temp dir removed. Figures on a shared
2-core machine are noisy: compare within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import itertools
import json
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:  # run as a script: make `tests.helpers` importable
    sys.path.insert(0, str(REPO_ROOT))

from broker.client.api import (  # noqa: E402
    CallContext,
    GroupSpec,
    LiteAction,
    LiteSync,
    PopRequest,
    TopicSpec,
)
from broker.client.remote import RemoteBroker  # noqa: E402
from common.model import MessageType  # noqa: E402
from common.record import (  # noqa: E402
    SYSPROP_LITE_TOPIC,
    SYSPROP_PRIORITY,
    outgoing,
)
from tests.helpers.broker_fixtures import start_broker_process  # noqa: E402

BROKER = "lite-bench"
BATCH = 32
SCALE_BATCH = 500
CONCURRENCY = 8
FORWARD_IN_FLIGHT = 256  # single-message sends in flight in the forwarded shape (a proxy's many clients)
NORMAL_QUEUES = 8  # the normal topic of the forwarded shape: the admin CLI's default queue count
SEND_ROUNDS = 8  # turns of a send-rate comparison
BODY = b"x" * 64
PRODUCER_ID = "bench-producer@127.0.0.1"
AS_PRODUCER = CallContext(client_id=PRODUCER_ID)  # as a proxy sends for a producer
SETTINGS = {"store": {"commitlog": {"flush_policy": "async"}},
            "lite": {"max_subscriptions": 200_000, "max_lite_topics": 2_000_000}}  # fmt: skip


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def as_proxy(**system_properties: str) -> dict[str, str]:
    """A message's system properties as a proxy hands them to a broker (its producer's client id
    travels in the call's context: `AS_PRODUCER`)."""
    return dict(system_properties)


def plain(mid: str) -> bytes:
    return outgoing(BODY, mid, system_properties=as_proxy())


def lite(topic_name: str, i: int, mid: str) -> bytes:
    return outgoing(BODY, mid, MessageType.LITE, system_properties=as_proxy(**{SYSPROP_LITE_TOPIC: topic_name}))


async def run_all(api: RemoteBroker, jobs: list[Any]) -> None:
    sem = asyncio.Semaphore(CONCURRENCY)

    async def one(job: Any) -> None:
        async with sem:
            await job()

    await asyncio.gather(*(one(j) for j in jobs))


async def scale(api: RemoteBroker, n: int, binds: int) -> None:
    per = n // binds
    for b in range(binds):
        await api.create_topic(TopicSpec(f"bind-{b}", 1, frozenset({MessageType.LITE}), max_lite_topics=per + 1))
    jobs = []
    for b in range(binds):
        for start in range(0, per, SCALE_BATCH):
            batch = [lite(f"s{i}", i, f"b{b}-{i}") for i in range(start, min(per, start + SCALE_BATCH))]
            jobs.append(lambda b=b, batch=batch: api.send(f"bind-{b}", 0, batch, ctx=AS_PRODUCER))
    await run_all(api, jobs)


async def send_rate(api: RemoteBroker, topic: str, msgs: list[bytes]) -> float:
    started = time.perf_counter()
    sends = [lambda i=i: api.send(topic, 0, msgs[i : i + BATCH], ctx=AS_PRODUCER) for i in range(0, len(msgs), BATCH)]
    await run_all(api, sends)
    return len(msgs) / (time.perf_counter() - started)


async def forwarded_rate(api: RemoteBroker, topic: str, msgs: list[bytes], queues: int = 1) -> float:
    """Sends as a proxy forwards the official clients': one message per send (message i to queue
    i mod `queues`), `FORWARD_IN_FLIGHT` at a time; `RemoteBroker` lets those that meet leave together
    on its send stream, as it does in a proxy."""
    sem = asyncio.Semaphore(FORWARD_IN_FLIGHT)

    async def one(i: int) -> None:
        async with sem:
            await api.send(topic, i % queues, [msgs[i]], ctx=AS_PRODUCER)

    started = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(len(msgs))))
    return len(msgs) / (time.perf_counter() - started)


Rate = Callable[[RemoteBroker, str, list[bytes]], Awaitable[float]]


async def interleaved_send_rates(
    api: RemoteBroker, *targets: tuple[str, list[bytes]], rates: Sequence[Rate] = ()
) -> list[float]:
    """Send rates of several (topic, messages), sent in turns of 1/SEND_ROUNDS each: on a shared
    machine the load moves within seconds, and a comparison of two phases run one after the other
    measured the neighbours as much as the broker. `rates`: how each target is sent (`send_rate`
    when not given)."""
    spent = [0.0] * len(targets)
    for r in range(SEND_ROUNDS):
        for k, (topic, msgs) in enumerate(targets):
            part = msgs[r * len(msgs) // SEND_ROUNDS : (r + 1) * len(msgs) // SEND_ROUNDS]
            spent[k] += len(part) / await (rates[k] if rates else send_rate)(api, topic, part)
    return [len(msgs) / t for (_, msgs), t in zip(targets, spent, strict=True)]


async def drain(
    api: RemoteBroker, topic: str, group: str, total: int, clients: list[str]
) -> tuple[int, float, list[int]]:
    """Pop 32 and ack with one consumer per client until `total` arrived; (messages, seconds, the
    order of priorities seen)."""
    got = 0
    order: list[int] = []
    started = time.perf_counter()

    async def consumer(client: str) -> None:
        nonlocal got
        while got < total:
            msgs = await api.pop(PopRequest(group, topic, None, BATCH, 60_000, long_poll_ms=500, lite_client=client))
            if not msgs:
                continue
            got += len(msgs)
            order.extend(int(m.system_properties.get(SYSPROP_PRIORITY, "0")) for m in msgs)
            await api.ack(group, topic, [m.receipt_handle for m in msgs])

    await asyncio.gather(*(consumer(c) for c in clients))
    return got, time.perf_counter() - started, order


async def interleaved_receive_rates(
    api: RemoteBroker, group: str, total: int, *targets: tuple[str, list[str]]
) -> list[float]:
    """Pop+ack rates of several (topic, consumers' client ids) over backlogs of `total` each,
    drained in turns of 1/SEND_ROUNDS (see interleaved_send_rates)."""
    got, spent = [0] * len(targets), [0.0] * len(targets)
    for r in range(SEND_ROUNDS):
        for k, (topic, clients) in enumerate(targets):
            want = (r + 1) * total // SEND_ROUNDS - got[k]
            n, seconds, _ = await drain(api, topic, group, want, clients)
            got[k] += n
            spent[k] += seconds
    return [n / t for n, t in zip(got, spent, strict=True)]


async def throughput(api: RemoteBroker, active: int, messages: int) -> dict[str, Any]:
    topic, normal, spread = f"thr-lite-{active}", f"thr-normal-{active}", f"thr-normal{NORMAL_QUEUES}-{active}"
    await api.create_topic(TopicSpec(topic, 1, frozenset({MessageType.LITE}), max_lite_topics=active + 1))
    await api.create_topic(TopicSpec(normal, 1))
    await api.create_topic(TopicSpec(spread, NORMAL_QUEUES))
    group = f"g-{active}"
    await api.create_group(GroupSpec(group))
    per_client = 10_000
    clients = [f"c{i}" for i in range((active + per_client - 1) // per_client)]
    names = [f"l{i}" for i in range(active)]
    for k, client in enumerate(clients):
        part = tuple(names[k * per_client : (k + 1) * per_client])
        await api.sync_lite_subscription(LiteSync(group, topic, client, LiteAction.COMPLETE_ADD, part))

    # Every consumer gets its share, as every consumer of the normal topic does: message i goes to
    # consumer i % len(clients), to its lite topics round robin.
    def target(i: int) -> str:
        k = i % len(clients)
        mine = min(per_client, active - k * per_client)
        return names[k * per_client + (i // len(clients)) % mine]

    lite_msgs = [lite(target(i), i, f"t{active}-{i}") for i in range(messages)]
    normal_msgs = [plain(f"n{active}-{i}") for i in range(messages)]
    normal_send, lite_send = await interleaved_send_rates(api, (normal, normal_msgs), (topic, lite_msgs))
    # As many again (new ids), one per send as a proxy forwards them; the normal topic's over its
    # queues round robin, as the official clients spread them.
    lite_fwd_msgs = [lite(target(i), i, f"f{active}-{i}") for i in range(messages)]
    normal_fwd_msgs = [plain(f"fn{active}-{i}") for i in range(messages)]
    spread_rate: Rate = functools.partial(forwarded_rate, queues=NORMAL_QUEUES)
    normal_fwd, lite_fwd = await interleaved_send_rates(api, (spread, normal_fwd_msgs), (topic, lite_fwd_msgs),
                                                        rates=(spread_rate, forwarded_rate))  # fmt: skip
    # As many consumers of the normal topic as lite consumers (one per 10,000 subscriptions).
    normal_recv, lite_recv = await interleaved_receive_rates(api, group, messages, (normal, [""] * len(clients)),
                                                             (topic, clients))  # fmt: skip
    return {
        "active_lite_topics": active, "messages": messages,
        "send_msg_s": {"lite": round(lite_send), "normal": round(normal_send),
                       "ratio": round(lite_send / normal_send, 2)},
        "send_forwarded_msg_s": {"lite": round(lite_fwd), "normal": round(normal_fwd),
                                 "ratio": round(lite_fwd / normal_fwd, 2)},
        "receive_msg_s": {"lite": round(lite_recv), "normal": round(normal_recv),
                          "ratio": round(lite_recv / normal_recv, 2)},
    }  # fmt: skip


async def complete_add(api: RemoteBroker, n: int) -> dict[str, Any]:
    await api.create_topic(TopicSpec("sub-bind", 1, frozenset({MessageType.LITE})))
    await api.create_group(GroupSpec("sub-g"))
    names = tuple(f"sub-{i}" for i in range(n))
    started = time.perf_counter()
    await api.sync_lite_subscription(LiteSync("sub-g", "sub-bind", "c-sub", LiteAction.COMPLETE_ADD, names))
    first = time.perf_counter() - started
    started = time.perf_counter()
    await api.sync_lite_subscription(LiteSync("sub-g", "sub-bind", "c-sub", LiteAction.COMPLETE_ADD, names))
    again = time.perf_counter() - started
    # The same set from a new client (a consumer restarted with a new client id) once every lite
    # topic holds a message: each one needs its start position, none is created.
    msgs = [lite(name, k, f"sub-m{k}") for k, name in enumerate(names)]
    await send_rate(api, "sub-bind", msgs)
    started = time.perf_counter()
    await api.sync_lite_subscription(LiteSync("sub-g", "sub-bind", "c-sub-2", LiteAction.COMPLETE_ADD, names))
    existing = time.perf_counter() - started
    return {"lite_topics": n, "first_s": round(first, 3), "resync_s": round(again, 3),
            "new_client_existing_s": round(existing, 3), "under_1s": max(first, existing) < 1.0}  # fmt: skip


async def priority(api: RemoteBroker, backlog: int) -> dict[str, Any]:
    await api.create_topic(TopicSpec("prio", 1, frozenset({MessageType.PRIORITY}), max_priority=9))
    await api.create_topic(TopicSpec("prio-normal", 1))
    await api.create_group(GroupSpec("prio-g"))
    rnd = random.Random(7)
    levels = [str(rnd.randrange(10)) for _ in range(backlog)]
    msgs = [outgoing(BODY, f"p{i}", MessageType.PRIORITY, system_properties=as_proxy(**{SYSPROP_PRIORITY: lvl}))
            for i, lvl in enumerate(levels)]  # fmt: skip
    await send_rate(api, "prio", msgs)
    await send_rate(api, "prio-normal", [plain(f"q{i}") for i in range(backlog)])
    normal_n, normal_s, _ = await drain(api, "prio-normal", "prio-g", backlog, [""])
    n, seconds, order = await drain(api, "prio", "prio-g", backlog, [""])
    normal_rate, rate = normal_n / normal_s, n / seconds
    strict = all(a >= b for a, b in itertools.pairwise(order))
    return {"backlog": backlog, "strictly_highest_first": strict, "consume_msg_s": round(rate),
            "normal_consume_msg_s": round(normal_rate), "ratio": round(rate / normal_rate, 2)}  # fmt: skip


async def scale_phase(args: argparse.Namespace) -> dict[str, Any]:
    """Phase 1 on a broker of its own: the index it leaves is the lite topics' and their messages'
    alone (measured after a clean stop), not that of the other phases' pops and traces."""
    root = Path(tempfile.mkdtemp(prefix="lite-bench-scale-"))
    proc = start_broker_process(root, settings=SETTINGS, name=BROKER)
    out: dict[str, Any] = {"lite_topics": args.lite_topics, "bind_topics": args.bind_topics}
    index_before = 0
    try:
        api = RemoteBroker(BROKER, proc.address, timeout_s=120.0)
        try:
            await api.create_topic(TopicSpec("warm", 1))
            await asyncio.sleep(1)
            index_before = dir_bytes(root / BROKER / "index")
            rss0 = rss_mib(proc.child.pid)
            started = time.perf_counter()
            await scale(api, args.lite_topics, args.bind_topics)
            out["send_s"] = round(time.perf_counter() - started, 1)
            rss1 = rss_mib(proc.child.pid)
            out.update(rss_mib_before=round(rss0, 1), rss_mib_after=round(rss1, 1),
                       rss_growth_mib=round(rss1 - rss0, 1))  # fmt: skip
        finally:
            await api.close()
    finally:
        proc.stop()
        # After a clean stop every RocksDB memtable is on disk (SST or WAL).
        grown = dir_bytes(root / BROKER / "index") - index_before
        out["index_bytes"] = grown
        out["index_bytes_per_lite_topic"] = round(grown / args.lite_topics, 1)
        shutil.rmtree(root, ignore_errors=True)
    return out


async def main(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if args.lite_topics:
        out["scale"] = await scale_phase(args)
    if not (args.active or args.subscribe or args.priority_backlog):
        return out
    root = Path(tempfile.mkdtemp(prefix="lite-bench-"))
    proc = start_broker_process(root, settings=SETTINGS, name=BROKER)
    try:
        api = RemoteBroker(BROKER, proc.address, timeout_s=120.0)
        try:
            for active in args.active:
                out.setdefault("throughput", []).append(await throughput(api, active, args.messages))
            if args.subscribe:
                out["complete_add"] = await complete_add(api, args.subscribe)
            if args.priority_backlog:
                out["priority"] = await priority(api, args.priority_backlog)
        finally:
            await api.close()
    finally:
        proc.stop()
        shutil.rmtree(root, ignore_errors=True)
    return out


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lite-topics", type=int, default=1_000_000)
    p.add_argument("--bind-topics", type=int, default=10)
    p.add_argument("--active", type=lambda s: [int(x) for x in s.split(",") if x], default=[1000, 100_000])
    p.add_argument("--messages", type=int, default=20_000)
    p.add_argument("--subscribe", type=int, default=10_000)
    p.add_argument("--priority-backlog", type=int, default=100_000)
    p.add_argument("--json", action="store_true")
    return p.parse_args()


if __name__ == "__main__":
    ns = parse()
    result = asyncio.run(main(ns))
    print(json.dumps(result, indent=None if ns.json else 2))
