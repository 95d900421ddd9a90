#!/usr/bin/env python3
"""Every core, no hop: `sluice up --shards N` for N = 1..cores, with `sluice bench` and the official
clients (issue 29).

    .venv/bin/python tests/bench/shards_bench.py [--seconds 6] [--max-shards N] [--consumers 32]
                                                 [--no-official] [--no-node] [--json]

For each N it starts `sluice up --shards N --flush async` (its own data dir, free loopback ports),
creates the topic (8 queues on every shard) and the groups, then runs one phase after the other:

- `sluice bench` produce: `--batch 32 --concurrency 32`, over 8 connections to every shard's client
  port (each shard keeps the sends it gets, as it does for the official clients, which send to the
  endpoint of the queue they picked);
- `sluice bench` consume of that backlog: receive 32 per call, one ack per batch, `--consumers`
  loops; each loop receives from one shard's queue over a connection to that shard (as the official
  clients do: a receive goes to the endpoints of its queue);
- `sluice bench` latency: `--batch 1 --rate 1000` (p50 and p99 of one send at 1,000 msg/s);
- the official Python client (`rocketmq-python-client`, tests/bench/clients/official_python.py):
  send from 32 threads, then receive(32) + ack per message from 4 threads;
- the official Node.js client (`rocketmq-client-nodejs`, tests/bench/clients/official_node.js, npm
  installed into tests/e2e/node as the e2e tests do; skipped with a note without node/npm): 64
  sends in flight, then 8 receive loops of receive(32) + ack per message.

The official clients bootstrap from `--port` (shard 0) and then follow the routes, as applications
do. Their groups consume from the earliest offset, so the backlog of the produce phase feeds them.

Per row: messages/s, the ratio to N=1, server CPU µs per message (the `sluice up` process and all
its shards, user + system, during the measured window), the server's cores, the load generator's
µs per message and cores (`sluice bench` rows: it shares the cores with the server on a small
machine; the official clients' drivers run in their own processes, not counted), and the calls the
shards forwarded during the row (`sluice_proxy_forwarded_calls_total` on the parent's metrics
endpoint) beside the data-plane calls they answered (SendMessage, ReceiveMessage, AckMessage; also
per shard, to show how the load spread; and the consume row's empty receives). The
`misrouted` share leaves out the balancing a receive does by design (`pop_elsewhere`, and as many
forwarded acks as messages were served that way: docs/shards.md); the target is under 1%.

Every process is stopped by PID and the temp dir removed. Bounded: about 25 s of start-up and
setup plus 3 x (seconds + 3) for `sluice bench` and 4 x (seconds + 5) for the official clients, per N
(about 3 minutes for N = 1, 2 at the default 6 s).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from processes.workerpool import available_cores  # noqa: E402
from tests.bench.client_bench import (  # noqa: E402
    BODY_BYTES,
    WARMUP_S,
    Row,
    Server,
    drive,
    node_driver,
    node_modules,
    py_driver,
)
from tests.bench.workers_bench import (  # noqa: E402
    GROUP,
    LATENCY_RATE,
    QUEUES,
    START_TIMEOUT_S,
    TOPIC,
    admin,
    latency,
    sluice_bench,
    summary,
    wait_line,
)
from tests.helpers.broker_fixtures import SLUICE_ARGV  # noqa: E402
from tests.helpers.procs import LOOPBACK, free_port, start_process  # noqa: E402

PY_GROUP = "shards-bench-py"
NODE_GROUP = "shards-bench-node"
DATA_PLANE_RPCS = frozenset({"SendMessage", "ReceiveMessage", "AckMessage"})
MISROUTED_SHARE_MAX = 0.01


class Calls:
    """The shards' data-plane and forwarded call counters, from the parent's metrics endpoint."""

    def __init__(self, metrics_port: int) -> None:
        self._url = f"http://{LOOPBACK}:{metrics_port}/metrics"

    def sample(self) -> dict[str, float]:
        with urllib.request.urlopen(self._url, timeout=10) as response:
            text = response.read().decode()
        out = {"data_plane": 0.0, "balanced": 0.0}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == "sluice_proxy_rpc_requests_total" and s.labels.get("rpc") in DATA_PLANE_RPCS:
                    out["data_plane"] += s.value
                    key = f"shard_{s.labels.get('shard', '0')}"
                    out[key] = out.get(key, 0.0) + s.value
                elif s.name == "sluice_proxy_forwarded_calls_total":
                    key = f"forwarded_{s.labels.get('call', '')}"
                    out[key] = out.get(key, 0.0) + s.value
                elif s.name == "sluice_proxy_balanced_messages_total":
                    out["balanced"] += s.value
        return out

    def during(self, phase: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """`phase`'s figures with the calls the shards counted while it ran."""
        before = self.sample()
        out = phase()
        after = self.sample()
        delta = {k: v - before.get(k, 0.0) for k, v in after.items()}
        forwarded = {k.removeprefix("forwarded_"): v for k, v in delta.items() if k.startswith("forwarded_") and v}
        misrouted = {**forwarded}
        misrouted.pop("pop_elsewhere", None)
        misrouted["ack"] = max(misrouted.get("ack", 0.0) - delta["balanced"], 0.0)
        per_shard = {k.removeprefix("shard_"): v for k, v in sorted(delta.items()) if k.startswith("shard_")}
        out.update(data_plane_calls=delta["data_plane"], calls_per_shard=per_shard, forwarded=forwarded,
                   forwarded_total=sum(forwarded.values()), misrouted=sum(misrouted.values()),
                   balanced_messages=delta["balanced"])  # fmt: skip
        return out


