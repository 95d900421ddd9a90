#!/usr/bin/env python3
"""Drive Sluice with the official `rocketmq-python-client`, as an application would (tests/bench/client_bench.py).

    python official_python.py '{"endpoint": "127.0.0.1:8081", "mode": "produce", "topic": "t", ...}'

mode `produce`: `threads` threads each call `Producer.send` (one message, `body_bytes` long) in a loop;
with `lite_topics` N > 0 (a LITE topic) each message names lite topic `l<i mod N>`, i counting sends.
mode `consume`: `threads` threads share one `SimpleConsumer` and loop `receive(batch)` + `ack` per message;
with `consumers` C > 1, C SimpleConsumers of the group, thread i using consumer i mod C.
mode `lite_consume`: the same with `LiteSimpleConsumer`s bound to the LITE topic `topic`, together
subscribed to lite topics `l0` .. `l<lite_topics - 1>`, `per_consumer` (the subscription quota,
default 10,000) each: C = ceil(lite_topics / per_consumer). Each one waits for the server's settings,
adds its names to its subscription set and calls `subscribe_lite_all()`: one COMPLETE_ADD, the
request the client itself re-sends every 30 s (`subscribe_lite` is one request per lite topic:
~1,000/s here, 100 s for 100,000). Subscribing happens before the warm-up.

After `warmup_s` the driver prints `{"event": "start"}`, runs `seconds` more, then prints
`{"event": "end", "messages": N, "errors": E, "seconds": S}`: the bench samples the servers' CPU at
those two lines, so the client's start-up and warm-up are not counted. With `start_at` (a
time.time() instant) it starts counting then instead, so that several drivers count over one window
(client_bench.py --py-drivers); its start line then says how late it was (`late_s`). Stops by itself.
"""

from __future__ import annotations

import itertools
import json
import sys
import threading
import time
from typing import Any

from rocketmq import (
    ClientConfiguration,
    Credentials,
    FilterExpression,
    LiteSimpleConsumer,
    Message,
    Producer,
    SimpleConsumer,
)


class Counter:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.messages = 0
        self.errors = 0
        self.counting = False

    def add(self, messages: int, errors: int = 0) -> None:
        if self.counting:
            with self.lock:
                self.messages += messages
                self.errors += errors


def emit(event: dict[str, Any]) -> None:
    print(json.dumps(event), flush=True)


def produce(opts: dict[str, Any], stop: threading.Event, counter: Counter) -> None:
    config = ClientConfiguration(opts["endpoint"], Credentials(), request_timeout=10)
    producer = Producer(config, (opts["topic"],))
    producer.startup()
    body = b"x" * int(opts["body_bytes"])
    lite_topics = int(opts.get("lite_topics", 0))
    sends = itertools.count()

    def loop() -> None:
        while not stop.is_set():
            msg = Message()
            msg.topic = opts["topic"]
            msg.body = body
            if lite_topics:
                msg.lite_topic = f"l{next(sends) % lite_topics}"
            try:
                producer.send(msg)
                counter.add(1)
            except Exception:
                counter.add(0, 1)

    run_threads(loop, int(opts["threads"]), opts, stop, counter)
    producer.shutdown()


def consume(opts: dict[str, Any], stop: threading.Event, counter: Counter) -> None:
    config = ClientConfiguration(opts["endpoint"], Credentials(), request_timeout=10)
    consumers = [SimpleConsumer(config, opts["group"], {opts["topic"]: FilterExpression()}, await_duration=2)
                 for _ in range(int(opts.get("consumers", 1)))]  # fmt: skip
    for consumer in consumers:
        consumer.startup()
    receive_loops(consumers, opts, stop, counter)


def lite_consume(opts: dict[str, Any], stop: threading.Event, counter: Counter) -> None:
    config = ClientConfiguration(opts["endpoint"], Credentials(), request_timeout=30)
    total, per = int(opts["lite_topics"]), int(opts.get("per_consumer", 10_000))
    consumers = []
    for first in range(0, total, per):
        consumer = LiteSimpleConsumer(opts["topic"], config, opts["group"], await_duration=2)
        consumer.startup()
        consumers.append(consumer)
        subscribe(consumer, [f"l{i}" for i in range(first, min(total, first + per))])
    receive_loops(consumers, opts, stop, counter)


def subscribe(consumer: LiteSimpleConsumer, names: list[str]) -> None:
    """Subscribe `names` in one COMPLETE_ADD, once the server's settings arrived (until then the
    client refuses subscriptions itself: docs/lite-topics.md, "Python client quirk")."""
    manager = next(v for k, v in vars(consumer).items() if k.endswith("__subscription_manager"))
    deadline = time.monotonic() + 10
    while manager.lite_subscription_quota == 0:
        if time.monotonic() > deadline:
            raise RuntimeError("no lite settings from the server within 10 s")
        time.sleep(0.05)
    vars(manager)["_LiteTopicSubscriptionManager__lite_topics"].update(names)
    consumer.subscribe_lite_all()


def receive_loops(consumers: list[Any], opts: dict[str, Any], stop: threading.Event, counter: Counter) -> None:
    """`threads` threads (at least one per consumer), thread i looping `receive(batch)` + `ack` per
    message on consumer i mod C. A batch received is acked whole, even after `stop`: a lite topic's
    next message waits for the previous one's ack, and the next turn's consumers are of the same group."""
    batch = int(opts.get("batch", 32))
    threads = max(int(opts["threads"]), len(consumers))
    picks = itertools.count()

    def loop() -> None:
        consumer = consumers[next(picks) % len(consumers)]
        while not stop.is_set():
            try:
                received = consumer.receive(batch, 30)
            except Exception:
                counter.add(0, 1)
                continue
            for message in received:
                try:
                    consumer.ack(message)
                    counter.add(1)
                except Exception:
                    counter.add(0, 1)

    run_threads(loop, threads, opts, stop, counter)
    for consumer in consumers:
        consumer.shutdown()


def run_threads(loop: Any, threads: int, opts: dict[str, Any], stop: threading.Event, counter: Counter) -> None:
    workers = [threading.Thread(target=loop, daemon=True) for _ in range(threads)]
    for w in workers:
        w.start()
    start_at = opts.get("start_at")
    time.sleep(float(opts["warmup_s"]) if start_at is None else max(0.0, float(start_at) - time.time()))
    counter.counting = True
    emit({"event": "start"} if start_at is None else {"event": "start", "late_s": round(time.time() - start_at, 3)})
    started = time.monotonic()
    time.sleep(float(opts["seconds"]))
    counter.counting = False
    elapsed = time.monotonic() - started
    emit({"event": "end", "messages": counter.messages, "errors": counter.errors, "seconds": round(elapsed, 3)})
    stop.set()
    for w in workers:
        w.join(timeout=35)


def main() -> int:
    opts = json.loads(sys.argv[1])
    stop, counter = threading.Event(), Counter()
    {"produce": produce, "consume": consume, "lite_consume": lite_consume}[opts["mode"]](opts, stop, counter)
    return 0


if __name__ == "__main__":
    sys.exit(main())
