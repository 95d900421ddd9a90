#!/usr/bin/env python3
"""CPU per message of the proxy-to-broker hop (issue 41): the same calls to a `LocalBroker` directly
and through the internal service (`RemoteBroker` -> our HTTP/2 gRPC client and server ->
`BrokerServicer` -> the same `LocalBroker`), both ends in this process on uvloop over loopback.

    .venv/bin/python tests/bench/hop_micro.py [--messages 5000] [--senders 1,32] [--path send,ack]
                                              [--only local|remote]

`send`: single-message sends (1 KiB), `senders` tasks at once (as many client requests in flight);
`ack`: messages popped 32 at a time beforehand, then acked one per call from `senders` tasks (the
official clients ack one message per AckMessage). CPU µs per message from `time.process_time()`
(every thread of this process: both ends of the hop and the broker's), after a warm-up of 1,000.
`remote` minus `local` is what the hop costs both processes of a separated topology together.

Instruction counts (load-independent): run it under callgrind twice with two message counts and
divide the difference, e.g. for one path, one layer, one sender:

    valgrind --tool=callgrind --callgrind-out-file=/tmp/a .venv/bin/python tests/bench/hop_micro.py \\
        --path send --only remote --senders 1 --messages 200
    (again with --messages 1200; then (Ir(1200) - Ir(200)) / 1000, Ir from `callgrind_annotate`)

Stops by itself; the temp dir is removed.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import uvloop

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from broker.client.api import BrokerApi, CallContext, GroupSpec, PopRequest, TopicSpec  # noqa: E402
from broker.client.remote import RemoteBroker  # noqa: E402
from broker.config import BrokerConfig  # noqa: E402
from broker.local import LocalBroker  # noqa: E402
from broker.service import BrokerServicer  # noqa: E402
from common.model import MessageType  # noqa: E402
from common.record import outgoing  # noqa: E402
from tests.helpers.broker_fixtures import serve_in_process  # noqa: E402

TOPIC = "hop"
GROUP = "hop-group"
QUEUES = 8
BODY = b"x" * 1024
WARMUP = 1_000
POP_BATCH = 32
CTX = CallContext(request_id="r", client_id="hop-client")


async def _measure(one: Callable[[int], Awaitable[None]], messages: int, senders: int) -> float:
    left = [messages]

    async def sender() -> None:
        while left[0] > 0:
            left[0] -= 1
            await one(left[0])

    started = time.process_time()
    await asyncio.gather(*(sender() for _ in range(senders)))
    return (time.process_time() - started) * 1e6 / messages


async def _sends(api: BrokerApi, n: int) -> None:
    for i in range(0, n, 64):
        records = [outgoing(body=BODY, message_id=uuid.uuid4().hex, message_type=MessageType.NORMAL)
                   for _ in range(min(64, n - i))]  # fmt: skip
        await api.send(TOPIC, i % QUEUES, records, ctx=CTX)


async def _handles(api: BrokerApi, n: int) -> list[str]:
    await _sends(api, n)
    handles: list[str] = []
    while len(handles) < n:
        popped = await api.pop(PopRequest(GROUP, TOPIC, max_messages=POP_BATCH, invisible_ms=60_000), ctx=CTX)
        if not popped:
            raise RuntimeError(f"popped {len(handles)} of {n}")
        handles += [m.receipt_handle for m in popped]
    return handles


def _sender(api: BrokerApi) -> Callable[[int], Awaitable[None]]:
    async def one(i: int) -> None:
        record = outgoing(body=BODY, message_id=uuid.uuid4().hex, message_type=MessageType.NORMAL)
        await api.send(TOPIC, i % QUEUES, [record], ctx=CTX)

    return one


def _acker(api: BrokerApi, handles: list[str]) -> Callable[[int], Awaitable[None]]:
    async def one(i: int) -> None:
        (result,) = await api.ack(GROUP, TOPIC, [handles[i]], ctx=CTX)
        if result.error is not None:
            raise result.error

    return one


async def run(path: str, layer: str, messages: int, senders: list[int]) -> dict[int, float]:
    root = Path(tempfile.mkdtemp(prefix="sluice-hop-micro-"))
    broker = LocalBroker(BrokerConfig(data_dir=root))
    await broker.start()
    server = None
    api: BrokerApi = broker
    try:
        await broker.create_topic(TopicSpec(TOPIC, QUEUES))
        await broker.create_group(GroupSpec(GROUP))
        if layer == "remote":
            server, port = await serve_in_process(BrokerServicer(broker))
            api = RemoteBroker("hop", f"127.0.0.1:{port}")
        figures = {}
        for n in senders:
            if path == "send":
                one = warm = _sender(api)
            else:  # the handles of the warm-up's acks follow those measured
                handles = await _handles(api, WARMUP + messages)
                one, warm = _acker(api, handles[:messages]), _acker(api, handles[messages:])
            await _measure(warm, WARMUP, n)
            figures[n] = await _measure(one, messages, n)
        return figures
    finally:
        if isinstance(api, RemoteBroker):
            await api.close()
        if server is not None:
            await server.shutdown(0)
        await broker.close()
        shutil.rmtree(root, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=5_000, help="measured messages per figure")
    ap.add_argument("--senders", type=lambda s: [int(x) for x in s.split(",")], default=[1, 32])
    ap.add_argument("--path", default="send,ack")
    ap.add_argument("--only", choices=("local", "remote"))
    args = ap.parse_args()
    layers = (args.only,) if args.only else ("local", "remote")
    print(f"CPU µs per message, {args.messages:,} messages per figure, 1 KiB bodies, both ends in this process")
    print(f"{'path':<6}{'layer':<8}" + "".join(f"{f'{n} senders':>12}" for n in args.senders))
    for path in args.path.split(","):
        for layer in layers:
            figures = uvloop.run(run(path, layer, args.messages, args.senders))
            print(f"{path:<6}{layer:<8}" + "".join(f"{figures[n]:>12.1f}" for n in args.senders), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