def client_ports(output: str, port: int) -> list[int]:
    """The shards' client ports, from `sluice up`'s "... client ports P0, P1" line (one shard: `port`)."""
    match = re.search(r"client ports ([0-9, ]+)\)", output)
    return [int(p) for p in match.group(1).split(", ")] if match else [port]


def generated(result: dict[str, Any], meter: str) -> dict[str, Any]:
    """`summary` plus the load generator's own CPU (it shares the machine's cores with the server)."""
    cpu = result.get("cpu") or {}
    receive = result["meters"].get("receive") or {}
    return {**summary(result, meter), "generator_us_per_msg": cpu.get("generator_us_per_message"),
            "generator_cores": cpu.get("generator_cores"), "receive_calls": receive.get("calls"),
            "generator": result.get("generator", "grpc.aio"),
            "empty_receives": receive.get("empty_calls")}  # fmt: skip


def official(row: Row, argv: list[str], server: Server) -> dict[str, Any]:
    r = drive(row, argv, server)
    seconds = max(r.seconds, 1e-9)
    return {"messages_per_s": r.rate if r.messages else 0.0, "errors": r.errors,
            "server_us_per_msg": r.us_per_msg if r.messages else None,
            "server_cores": round(r.server_cpu_s / seconds, 2), "other_cores": r.other_cores,
            "generator_us_per_msg": None, "generator_cores": None, "note": r.note}  # fmt: skip


def run(root: Path, shards: int, seconds: float, consumers: int, modules: Path | None,
        with_official: bool, generator: str) -> dict[str, dict[str, Any]]:  # fmt: skip
    port, ns_port, broker_port, metrics_port = free_port(), free_port(), free_port(), free_port()
    argv = [*SLUICE_ARGV, "up", "--shards", str(shards), "--data-dir", str(root / f"s{shards}"), "--port", str(port),
            "--namesrv-port", str(ns_port), "--broker-port", str(broker_port), "--flush", "async",
            "--console-port", "-1", "--metrics-port", str(metrics_port), "--log-level", "warning"]  # fmt: skip
    child = start_process(argv, port=port, log_path=root / f"up-s{shards}.log", name=f"up-s{shards}",
                          timeout_s=START_TIMEOUT_S)  # fmt: skip
    try:
        wait_line(child, "proxy listening on")
        namesrv = f"{LOOPBACK}:{ns_port}"
        endpoint = ";".join(f"{LOOPBACK}:{p}" for p in client_ports(child.output(), port))
        admin(namesrv, "topic", "create", TOPIC, "--queues", str(QUEUES))
        admin(namesrv, "group", "create", GROUP)
        for group in (PY_GROUP, NODE_GROUP):  # before the backlog, and from its start: it feeds them too
            admin(namesrv, "group", "create", group, "--consume-from", "earliest")
        calls, pids = Calls(metrics_port), [child.pid]
        print(f"  {shards} shard(s): sluice bench produce, consume, latency", file=sys.stderr, flush=True)
        produce = ("--batch", "32", "--concurrency", "32", "--generator", generator)
        consume = ("--group", GROUP, "--concurrency", str(consumers), "--receive-batch", "32", "--generator", generator)
        out = {"produce": calls.during(lambda: generated(sluice_bench("produce", endpoint, pids, seconds, *produce),
                                                         "send"))}  # fmt: skip
        out["consume"] = calls.during(lambda: generated(sluice_bench("consume", endpoint, pids, seconds, *consume),
                                                        "ack"))  # fmt: skip
        out["latency"] = latency(endpoint, pids, seconds)
        if with_official:
            out.update(official_rows(f"{LOOPBACK}:{port}", Server(f"shards={shards}", pids), seconds, calls, modules))
        return out
    finally:
        child.stop()


