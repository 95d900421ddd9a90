#!/usr/bin/env python3
"""CPU per message of the record path a receive takes (issue 31: decode once, at the edge), per
step, without gRPC, the store's disk reads or the pop state:

    .venv/bin/python tests/bench/receive_path_micro.py [--batch 1,32] [--repeat 40]

The messages are the load generator's shape (1 KiB body, a tag, two user properties, NORMAL),
stored and sealed as the CommitLog holds them. Steps:
`broker` (common/record.py::decode of the stored bytes, as the store read does, and
broker/consumer.py::PopEngine._deliver: the contract's delivered message with its receipt handle),
`stream out` / `stream in` (the separated topology's PopResponse built by
broker/client/grpc_convert.py and serialised, then parsed and converted back),
`edge` (proxy/grpc/convert.py::fill_delivered into ReceiveMessageResponse frames, serialised as
gRPC sends them). Each figure is the best of `--repeat` timings of 100 pops (timeit), in µs per
message; a few seconds in all. Compare `broker + edge` (merged) and the sum of the four
(separated) with the same script on another tree (copy it there: it uses only what both have).
"""

from __future__ import annotations

import argparse
import sys
import timeit
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from broker.client import grpc_convert
from broker.consumer import PopEngine
from common import record
from proto.apache.rocketmq.v2 import service_pb2 as spb
from proto.sluice.internal.v1 import broker_pb2 as ipb
from proxy.grpc import convert


def stored(n: int) -> list[bytes]:
    """`n` records as the CommitLog holds them (offsets, store time and CRC sealed)."""
    out = []
    for i in range(n):
        sent = record.outgoing(b"x" * 1024, f"01{i:030X}", tag="TagA",
                               properties={"run": "r1", "born": str(1_700_000_000_000_000_000 + i)},
                               born_timestamp_ms=1_700_000_000_000, born_host="10.0.0.1")  # fmt: skip
        rec = record.received([sent], "t", 0, "10.0.0.2:10911")[0]
        buf = record.encode_one(rec, 1 << 22)
        record.seal(buf, i, 4096 * i, 1_700_000_000_001)
        out.append(bytes(buf))
    return out


def measure(n: int, repeat: int) -> dict[str, float]:
    """µs per message of each step for pops of `n` messages."""
    bufs = stored(n)
    engine: Any = SimpleNamespace(_name="broker-a", _host="10.0.0.2:10911")  # what _deliver reads of its engine
    deliver = PopEngine._deliver

    def broker() -> list[Any]:
        return [deliver(engine, record.decode(b), 1, 1, 1_700_000_030_000, "g") for b in bufs]

    delivered = broker()
    ser = ipb.PopResponse(messages=grpc_convert.stored_list_to_pb(delivered)).SerializeToString()

    def edge() -> list[bytes]:
        frames = []
        for m in delivered:
            frame = spb.ReceiveMessageResponse()
            convert.fill_delivered(frame.message, m, "")
            frames.append(frame.SerializeToString())
        return frames

    steps = {
        "broker": broker,
        "stream out": lambda: ipb.PopResponse(messages=grpc_convert.stored_list_to_pb(delivered)).SerializeToString(),
        "stream in": lambda: grpc_convert.stored_list_from_pb(ipb.PopResponse.FromString(ser).messages),
        "edge": edge,
    }
    return {k: min(timeit.repeat(fn, number=100, repeat=repeat)) / 100 / n * 1e6 for k, fn in steps.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=lambda s: [int(x) for x in s.split(",")], default=[1, 32])
    ap.add_argument("--repeat", type=int, default=40)
    args = ap.parse_args()
    print("µs per message, best of", args.repeat, "x 100 pops")
    print("batch  broker  stream out  stream in    edge  merged  separated")
    for n in args.batch:
        us = measure(n, args.repeat)
        merged, separated = us["broker"] + us["edge"], sum(us.values())
        print(f"{n:>5}  {us['broker']:6.2f}  {us['stream out']:10.2f}  {us['stream in']:9.2f}  {us['edge']:6.2f}  "
              f"{merged:6.2f}  {separated:9.2f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
