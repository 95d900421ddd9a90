#!/usr/bin/env python3
"""Is the one-message-at-a-time path still worth keeping beside the column path?

    .venv/bin/python tests/bench/switch_bench.py [--number 20000] [--sizes 1,2,4,8,32]

Two places convert a send either message by message or column by column, switching at
`COLUMNS_MIN` messages: the proxy's edge (proxy/grpc/produce.py: `_convert_one` per message against
`_convert_all`) and the broker's send path (broker/produce.py: `validate_message` + `to_record` per
message against `plainly_valid` + `records_of`). This times both paths on the same messages (1 KiB
body, a tag, a key, a property) for each batch size, in this process (best of 5 `timeit` repeats,
µs per call). A path is kept only where it is measurably faster than the other.
"""

from __future__ import annotations

import argparse
import functools
import sys
import timeit
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from common.record import outgoing

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from broker.client.api import bytes  # noqa: E402
from broker.config import LimitsConfig  # noqa: E402
from broker.messages import plainly_valid, records_of, to_record, validate_message  # noqa: E402
from common.model import MessageType, Permission, TopicInfo  # noqa: E402
from proto.apache.rocketmq.v2 import definition_pb2 as pb  # noqa: E402
from proxy.context import RequestContext  # noqa: E402
from proxy.grpc import produce  # noqa: E402


def _pb_message(i: int) -> pb.Message:
    m = pb.Message(body=b"x" * 1024)
    m.topic.name = "bench"
    sp = m.system_properties
    sp.message_id = f"01BENCH{i:025d}"
    sp.tag = "TagA"
    sp.keys.append("k1")
    sp.message_type = pb.NORMAL
    sp.born_timestamp.GetCurrentTime()
    sp.born_host = "127.0.0.1"
    sp.body_encoding = pb.IDENTITY
    m.user_properties["a"] = "1"
    return m


def _proxy_single(app: Any, ctx: RequestContext, msgs: list[pb.Message]) -> object:
    topics: dict[Any, Any] = {}
    return [produce._convert_one(app, ctx, m, topics) for m in msgs]


def _proxy_columns(app: Any, ctx: RequestContext, msgs: list[pb.Message]) -> object:
    saved, produce.COLUMNS_MIN = produce.COLUMNS_MIN, 1  # the column path for any size
    try:
        return produce._convert_all(app, ctx, msgs)
    finally:
        produce.COLUMNS_MIN = saved


def _broker_single(outs: list[bytes], topic: TopicInfo, limits: LimitsConfig) -> object:
    for m in outs:
        validate_message(m, topic, limits)
    return [to_record("bench", 0, m, "h") for m in outs]


def _broker_columns(outs: list[bytes], topic: TopicInfo, limits: LimitsConfig) -> object:
    plainly_valid(outs, topic, limits)
    return records_of("bench", 0, outs, "h")


def _best_us(fn: Any, number: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--number", type=int, default=20_000, help="calls per timing (default 20,000)")
    ap.add_argument("--sizes", default="1,2,4,8,32", help="messages per send (default 1,2,4,8,32)")
    args = ap.parse_args()
    sizes = [int(n) for n in args.sizes.split(",")]
    app: Any = SimpleNamespace(
        config=SimpleNamespace(settings=SimpleNamespace(max_body_bytes=4 << 20)),
        checkbacks=SimpleNamespace(note_sent=lambda *a: None),
    )
    ctx = RequestContext(request_id="r", client_id="c", language="PYTHON", client_version="5", peer="peer")
    limits = LimitsConfig()
    topic = TopicInfo("bench", 8, Permission.READ_WRITE, frozenset({MessageType.NORMAL}))
    print(f"µs per send (best of 5 x {args.number:,}); switch at {produce.COLUMNS_MIN} messages")
    heads = ("messages", "proxy one-by-one", "proxy columns", "broker one-by-one", "broker columns")
    print("  ".join(f"{h:>17}" for h in heads))
    for n in sizes:
        msgs = [_pb_message(i) for i in range(n)]
        outs = [
            outgoing(body=b"x" * 1024, message_id=f"01BENCH{i:025d}", tag="TagA", keys=("k1",),
                            properties={"a": "1"}, born_host="127.0.0.1", born_timestamp_ms=1)
            for i in range(n)
        ]  # fmt: skip

        timed = (
            functools.partial(_proxy_single, app, ctx, msgs),
            functools.partial(_proxy_columns, app, ctx, msgs),
            functools.partial(_broker_single, outs, topic, limits),
            functools.partial(_broker_columns, outs, topic, limits),
        )
        row = [_best_us(f, args.number) for f in timed]
        print("  ".join([f"{n:>17}", *(f"{us:>17.1f}" for us in row)]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
