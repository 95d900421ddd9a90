#!/usr/bin/env python3
"""Lite against normal topics as users send and receive: the official Python client, either topology.

    .venv/bin/python tests/bench/lite_client_bench.py [--active 1000,100000] [--seconds 5] [--rounds 2]
                                                      [--threads 32] [--topology merged] [--json]

One merged `sluice up` (async flush, default configuration), or with `--topology separated` a
NameServer, a broker (async flush) and a proxy, each its own process. Per `--active` count N, with
the official Python client (tests/bench/clients/official_python.py), 1 KiB bodies:

- SEND: `Producer.send` from `--threads` threads (one message per SendMessage) to a NORMAL topic
  (8 queues) and to a LITE bind topic whose messages name lite topics `l0` .. `l<N-1>` round robin.
  Every lite topic exists and holds one message before the first turn, so the turns measure sends to
  N existing lite topics, not their creation.
- RECEIVE: `--threads` threads looping `receive(32)` + `ack` per message, on LiteSimpleConsumers of a
  second LITE bind topic subscribed to its N lite topics, and on as many SimpleConsumers of a second
  NORMAL topic, over backlogs of the same size B = max(N, rounds x (warm-up + seconds) x 6,000/s),
  spread round robin over the N lite topics. One LiteSimpleConsumer per 10,000 lite topics (the
  default subscription quota per client, as lite_bench.py has one client per 10,000), threads split
  among them; each subscribes its share in one COMPLETE_ADD (`subscribe_lite_all()`, the request the
  client re-sends every 30 s itself) because its `subscribe_lite` is one request per lite topic:
  ~1,000/s here, 100 s for 100,000. Subscribing, like the client start-up, precedes the warm-up.

The pre-fill and the backlogs are unmeasured and sent as a proxy sends: `RemoteBroker` on the
broker's internal port, 500 messages per call (the official client would take ~40 s per 100,000).
Turns alternate lite / normal over `--rounds` rounds so that a neighbour's load falls on both; each
starts with an unmeasured warm-up. Prints per N the send and receive rates (lite, normal, ratio of
the summed turns), the server's CPU (all threads and processes, from /proc) per message, and the
errors. A default run takes about 2.5 minutes. Stops by itself; the server is stopped by PID and its
temp dir removed. On a shared machine compare within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from client_bench import BODY_BYTES, Row, Server, admin, drive, py_driver, start_merged, start_separated

from broker.client.api import CallContext
from broker.client.remote import RemoteBroker
from common.model import MessageType
from common.record import SYSPROP_LITE_TOPIC, outgoing

NORMAL_QUEUES = 8
PER_CONSUMER = 10_000  # lite topics per LiteSimpleConsumer: the default [proxy.settings] lite_subscription_quota
RECV_CEILING = 6_000  # msg/s above what one official Python client process receives here: sizes the backlogs
FILL_BATCH = 500
FILL_IN_FLIGHT = 8
BODY = b"x" * BODY_BYTES


# -- unmeasured fills, as a proxy sends -----------------------------------------------------------


def broker_address(root: Path) -> str:
    """The broker's internal address, from the log of `sluice up` or of the separated broker."""
    for log in [root / "merged.log", *sorted(root.glob("broker-a-*.log"))]:
        found = re.search(r"broker (?:\S+ )?listening on (\S+)", log.read_text()) if log.exists() else None
        if found is not None:
            return found.group(1)
    raise RuntimeError(f"no broker log under {root} names the broker's address")


def fill(address: str, topic: str, count: int, lite_topics: int = 0, queues: int = 1) -> float:
    """Send `count` messages to `topic` (message i to lite topic `l<i mod lite_topics>` if given,
    batches over `queues` queues otherwise); returns the seconds it took."""
    started = time.monotonic()
    asyncio.run(_fill(address, topic, count, lite_topics, queues))
    return time.monotonic() - started


FILLER = CallContext(client_id="lite-client-bench-fill@127.0.0.1")  # the producer the trace names


