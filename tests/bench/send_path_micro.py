#!/usr/bin/env python3
"""CPU per single-message send through our own code, without gRPC (issue 17's unary path).

    .venv/bin/python tests/bench/send_path_micro.py [--messages 20000] [--senders 1,4,32] [--layer broker|proxy|both]
                                                    [--lite-topics N]

In this process, on uvloop: a `LocalBroker` (async flush) in a temp dir, and `--senders` concurrent
tasks each sending one 1 KiB message per call, either to `LocalBroker.send` (`broker`: the record
encoded per send with a fresh message id, as an edge hands it over, then verified, placed and stored) or through
the proxy's SendMessage handler as the gRPC edge calls it, with the raw request bytes and a stand-in
for the gRPC context that answers its metadata, peer and deadline (`proxy`: edge, servicer,
conversion, validation, producer service, broker). Each layer is measured with the CommitLog's
small appends written by the event loop (the default) and handed to the writer thread
(`inline_append_max_bytes = 0`): CPU per message from `time.process_time()` (every thread of this
process), after a warm-up of 2,000 sends. The difference to a gRPC server's CPU per call is what
gRPC costs (compare `sluice bench echo`). `--lite-topics N` (broker layer only): the messages go to
a LITE bind topic instead, each to one of N lite topics drawn at random (all created before the
warm-up), as a proxy forwards a LiteProducer's sends (issue 19). Stops by itself; the temp dir is removed.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import random
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

from broker.client.api import CallContext, TopicSpec  # noqa: E402
from broker.config import BrokerConfig  # noqa: E402
from broker.local import LocalBroker  # noqa: E402
from broker.store.config import CommitLogConfig, StoreConfig  # noqa: E402
from common.model import MessageType  # noqa: E402
from common.record import SYSPROP_LITE_TOPIC, outgoing  # noqa: E402
from proto.apache.rocketmq.v2 import definition_pb2 as pb  # noqa: E402
from proto.apache.rocketmq.v2 import service_pb2 as spb  # noqa: E402
from proxy.app import ProxyApp  # noqa: E402
from proxy.config import ProxyConfig  # noqa: E402
from proxy.directory import LocalDirectory  # noqa: E402
from proxy.grpc.edge import Edge  # noqa: E402
from proxy.grpc.servicer import MessagingServicer  # noqa: E402

TOPIC = "micro"
LITE_TOPIC = "micro-lite"
QUEUES = 8
BODY = b"x" * 1024
WARMUP = 2_000
PRODUCER = CallContext(client_id="micro-client")  # as the proxy sends for a producer


class _Context:
    """What the edge reads of a call (common/http2/grpcserver.py `Call`), as an official client's
    call carries it."""

    def __init__(self) -> None:
        self.headers = {"x-mq-client-id": "micro-client", "x-mq-request-id": uuid.uuid4().hex,
                        "x-mq-language": "PYTHON", "x-mq-client-version": "5.0.0", "x-mq-protocol": "v2",
                        "x-mq-date-time": "20261126T000000Z"}  # fmt: skip
        self.peer_address = "ipv4:127.0.0.1:50000"

    def time_remaining(self) -> float:
        return 10.0


def _request() -> bytes:
    m = pb.Message(topic=pb.Resource(name=TOPIC), body=BODY)
    m.system_properties.message_id = uuid.uuid4().hex
    m.system_properties.body_encoding = pb.IDENTITY
    m.system_properties.message_type = pb.NORMAL
    m.system_properties.born_host = "micro"
    m.system_properties.born_timestamp.GetCurrentTime()
    return spb.SendMessageRequest(messages=[m]).SerializeToString()


async def _measure(send: Callable[[int], Awaitable[None]], messages: int, senders: int) -> float:
    """CPU µs per message of `messages` sends from `senders` tasks (after a warm-up)."""
    left = [0]

    async def sender() -> None:
        while left[0] > 0:
            left[0] -= 1
            await send(left[0])

    left[0] = WARMUP
    await asyncio.gather(*(sender() for _ in range(senders)))
    left[0] = messages
    started = time.process_time()
    await asyncio.gather(*(sender() for _ in range(senders)))
    return (time.process_time() - started) * 1e6 / messages


async def run(layer: str, inline: bool, messages: int, senders: list[int], lite_topics: int = 0) -> dict[int, float]:
    root = Path(tempfile.mkdtemp(prefix="sluice-send-micro-"))
    commitlog = CommitLogConfig() if inline else CommitLogConfig(inline_append_max_bytes=0)
    config = dataclasses.replace(BrokerConfig(data_dir=root), store=StoreConfig(commitlog=commitlog))
    broker = LocalBroker(config)
    await broker.start()
    try:
        await broker.create_topic(TopicSpec(TOPIC, QUEUES))
        if layer == "broker" and lite_topics:
            send = await _lite_sender(broker, lite_topics)
        elif layer == "broker":
            # Each send's record encoded as an edge does (common.record.outgoing), with a fresh message
            # id: what a caller of the broker makes per send, then the broker's verify, place, append.
            async def send(i: int) -> None:
                record = outgoing(body=BODY, message_id=uuid.uuid4().hex, message_type=MessageType.NORMAL)
                await broker.send(TOPIC, i % QUEUES, [record], ctx=PRODUCER)

        else:
            app = ProxyApp(ProxyConfig(), LocalDirectory(broker))
            edge = Edge(app, MessagingServicer(app))
            call = edge._unary("SendMessage", spb.SendMessageRequest, spb.SendMessageResponse,
                               edge.servicer.SendMessage)  # fmt: skip
            requests, context = [_request() for _ in range(1000)], _Context()

            async def send(i: int) -> None:
                raw = await call(requests[i % len(requests)], context)  # type: ignore[arg-type]
                answer = spb.SendMessageResponse.FromString(raw)
                assert answer.status.code == pb.OK, answer.status

        return {n: await _measure(send, messages, n) for n in senders}
    finally:
        await broker.close()
        shutil.rmtree(root, ignore_errors=True)


async def _lite_sender(broker: LocalBroker, lite_topics: int) -> Callable[[int], Awaitable[None]]:
    """Sends of one LITE message each to a lite topic of LITE_TOPIC drawn at random; every lite topic
    created first (500 per send), so that the sends measure existing ones."""
    spec = TopicSpec(LITE_TOPIC, 1, frozenset({MessageType.LITE}), max_lite_topics=lite_topics + 1)
    await broker.create_topic(spec)
    names, rnd = [f"l{i}" for i in range(lite_topics)], random.Random(7)

    def message(name: str) -> bytes:
        props = {SYSPROP_LITE_TOPIC: name}
        return outgoing(body=BODY, message_id=uuid.uuid4().hex, message_type=MessageType.LITE,
                        system_properties=props)  # fmt: skip

    for start in range(0, lite_topics, 500):
        await broker.send(LITE_TOPIC, 0, [message(name) for name in names[start : start + 500]], ctx=PRODUCER)

    async def send(i: int) -> None:
        await broker.send(LITE_TOPIC, 0, [message(names[rnd.randrange(lite_topics)])], ctx=PRODUCER)

    return send


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=20_000, help="measured sends per figure")
    ap.add_argument("--senders", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4, 32])
    ap.add_argument("--layer", choices=("broker", "proxy", "both"), default="both")
    ap.add_argument("--lite-topics", type=int, default=0, help="send LITE messages over N lite topics (broker layer)")
    args = ap.parse_args()
    layers = ("broker", "proxy") if args.layer == "both" else (args.layer,)
    if args.lite_topics:
        layers = ("broker",)
    print(f"CPU µs per single-message send, {args.messages:,} sends per figure, 1 KiB bodies")
    print(f"{'layer':<8}{'small appends':<16}" + "".join(f"{f'{n} senders':>12}" for n in args.senders))
    for layer in layers:
        for inline in (True, False):
            figures = uvloop.run(run(layer, inline, args.messages, args.senders, args.lite_topics))
            where = "on the loop" if inline else "writer thread"
            print(f"{layer:<8}{where:<16}" + "".join(f"{figures[n]:>12.1f}" for n in args.senders))
    return 0


if __name__ == "__main__":
    sys.exit(main())