def official_rows(bootstrap: str, server: Server, seconds: float, calls: Calls,
                  modules: Path | None) -> dict[str, dict[str, Any]]:  # fmt: skip
    base = {"endpoint": bootstrap, "topic": TOPIC, "warmup_s": WARMUP_S, "seconds": seconds}
    node = {**base, "modulesDir": str(modules), "warmupS": WARMUP_S, "bodyBytes": BODY_BYTES}
    py_send = py_driver({**base, "mode": "produce", "threads": 32, "body_bytes": BODY_BYTES})
    py_recv = py_driver({**base, "mode": "consume", "group": PY_GROUP, "threads": 4, "batch": 32})
    out = {"python send": calls.during(lambda: official(Row(server.name, "official python", "send"), py_send, server))}
    if modules is not None:
        node_send = node_driver({**node, "mode": "produce", "concurrency": 64})
        out["node send"] = calls.during(lambda: official(Row(server.name, "official node", "send"), node_send, server))
    out["python recv+ack"] = calls.during(
        lambda: official(Row(server.name, "official python", "recv+ack"), py_recv, server)
    )
    if modules is not None:
        node_recv = node_driver({**node, "mode": "consume", "group": NODE_GROUP, "concurrency": 8, "batch": 32})
        out["node recv+ack"] = calls.during(
            lambda: official(Row(server.name, "official node", "recv+ack"), node_recv, server)
        )
    return out


def _num(value: float | None, fmt: str, width: int) -> str:
    return f"{value:{width}{fmt}}" if value is not None else f"{'-':>{width}}"


def report(curve: dict[int, dict[str, dict[str, Any]]]) -> list[str]:
    lines = ["shards  row              msg/s  (xN=1)  server µs/msg  (xN=1)  server cores  gen µs/msg  gen cores"
             "  data-plane calls  forwarded  misrouted"]  # fmt: skip
    base = curve[min(curve)]
    rows = [k for k in base if k != "latency"]
    for row in rows:
        for n, r in curve.items():
            if row not in r:
                continue
            p, b = r[row], base[row]
            cpu, cpu_b = p["server_us_per_msg"], b["server_us_per_msg"]
            ratio = p["messages_per_s"] / b["messages_per_s"] if b["messages_per_s"] else None
            cpu_ratio = cpu / cpu_b if cpu and cpu_b else None
            calls = p["data_plane_calls"]
            share = f"{100 * p['misrouted'] / calls:.2f}%" if calls else "-"
            lines.append(f"{n:>6}  {row:<15} {p['messages_per_s']:>7,.0f}  {_num(ratio, '.2f', 6)}"
                         f"  {_num(cpu, '.0f', 13)}  {_num(cpu_ratio, '.2f', 6)}  {_num(p['server_cores'], '.2f', 12)}"
                         f"  {_num(p['generator_us_per_msg'], '.0f', 10)}  {_num(p['generator_cores'], '.2f', 9)}"
                         f"  {calls:>16,.0f}  {p['forwarded_total']:>9,.0f}  {share:>9}"
                         f"{'  ' + p['note'] if p.get('note') else ''}")  # fmt: skip
    for n, r in curve.items():
        c = r["consume"]
        lines.append(f"{n} shard(s) consume: {c['receive_calls'] or 0:,} receives, {c['empty_receives'] or 0:,} of "
                     "them empty (the backlog ran out, or a loop waited on a drained shard)")  # fmt: skip
    lines.append("\ndata-plane calls per shard (how the load spread over the shards):")
    for n, r in curve.items():
        if n > 1:
            for row in rows:
                if row in r:
                    spread = ", ".join(f"shard-{k} {v:,.0f}" for k, v in r[row]["calls_per_shard"].items())
                    lines.append(f"  {n} shards {row}: {spread}")
    lines.append("\nforwarded calls by call (pop_elsewhere: a receive balanced from another shard, by design):")
    for n, r in curve.items():
        for row in rows:
            if row in r and r[row]["forwarded"]:
                by_call = ", ".join(f"{k} {v:,.0f}" for k, v in sorted(r[row]["forwarded"].items()))
                lines.append(f"  {n} shard(s) {row}: {by_call} (balanced messages {r[row]['balanced_messages']:,.0f})")
    lines.append(f"\nsend latency at {LATENCY_RATE} msg/s (sluice bench, B=1, spread over the shards' ports):")
    for n, r in curve.items():
        lat = r["latency"]
        lines.append(f"  {n} shard(s): p50 {lat['p50_ms']:.2f} ms  p99 {lat['p99_ms']:.2f} ms  "
                     f"({lat['messages_per_s']:,.0f} msg/s, {lat['errors']} errors)")  # fmt: skip
    lines += targets(curve)
    return lines


