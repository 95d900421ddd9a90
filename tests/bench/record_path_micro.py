#!/usr/bin/env python3
"""CPU per message of the record path a send takes (issue 31: encode once, at the edge), per step,
without gRPC or the writer:

    .venv/bin/python tests/bench/record_path_micro.py [--batch 1,32] [--repeat 40]

The messages are the load generator's shape (1 KiB body, two user properties, NORMAL). Steps:
`edge` (proxy/grpc/convert.py::outgoing: a pb.Message to its record), `stream out` / `stream in`
(the separated topology's SendRequest serialised and parsed: the records ride as bytes),
`broker` (common/record.py::received, broker/messages.py::validate_all, record.placed: verify,
decode once, check, splice topic/queue/store host in). Each figure is the best of `--repeat`
timings of 100 sends (timeit), in µs per message; a few seconds in all. Compare `edge + broker`
(merged) and `edge + stream out + stream in + broker` (separated) with the same steps on another
tree to see what a change costs.
"""

from __future__ import annotations

import argparse
import sys
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from broker.config import LimitsConfig
from broker.messages import validate_all
from common import record
from common.model import MessageType, TopicInfo
from proto.apache.rocketmq.v2 import definition_pb2 as pb
from proto.sluice.internal.v1 import broker_pb2 as ipb
from proxy.grpc import convert


def messages(n: int) -> list[pb.Message]:
    out = []
    for i in range(n):
        m = pb.Message()
        m.topic.name = "t"
        m.body = b"x" * 1024
        m.user_properties["run"] = "r1"
        m.user_properties["born"] = str(1_700_000_000_000_000_000 + i)
        sp = m.system_properties
        sp.message_id = f"01{i:030X}"
        sp.message_type = pb.NORMAL
        sp.body_encoding = pb.IDENTITY
        sp.born_timestamp.seconds = 1_700_000_000
        sp.born_host = "10.0.0.1"
        out.append(m)
    return out


def measure(n: int, repeat: int) -> dict[str, float]:
    """µs per message of each step for sends of `n` messages."""
    topic, limits = TopicInfo("t", 8, message_types=frozenset(MessageType)), LimitsConfig()
    msgs = messages(n)
    recs = [convert.outgoing(m, "peer") for m in msgs]
    ser = ipb.SendRequest(topic="t", queue_id=0, records=recs).SerializeToString()

    def broker() -> None:
        placed = record.received(recs, "t", 0, "10.0.0.2:10911")
        validate_all(placed, topic, limits)
        record.placed(placed, 1 << 22)

    steps = {
        "edge": lambda: [convert.outgoing(m, "peer") for m in msgs],
        "stream out": lambda: ipb.SendRequest(topic="t", queue_id=0, records=recs).SerializeToString(),
        "stream in": lambda: ipb.SendRequest.FromString(ser).records,
        "broker": broker,
    }
    return {k: min(timeit.repeat(fn, number=100, repeat=repeat)) / 100 / n * 1e6 for k, fn in steps.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=lambda s: [int(x) for x in s.split(",")], default=[1, 32])
    ap.add_argument("--repeat", type=int, default=40)
    args = ap.parse_args()
    print("µs per message, best of", args.repeat, "x 100 sends")
    print("batch    edge  stream out  stream in  broker  merged  separated")
    for n in args.batch:
        us = measure(n, args.repeat)
        merged, separated = us["edge"] + us["broker"], sum(us.values())
        print(f"{n:>5}  {us['edge']:6.2f}  {us['stream out']:10.2f}  {us['stream in']:9.2f}  {us['broker']:6.2f}  "
              f"{merged:6.2f}  {separated:9.2f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