async def _fill(address: str, topic: str, count: int, lite_topics: int, queues: int) -> None:
    api = RemoteBroker("broker-a", address, timeout_s=120.0)
    sem = asyncio.Semaphore(FILL_IN_FLIGHT)

    def message(i: int) -> bytes:
        props: dict[str, str] = {}
        if not lite_topics:
            return outgoing(BODY, f"{topic}-{i}", system_properties=props)
        props[SYSPROP_LITE_TOPIC] = f"l{i % lite_topics}"
        return outgoing(BODY, f"{topic}-{i}", MessageType.LITE, system_properties=props)

    async def one(start: int) -> None:
        async with sem:
            batch = [message(i) for i in range(start, min(count, start + FILL_BATCH))]
            await api.send(topic, (start // FILL_BATCH) % queues, batch, ctx=FILLER)

    try:
        await asyncio.gather(*(one(s) for s in range(0, count, FILL_BATCH)))
    finally:
        await api.close()


# -- measured turns -------------------------------------------------------------------------------


def turns(server: Server, args: argparse.Namespace, what: str, opts: dict[str, dict[str, Any]]) -> dict[str, Row]:
    """`--rounds` rounds of one turn per kind (normal, lite), alternating which goes first; the rows
    summed per kind."""
    sums = {kind: Row(server.name, "official python", f"{what} {kind}") for kind in opts}
    for r in range(args.rounds):
        for kind in ("normal", "lite") if r % 2 == 0 else ("lite", "normal"):
            full = {**opts[kind], "threads": args.threads, "warmup_s": args.warmup, "seconds": args.seconds}
            row = drive(Row(server.name, "official python", f"{what} {kind}"), py_driver(full), server)
            total = sums[kind]
            total.messages += row.messages
            total.errors += row.errors
            total.seconds += row.seconds
            total.server_cpu_s += row.server_cpu_s
            total.note = total.note or row.note
    return sums


def send_phase(server: Server, endpoint: str, namesrv: str, broker: str, active: int,
               args: argparse.Namespace) -> tuple[dict[str, Row], float]:  # fmt: skip
    lite, normal = f"lcb-lite-{active}", f"lcb-normal-{active}"
    admin(namesrv, "topic", "create", normal, "--queues", str(NORMAL_QUEUES))
    admin(namesrv, "topic", "create", lite, "--type", "lite", "--queues", "1", "--max-lite-topics", str(active + 1))
    prefill_s = fill(broker, lite, active, lite_topics=active)
    base = {"endpoint": endpoint, "mode": "produce", "body_bytes": BODY_BYTES}
    opts = {"normal": {**base, "topic": normal}, "lite": {**base, "topic": lite, "lite_topics": active}}
    return turns(server, args, "send", opts), prefill_s


def receive_phase(server: Server, endpoint: str, namesrv: str, broker: str, active: int,
                  args: argparse.Namespace) -> tuple[dict[str, Row], int, float]:  # fmt: skip
    lite, normal, group = f"lcb-rlite-{active}", f"lcb-rnormal-{active}", f"lcb-g-{active}"
    admin(namesrv, "topic", "create", normal, "--queues", str(NORMAL_QUEUES))
    admin(namesrv, "topic", "create", lite, "--type", "lite", "--queues", "1", "--max-lite-topics", str(active + 1))
    admin(namesrv, "group", "create", group, "--consume-from", "earliest")
    backlog = max(active, round(args.rounds * (args.warmup + args.seconds) * RECV_CEILING))
    fill_s = fill(broker, lite, backlog, lite_topics=active) + fill(broker, normal, backlog, queues=NORMAL_QUEUES)
    consumers = -(-active // PER_CONSUMER)
    base = {"endpoint": endpoint, "group": group, "batch": 32}
    opts = {"normal": {**base, "mode": "consume", "topic": normal, "consumers": consumers},
            "lite": {**base, "mode": "lite_consume", "topic": lite, "lite_topics": active,
                     "per_consumer": PER_CONSUMER}}  # fmt: skip
    return turns(server, args, "receive", opts), backlog, fill_s


def rates(sums: dict[str, Row]) -> dict[str, Any]:
    lite, normal = sums["lite"], sums["normal"]
    return {"lite": round(lite.rate), "normal": round(normal.rate), "ratio": round(lite.rate / normal.rate, 2)}


def cpu(sums: dict[str, Row]) -> dict[str, float]:
    return {kind: round(row.us_per_msg, 1) for kind, row in sums.items()}


def run(args: argparse.Namespace) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="lite-client-bench-"))
    started = time.monotonic()
    start = start_merged if args.topology == "merged" else start_separated
    server, endpoint, namesrv = start(root, [])
    out: dict[str, Any] = {"topology": args.topology, "threads": args.threads, "seconds": args.seconds,
                           "rounds": args.rounds, "active": []}  # fmt: skip
    try:
        broker = broker_address(root)
        for active in args.active:
            sent, prefill_s = send_phase(server, endpoint, namesrv, broker, active, args)
            received, backlog, fill_s = receive_phase(server, endpoint, namesrv, broker, active, args)
            notes = [r.note for r in (*sent.values(), *received.values()) if r.note]
            out["active"].append({
                "active_lite_topics": active,
                "send_msg_s": rates(sent),
                "receive_msg_s": rates(received),
                "server_us_per_msg": {"send": cpu(sent), "receive": cpu(received)},
                "errors": {"send": sum(r.errors for r in sent.values()),
                           "receive": sum(r.errors for r in received.values())},
                "lite_consumers": -(-active // PER_CONSUMER),
                "backlog": backlog,
                "unmeasured_fill_s": {"send_prefill": round(prefill_s, 1), "receive_backlogs": round(fill_s, 1)},
                **({"notes": notes} if notes else {}),
            })  # fmt: skip
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
    out["run_s"] = round(time.monotonic() - started)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=5.0, help="measured seconds per turn")
    ap.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds before each turn")
    ap.add_argument("--rounds", type=int, default=2, help="turns of each kind, alternating")
    ap.add_argument("--active", type=lambda s: [int(x) for x in s.split(",") if x], default=[1000, 100_000])
    ap.add_argument("--threads", type=int, default=32, help="client threads sending, and receiving")
    ap.add_argument(
        "--topology",
        choices=("merged", "separated"),
        default="merged",
        help="one `sluice up`, or a NameServer, a broker and a proxy as separate processes",
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    print(json.dumps(run(args), indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