def targets(curve: dict[int, dict[str, dict[str, Any]]]) -> list[str]:
    """The issue's targets for 2 shards against 1, and the misrouted share of every official row."""
    if 1 not in curve or 2 not in curve:
        return []
    one, two = curve[1], curve[2]
    lines = ["\ntargets (2 shards vs 1):"]
    for row in ("produce", "consume"):
        ratio = two[row]["messages_per_s"] / one[row]["messages_per_s"]
        lines.append(f"  sluice bench {row}: x{ratio:.2f} (target >= 1.4) {'MET' if ratio >= 1.4 else 'NOT MET'}")
    for row in one:
        if row == "latency" or row not in two or not one[row]["server_us_per_msg"] or not two[row]["server_us_per_msg"]:
            continue
        grow = two[row]["server_us_per_msg"] / one[row]["server_us_per_msg"]
        lines.append(f"  server µs/msg {row}: x{grow:.2f} (target <= 1.15) {'MET' if grow <= 1.15 else 'NOT MET'}")
    for n, r in curve.items():
        for row, p in r.items():
            if row in ("produce", "consume", "latency") or not p["data_plane_calls"]:
                continue
            share = p["misrouted"] / p["data_plane_calls"]
            lines.append(f"  {n} shard(s) {row}: misrouted {100 * share:.2f}% of data-plane calls (target < 1%) "
                         f"{'MET' if share < MISROUTED_SHARE_MAX else 'NOT MET'}")  # fmt: skip
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=6.0, help="measured seconds per phase (default 6)")
    ap.add_argument("--max-shards", type=int, default=available_cores(), help="largest N (default: the cores)")
    ap.add_argument("--consumers", type=int, default=32, help="sluice bench consume loops in all (default 32)")
    ap.add_argument("--generator", choices=("http2", "grpc"), default="http2",
                    help="sluice bench's client for the produce and consume rows: its own HTTP/2 client (default, "
                         "the least CPU per message) or grpc.aio")  # fmt: skip
    ap.add_argument("--no-official", action="store_true", help="skip the official clients' rows")
    ap.add_argument("--no-node", action="store_true", help="skip the official Node.js client's rows")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args()
    modules = None if args.no_node or args.no_official else node_modules()
    if modules is None and not (args.no_node or args.no_official):
        print("  (official Node.js client skipped: node/npm missing or npm install failed)", file=sys.stderr)
    root = Path(tempfile.mkdtemp(prefix="sluice-shards-bench-"))
    try:
        curve = {n: run(root, n, args.seconds, args.consumers, modules, not args.no_official, args.generator)
                 for n in range(1, max(1, args.max_shards) + 1)}  # fmt: skip
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        print(json.dumps(curve, indent=2))
        return 0
    gens = sorted({r[row]["generator"] for r in curve.values() for row in ("produce", "consume")})
    print(f"\nshards bench: {os.cpu_count()} cores, {args.seconds:g} s per phase, 1 KiB messages, flush async; "
          f"server = sluice up and its shards; gen = the sluice bench load generator ({', '.join(gens)}; "
          "same machine)\n")  # fmt: skip
    print("\n".join(report(curve)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
