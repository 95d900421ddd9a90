"""An application on a client host (a network namespace, tests/helpers/hosts.py), as a process.

The test process lives in the root namespace and cannot dial the hosts, so the official clients run
here, started with `ip netns exec`, and tell the test what they saw as JSON lines:

    python -m tests.e2e.support.hostclient traffic --endpoints E --topic T --group G --events FILE
        [--fifo-groups N] [--produce-s S] [--drain-s D] [--interval-s I]

sends one message at a time through the official Python Producer for `--produce-s` seconds, or
until it gets SIGUSR1 (with
`--fifo-groups`, to that many message groups in turn, each group's bodies numbered in order; a send
failed after the client's own retries is sent again with the same body), while a SimpleConsumer of
`--group` receives and acks; then it stops producing and consumes until every acknowledged send is
settled or `--drain-s` passed. Each line of `--events` is one thing the application saw, with
its `time.monotonic()` (one clock for every namespace of the machine): `sent`, `send_failed`,
`delivered` (with the stored copy, broker, queue and offset, and the handle version from the
receipt handle), `acked`,
`ack_failed`, `receive_failed`, and `done` at the end. `read_events` turns the file into a
`History` (support/history.py) and the send times.

    python -m tests.e2e.support.hostclient amqp --host H --port P --queue Q --count N

declares `Q` with pika, publishes N messages with publisher confirms, consumes and acks them, and
prints `{"published": N, "consumed": [...]}`.

    python -m tests.e2e.support.hostclient mqtt --host H --port P --bind B --count N

connects two paho-mqtt (5.0) clients, subscribes one to `B/#` at QoS 1, publishes N messages to
`B/m` at QoS 1 with the other, and prints `{"published": N, "received": [...]}`.

    python -m tests.e2e.support.hostclient route --endpoint E --topic T

asks E for the route of T as the Python client does (QueryRoute) and prints its queues as JSON:
`[{"broker", "queue", "permission" (the protocol's name), "endpoints": ["host:port", ...]}]`.
"""

from __future__ import annotations

import argparse
import itertools
import json
import signal
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from tests.e2e.support.history import History

INVISIBLE_S = 10
RECEIVE_BATCH = 16
FAILED_SEND_PAUSE_S = 0.05
FAILED_RECEIVE_PAUSE_S = 0.2
AMQP_TIMEOUT_S = 30.0


@dataclass
class Seen:
    """What `read_events` found: the history, and the times of acknowledged and failed sends."""

    history: History
    sent_at: list[float] = field(default_factory=list)
    failed_at: list[float] = field(default_factory=list)
    received_at: list[float] = field(default_factory=list)
    done: bool = False

    def longest_gap(self, start: float, end: float, times: list[float] | None = None) -> float:
        """The longest span in [start, end] without an acknowledged send (or `times`)."""
        stamps = [start, *(t for t in (self.sent_at if times is None else times) if start <= t <= end), end]
        return max(b - a for a, b in itertools.pairwise(stamps))

    def first_after(self, moment: float, times: list[float] | None = None) -> float | None:
        """Seconds from `moment` to the first acknowledged send (or `times`) after it; None if none."""
        later = [t for t in (self.sent_at if times is None else times) if t > moment]
        return min(later) - moment if later else None


def read_events(path: Path) -> Seen:
    seen = Seen(History())
    if not path.exists():
        return seen
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        event: dict[str, Any] = json.loads(line)
        kind, body = event["ev"], event.get("body", "")
        if kind == "sent":
            seen.history.sent(body, stream=event.get("stream"))
            seen.sent_at.append(event["t"])
        elif kind == "send_failed":
            seen.failed_at.append(event["t"])
        elif kind == "delivered":
            seen.history.delivered(body, tuple(event["copy"]), event.get("v"))  # type: ignore[arg-type]
            seen.received_at.append(event["t"])
        elif kind == "acked":
            seen.history.acked(body, tuple(event["copy"]))  # type: ignore[arg-type]
        elif kind == "ack_failed":
            seen.history.ack_failed(body)
        elif kind == "done":
            seen.done = True
    return seen


class Log:
    def __init__(self, out: IO[str]) -> None:
        self._out, self._lock = out, threading.Lock()

    def __call__(self, ev: str, **fields: object) -> None:
        with self._lock:
            self._out.write(json.dumps({"t": time.monotonic(), "ev": ev, **fields}) + "\n")
            self._out.flush()


