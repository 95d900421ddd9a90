#!/usr/bin/env python3
"""Drive Sluice with the official `rocketmq-python-client`, as an application would (tests/bench/client_bench.py).

    python official_python.py '{"endpoint": "127.0.0.1:8081", "mode": "produce", "topic": "t", ...}'

mode `produce`: `threads` threads each call `Producer.send` (one message, `body_bytes` long) in a loop;
with `lite_topics` N > 0 (a LITE topic) each message names lite topic `l<i mod N>`, i counting sends.
mode `consume`: `threads` threads share one `SimpleConsumer` and loop `receive(batch)` + `ack` per message.

After `warmup_s` the driver prints `{"event": "start"}`, runs `seconds` more, then prints
`{"event": "end", "messages": N, "errors": E, "seconds": S}`: the bench samples the servers' CPU at
those two lines, so the client's start-up and warm-up are not counted. Stops by itself.
"""

from __future__ import annotations

import itertools
import json
import sys
import threading
import time
from typing import Any

from rocketmq import ClientConfiguration, Credentials, FilterExpression, Message, Producer, SimpleConsumer


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
    consumer = SimpleConsumer(config, opts["group"], {opts["topic"]: FilterExpression()}, await_duration=2)
    consumer.startup()
    batch = int(opts.get("batch", 32))

    def loop() -> None:
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

    run_threads(loop, int(opts["threads"]), opts, stop, counter)
    consumer.shutdown()


def run_threads(loop: Any, threads: int, opts: dict[str, Any], stop: threading.Event, counter: Counter) -> None:
    workers = [threading.Thread(target=loop, daemon=True) for _ in range(threads)]
    for w in workers:
        w.start()
    time.sleep(float(opts["warmup_s"]))
    counter.counting = True
    emit({"event": "start"})
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
    {"produce": produce, "consume": consume}[opts["mode"]](opts, stop, counter)
    return 0


if __name__ == "__main__":
    sys.exit(main())
