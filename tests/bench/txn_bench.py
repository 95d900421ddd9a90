#!/usr/bin/env python3
"""Transaction benchmark (issue 6): transaction commit throughput beside plain sends, in one run.

    .venv/bin/python tests/bench/txn_bench.py [--seconds 10] [--concurrency 32] [--size 1024]
                                              [--topology merged|separated|both] [--json]

Starts the topology as child processes on 127.0.0.1 (data in a temp dir, async flush; helpers of
proxy_bench.py), creates a NORMAL and a TRANSACTION topic with `sluice admin`, then runs, one
after the other, each for `--seconds` after a 1 s warm-up, with `--concurrency` loops on one
gRPC channel:

- `plain`: SendMessage of one NORMAL message per call;
- `txn`: SendMessage of one TRANSACTION message (the half message), then EndTransaction COMMIT
  with the returned transaction id: one committed transaction per iteration.

It reports per phase: operations/s (messages, or committed transactions), latency p50/p99 of one
iteration (send; send + commit), and errors; and the ratio txn/plain. The half messages are
committed, so the half-message backlog ends at 0 (checked through `sluice admin topic describe`).
Every process is stopped by PID and the temp dir removed. Not collected by pytest.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from proto.apache.rocketmq.v2 import definition_pb2 as pb  # noqa: E402
from proto.apache.rocketmq.v2 import service_pb2 as spb  # noqa: E402
from tests.bench.proxy_bench import Topology, admin, start_merged, start_separated  # noqa: E402
from tests.helpers.broker_fixtures import SLUICE_ARGV  # noqa: E402

SERVICE = "/apache.rocketmq.v2.MessagingService"
PLAIN_TOPIC, TXN_TOPIC = "bench-plain", "bench-txn"
QUEUES = 8
WARMUP_S = 1.0
RPC_TIMEOUT_S = 10.0


@dataclass
class PhaseResult:
    topology: str
    phase: str
    ops: int = 0
    errors: int = 0
    seconds: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    first_error: str = ""

    def as_json(self) -> dict[str, Any]:
        lat = sorted(self.latencies_ms)

        def pct(q: float) -> float:
            return round(lat[min(len(lat) - 1, int(q * len(lat)))], 2) if lat else 0.0

        return {
            "topology": self.topology, "phase": self.phase, "ops": self.ops, "errors": self.errors,
            "seconds": round(self.seconds, 2), "ops_per_s": round(self.ops / self.seconds, 1) if self.seconds else 0.0,
            "p50_ms": pct(0.50), "p99_ms": pct(0.99),
            "mean_ms": round(statistics.fmean(lat), 2) if lat else 0.0, "first_error": self.first_error,
        }  # fmt: skip


class Client:
    def __init__(self, endpoint: str) -> None:
        self._channel = grpc.aio.insecure_channel(endpoint)
        self._client_id = f"txn-bench-{uuid.uuid4().hex[:12]}"
        self._send = self._channel.unary_unary(f"{SERVICE}/SendMessage",
                                               request_serializer=spb.SendMessageRequest.SerializeToString,
                                               response_deserializer=spb.SendMessageResponse.FromString)  # fmt: skip
        self._end = self._channel.unary_unary(f"{SERVICE}/EndTransaction",
                                              request_serializer=spb.EndTransactionRequest.SerializeToString,
                                              response_deserializer=spb.EndTransactionResponse.FromString)  # fmt: skip
        self._headers = (("x-mq-client-id", self._client_id), ("x-mq-language", "PYTHON"),
                         ("x-mq-protocol", "v2"))  # fmt: skip

    async def close(self) -> None:
        await self._channel.close()

    async def ready(self, timeout_s: float) -> None:
        await asyncio.wait_for(self._channel.channel_ready(), timeout_s)

    async def send(self, topic: str, body: bytes, mtype: int) -> spb.SendResultEntry:
        msg = pb.Message(topic=pb.Resource(name=topic), body=body)
        sp = msg.system_properties
        sp.message_id = uuid.uuid4().hex.upper()
        sp.message_type = mtype  # type: ignore[assignment]
        sp.body_encoding = pb.IDENTITY
        sp.born_timestamp.GetCurrentTime()
        sp.born_host = "127.0.0.1"
        resp = await self._send(spb.SendMessageRequest(messages=[msg]), metadata=self._headers, timeout=RPC_TIMEOUT_S)
        if resp.status.code != pb.OK:
            raise RuntimeError(f"send: {pb.Code.Name(resp.status.code)} {resp.status.message}")
        return resp.entries[0]

    async def commit(self, topic: str, entry: spb.SendResultEntry) -> None:
        req = spb.EndTransactionRequest(topic=pb.Resource(name=topic), message_id=entry.message_id,
                                        transaction_id=entry.transaction_id, resolution=pb.COMMIT,
                                        source=pb.SOURCE_CLIENT)  # fmt: skip
        resp = await self._end(req, metadata=self._headers, timeout=RPC_TIMEOUT_S)
        if resp.status.code != pb.OK:
            raise RuntimeError(f"end transaction: {pb.Code.Name(resp.status.code)} {resp.status.message}")


async def run_phase(
    client: Client, topology: str, phase: str, seconds: float, concurrency: int, size: int
) -> PhaseResult:
    body = b"x" * size
    result = PhaseResult(topology, phase)
    measuring = False
    end_at = time.monotonic() + WARMUP_S + seconds

    async def one() -> None:
        if phase == "plain":
            await client.send(PLAIN_TOPIC, body, pb.NORMAL)
        else:
            await client.commit(TXN_TOPIC, await client.send(TXN_TOPIC, body, pb.TRANSACTION))

    async def loop() -> None:
        while time.monotonic() < end_at:
            started = time.monotonic()
            try:
                await one()
            except Exception as exc:
                if measuring:
                    result.errors += 1
                    result.first_error = result.first_error or str(exc)[:200]
                continue
            if measuring:
                result.ops += 1
                result.latencies_ms.append((time.monotonic() - started) * 1000.0)

    tasks = [asyncio.create_task(loop()) for _ in range(concurrency)]
    await asyncio.sleep(WARMUP_S)
    measuring, began = True, time.monotonic()
    await asyncio.gather(*tasks)
    result.seconds = time.monotonic() - began
    return result


def half_backlog(topo: Topology) -> int:
    argv = [*SLUICE_ARGV, "admin", "--namesrv", topo.namesrv, "topic", "describe", TXN_TOPIC, "--json"]
    done = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=True)
    rows = json.loads(done.stdout)
    return sum({r["broker"]: r["half_messages"] for r in rows}.values())


async def measure(topo: Topology, args: argparse.Namespace) -> list[PhaseResult]:
    client = Client(topo.endpoint)
    try:
        await client.ready(30.0)
        return [await run_phase(client, topo.name, phase, args.seconds, args.concurrency, args.size)
                for phase in ("plain", "txn")]  # fmt: skip
    finally:
        await client.close()


def run_topology(name: str, root: Path, args: argparse.Namespace) -> tuple[list[PhaseResult], int]:
    topo = start_merged(root) if name == "merged" else start_separated(root, 1)
    try:
        admin(topo.namesrv, "topic", "create", PLAIN_TOPIC, "--queues", str(QUEUES))
        admin(topo.namesrv, "topic", "create", TXN_TOPIC, "--type", "transaction", "--queues", str(QUEUES))
        time.sleep(1.0)  # let the proxy learn the new routes
        results = asyncio.run(measure(topo, args))
        return results, half_backlog(topo)
    finally:
        topo.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=10.0, help="measured duration of each phase (default 10)")
    ap.add_argument("--concurrency", type=int, default=32, help="iterations in flight (default 32)")
    ap.add_argument("--size", type=int, default=1024, help="message body bytes (default 1024)")
    ap.add_argument("--topology", choices=("merged", "separated", "both"), default="merged")
    ap.add_argument("--json", action="store_true", help="print JSON instead of the table")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="txn-bench-"))
    rows: list[dict[str, Any]] = []
    try:
        for name in ("merged", "separated") if args.topology == "both" else (args.topology,):
            results, backlog = run_topology(name, root / name, args)
            plain, txn = (r.as_json() for r in results)
            ratio = round(txn["ops_per_s"] / plain["ops_per_s"], 3) if plain["ops_per_s"] else 0.0
            rows += [plain, {**txn, "txn_vs_plain": ratio, "half_backlog_after": backlog}]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'topology':<10} {'phase':<6} {'ops/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'errors':>7}  notes")
    for r in rows:
        notes = (
            f"txn/plain {r['txn_vs_plain']}, half backlog after {r['half_backlog_after']}"
            if r["phase"] == "txn"
            else ""
        )
        if r["first_error"]:
            notes += f" first error: {r['first_error']}"
        print(f"{r['topology']:<10} {r['phase']:<6} {r['ops_per_s']:>9} {r['p50_ms']:>8} {r['p99_ms']:>8} "
              f"{r['errors']:>7}  {notes}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