def traffic(args: argparse.Namespace) -> None:
    from rocketmq import FilterExpression

    from tests.e2e.support.clients import message, producer, simple_consumer
    from tests.e2e.support.handles import fields

    with open(args.events, "a") as out, producer(args.endpoints, args.topic) as client, \
            simple_consumer(args.endpoints, args.group, {args.topic: FilterExpression()}) as consumer:  # fmt: skip
        log = Log(out)
        sent: set[str] = set()
        settled: set[str] = set()
        lock = threading.Lock()
        stop_producing = threading.Event()
        produced = threading.Event()  # the producer's last send answered: `sent` is final

        def produce() -> None:
            try:
                send_until_stopped()
            finally:
                produced.set()

        def send_until_stopped() -> None:
            n: Counter[str] = Counter()
            turn = 0
            while not stop_producing.is_set():
                key = f"k{turn % args.fifo_groups}" if args.fifo_groups else "n"
                body = f"{args.topic}:{key}:{n[key]}"
                try:
                    client.send(message(args.topic, body.encode(), group=key if args.fifo_groups else None))
                except Exception as exc:  # failed after the client's own retries: the same body again
                    log("send_failed", body=body, error=str(exc)[:200])
                    time.sleep(FAILED_SEND_PAUSE_S)
                    continue
                with lock:
                    sent.add(body)
                log("sent", body=body, stream=key if args.fifo_groups else None)
                n[key] += 1
                turn += 1
                time.sleep(args.interval_s)

        def all_settled() -> bool:
            # Not before the producer's last send answered: a send in flight when producing stops
            # (one waiting out a cut host's timeout) may still be acknowledged, and must be consumed.
            with lock:
                return produced.is_set() and sent <= settled

        def consume() -> None:
            deadline: float | None = None
            while not all_settled():
                if produced.is_set():
                    deadline = deadline or time.monotonic() + args.drain_s
                    if time.monotonic() > deadline:
                        return
                try:
                    batch = consumer.receive(RECEIVE_BATCH, INVISIBLE_S)
                except Exception as exc:
                    log("receive_failed", error=str(exc)[:200])
                    time.sleep(FAILED_RECEIVE_PAUSE_S)
                    continue
                for msg in batch:
                    body = msg.body.decode()
                    broker, queue_id, offset, version = fields(msg.receipt_handle)
                    copy = [broker, queue_id, offset]  # a stored copy: (queue, offset) of one broker
                    log("delivered", body=body, copy=copy, v=version)
                    try:
                        consumer.ack(msg)
                    except Exception as exc:
                        log("ack_failed", body=body, error=str(exc)[:200])
                    else:
                        log("acked", body=body, copy=copy)
                    with lock:
                        settled.add(body)

        producing = threading.Thread(target=produce, name="producer")
        consuming = threading.Thread(target=consume, name="consumer")
        signal.signal(signal.SIGUSR1, lambda *_: stop_producing.set())  # the test may end producing early
        producing.start()
        consuming.start()
        stop_producing.wait(args.produce_s)
        stop_producing.set()
        producing.join()
        consuming.join()
        log("done")


def amqp(args: argparse.Namespace) -> None:
    import pika

    credentials = pika.PlainCredentials(args.user, args.password)
    params = pika.ConnectionParameters(
        args.host, args.port, credentials=credentials, blocked_connection_timeout=AMQP_TIMEOUT_S,
        socket_timeout=AMQP_TIMEOUT_S,
    )  # fmt: skip
    with pika.BlockingConnection(params) as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare(args.queue, durable=True)
        for i in range(args.count):
            channel.basic_publish("", args.queue, f"m{i}".encode(), pika.BasicProperties(delivery_mode=2))
        consumed: list[str] = []
        deadline = time.monotonic() + AMQP_TIMEOUT_S
        while len(consumed) < args.count and time.monotonic() < deadline:
            method, _, body = channel.basic_get(args.queue)
            if method is None:
                time.sleep(FAILED_RECEIVE_PAUSE_S)
                continue
            consumed.append(body.decode())
            channel.basic_ack(method.delivery_tag)
    print(json.dumps({"published": args.count, "consumed": consumed}))


def mqtt(args: argparse.Namespace) -> None:
    from tests.e2e.support.mqtt import Paho

    address = f"{args.host}:{args.port}"
    subscriber, publisher = Paho(address), Paho(address)
    try:
        subscriber.subscribe(f"{args.bind}/#", 1)
        for i in range(args.count):
            publisher.publish(f"{args.bind}/m", f"m{i}", 1)
        received = [m.payload.decode() for m in subscriber.take(args.count)]
    finally:
        subscriber.disconnect()
        publisher.disconnect()
    print(json.dumps({"published": args.count, "received": received}))


def route(args: argparse.Namespace) -> None:
    from tests.e2e.support import raw

    with raw.stub(args.endpoint) as stub:
        answer = raw.query_route(stub, args.topic)
    if raw.code_name(answer.status.code) != "OK":
        raise SystemExit(f"QueryRoute {args.topic} at {args.endpoint}: {answer.status}")
    queues = [{"broker": q.broker.name, "queue": q.id, "permission": raw.pb.Permission.Name(q.permission),
               "endpoints": [f"{a.host}:{a.port}" for a in q.broker.endpoints.addresses]}
              for q in answer.message_queues]  # fmt: skip
    print(json.dumps(queues))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="mode", required=True)
    run = sub.add_parser("traffic")
    run.add_argument("--endpoints", required=True)
    run.add_argument("--topic", required=True)
    run.add_argument("--group", required=True)
    run.add_argument("--events", required=True)
    run.add_argument("--fifo-groups", type=int, default=0)
    run.add_argument("--produce-s", type=float, default=10.0)
    run.add_argument("--drain-s", type=float, default=30.0)
    run.add_argument("--interval-s", type=float, default=0.02)
    mq = sub.add_parser("amqp")
    mq.add_argument("--host", required=True)
    mq.add_argument("--port", type=int, required=True)
    mq.add_argument("--user", required=True)
    mq.add_argument("--password", required=True)
    mq.add_argument("--queue", required=True)
    mq.add_argument("--count", type=int, default=20)
    mt = sub.add_parser("mqtt")
    mt.add_argument("--host", required=True)
    mt.add_argument("--port", type=int, required=True)
    mt.add_argument("--bind", required=True)
    mt.add_argument("--count", type=int, default=20)
    ask = sub.add_parser("route")
    ask.add_argument("--endpoint", required=True)
    ask.add_argument("--topic", required=True)
    args = parser.parse_args()
    {"traffic": traffic, "amqp": amqp, "mqtt": mqtt, "route": route}[args.mode](args)


if __name__ == "__main__":
    sys.exit(main())
