#!/usr/bin/env python3
"""Drive a peer broker with its own Python client, the way tests/bench/client_bench.py drives Sluice.

    python peers.py '{"peer": "nats" | "rabbitmq", "mode": "produce" | "consume", "url": ..., ...}'

- NATS JetStream (nats-py): durable file stream, `js.publish` awaited (the server's ack), `concurrency`
  publishes in flight; consume with a durable pull consumer, `fetch(batch)` + explicit ack per message.
- RabbitMQ (aio-pika): durable queue, persistent messages, publisher confirms, `concurrency` publishes in
  flight; consume with prefetch `batch * concurrency` and a manual ack per message.

Same protocol as the official-client drivers: `{"event": "start"}` after `warmup_s`, then
`{"event": "end", "messages": N, "errors": E, "seconds": S}` after `seconds` more; stops by itself.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

STREAM = "BENCH"
SUBJECT = "bench.msgs"
QUEUE = "bench"


class Run:
    def __init__(self) -> None:
        self.counting = False
        self.stop = False
        self.messages = 0
        self.errors = 0

    def add(self, messages: int, errors: int = 0) -> None:
        if self.counting:
            self.messages += messages
            self.errors += errors


def emit(event: dict[str, Any]) -> None:
    print(json.dumps(event), flush=True)


async def measure(opts: dict[str, Any], run: Run, loops: list[Awaitable[None]]) -> None:
    tasks = [asyncio.ensure_future(loop) for loop in loops]
    await asyncio.sleep(float(opts["warmup_s"]))
    run.counting = True
    emit({"event": "start"})
    started = time.monotonic()
    await asyncio.sleep(float(opts["seconds"]))
    run.counting = False
    emit({"event": "end", "messages": run.messages, "errors": run.errors,
          "seconds": round(time.monotonic() - started, 3)})  # fmt: skip
    run.stop = True
    await asyncio.wait(tasks, timeout=35)
    for task in tasks:
        task.cancel()


async def nats_run(opts: dict[str, Any], run: Run) -> None:
    import nats
    from nats.js.api import StorageType

    nc = await nats.connect(opts["url"])
    js = nc.jetstream()
    if opts["mode"] == "produce":
        await js.add_stream(name=STREAM, subjects=[SUBJECT], storage=StorageType.FILE)
        body = b"x" * int(opts["body_bytes"])

        async def publish() -> None:
            while not run.stop:
                try:
                    await js.publish(SUBJECT, body)
                    run.add(1)
                except Exception:
                    run.add(0, 1)

        loops: list[Awaitable[None]] = [publish() for _ in range(int(opts["concurrency"]))]
    else:
        sub = await js.pull_subscribe(SUBJECT, durable="bench")

        async def fetch() -> None:
            while not run.stop:
                try:
                    msgs = await sub.fetch(int(opts["batch"]), timeout=2)
                except Exception:
                    continue
                for msg in msgs:
                    await msg.ack()
                    run.add(1)

        loops = [fetch() for _ in range(int(opts["consumers"]))]
    await measure(opts, run, loops)
    await nc.close()


async def rabbitmq_run(opts: dict[str, Any], run: Run) -> None:
    import aio_pika

    connection = await aio_pika.connect_robust(opts["url"])
    channel = await connection.channel(publisher_confirms=True)
    queue = await channel.declare_queue(QUEUE, durable=True)
    if opts["mode"] == "produce":
        body = b"x" * int(opts["body_bytes"])

        async def publish() -> None:
            while not run.stop:
                try:
                    msg = aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT)
                    await channel.default_exchange.publish(msg, routing_key=QUEUE)
                    run.add(1)
                except Exception:
                    run.add(0, 1)

        loops: list[Awaitable[None]] = [publish() for _ in range(int(opts["concurrency"]))]
    else:
        await channel.set_qos(prefetch_count=int(opts["batch"]) * int(opts["consumers"]))

        async def on_message(message: Any) -> None:
            await message.ack()
            run.add(1)

        loops = [queue.consume(on_message)]  # deliveries arrive on the channel until the connection closes
    await measure(opts, run, loops)
    await connection.close()


RUNNERS: dict[str, Callable[[dict[str, Any], Run], Awaitable[None]]] = {"nats": nats_run, "rabbitmq": rabbitmq_run}


def main() -> int:
    opts = json.loads(sys.argv[1])
    asyncio.run(RUNNERS[opts["peer"]](opts, Run()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
