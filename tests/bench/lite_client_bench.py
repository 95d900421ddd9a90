#!/usr/bin/env python3
"""Lite against normal sends as users make them: the official Python client through `sluice up`.

    .venv/bin/python tests/bench/lite_client_bench.py [--seconds 5] [--rounds 2] [--active 1000]
                                                      [--threads 32] [--json]

One merged `sluice up` (async flush). `Producer.send` from `--threads` threads (one message per
SendMessage, 1 KiB; tests/bench/clients/official_python.py) to a NORMAL topic and to a LITE bind
topic whose messages name `--active` lite topics round robin, alternating in `--rounds` turns so
that a neighbour's load falls on both. Prints per phase the rate and the server's CPU (all
threads, from /proc) per message, and per `--active` the lite/normal ratios of the summed turns.
Each turn starts with an unmeasured warm-up; at one message per send, lite topics beyond what
the first turns reach are created while measured (keep `--active` to what a turn sends). Stops by
itself; the server is stopped by PID and its temp dir removed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from client_bench import BODY_BYTES, Row, admin, drive, py_driver, start_merged


def run(args: argparse.Namespace) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="lite-client-bench-"))
    server, endpoint, namesrv = start_merged(root, [])
    out: dict[str, Any] = {"threads": args.threads, "seconds": args.seconds, "rounds": args.rounds, "active": []}
    try:
        admin(namesrv, "topic", "create", "lcb-normal", "--queues", "8")
        for active in args.active:
            topic = f"lcb-lite-{active}"
            admin(namesrv, "topic", "create", topic, "--type", "lite", "--queues", "1",
                  "--max-lite-topics", str(active + 1))  # fmt: skip
            sums = {
                "normal": Row("merged", "official python", "normal"),
                "lite": Row("merged", "official python", "lite"),
            }
            for r in range(args.rounds):
                for kind in ("normal", "lite") if r % 2 == 0 else ("lite", "normal"):
                    opts = {"endpoint": endpoint, "mode": "produce", "threads": args.threads, "body_bytes": BODY_BYTES,
                            "warmup_s": args.warmup, "seconds": args.seconds,
                            "topic": "lcb-normal" if kind == "normal" else topic,
                            "lite_topics": active if kind == "lite" else 0}  # fmt: skip
                    row = drive(Row("merged", "official python", f"{kind}@{active}"), py_driver(opts), server)
                    total = sums[kind]
                    total.messages += row.messages
                    total.errors += row.errors
                    total.seconds += row.seconds
                    total.server_cpu_s += row.server_cpu_s
            lite, normal = sums["lite"], sums["normal"]
            out["active"].append({
                "active_lite_topics": active,
                "send_msg_s": {"lite": round(lite.rate), "normal": round(normal.rate),
                               "ratio": round(lite.rate / normal.rate, 2)},
                "server_us_per_msg": {"lite": round(lite.us_per_msg, 1), "normal": round(normal.us_per_msg, 1)},
                "errors": lite.errors + normal.errors,
            })  # fmt: skip
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=5.0, help="measured seconds per turn")
    ap.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds before each turn")
    ap.add_argument("--rounds", type=int, default=2, help="turns of each kind, alternating")
    ap.add_argument("--active", type=lambda s: [int(x) for x in s.split(",") if x], default=[1000])
    ap.add_argument("--threads", type=int, default=32)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    print(json.dumps(run(args), indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
