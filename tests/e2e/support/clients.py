"""The official Python client (`rocketmq-python-client`), used exactly as applications use it.

Context managers start a client and always shut it down; `receive_until` drives a SimpleConsumer
until a condition holds, bounded by a timeout. Times given to the client are whole seconds (it
puts them into Duration.seconds).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from rocketmq import (
    ClientConfiguration,
    Credentials,
    FilterExpression,
    Message,
    MessageListener,
    Producer,
    PushConsumer,
    SimpleConsumer,
)
from rocketmq.v5.client.connection.rpc_client import RpcClient

REQUEST_TIMEOUT_S = 3
# Short: the Python SimpleConsumer picks a queue at random for each receive, so with two brokers
# about half the receives long-poll a broker that has nothing.
AWAIT_DURATION_S = 1
# Long enough that a message held un-acked while the test looks for others does not come back.
INVISIBLE_S = 60
RECEIVE_TIMEOUT_S = 30.0


def bind_client_loop() -> None:
    """Make the client's I/O loop the main thread's current event loop, as the client itself does
    when it opens a channel from this thread.

    The client opens a telemetry stream in whichever thread handles its first route answer. That
    is its I/O thread, unless the answer is in before the callback is attached: then it is the
    calling thread, on a channel the I/O thread already opened, and grpc.aio asks that thread for
    its event loop. After an `asyncio.run` in this thread (the AMQP and Spark tests use it) there
    is none: the stream fails ("There is no current event loop in thread 'MainThread'") and the
    producer's first send finds no route. A race of the client's, not of the server's.
    """
    loop = RpcClient.get_channel_io_loop()
    if loop is not None and threading.current_thread() is threading.main_thread():
        asyncio.set_event_loop(loop)


def start(client: Producer | SimpleConsumer | PushConsumer) -> None:
    bind_client_loop()
    client.startup()


def configuration(endpoints: str, namespace: str = "") -> ClientConfiguration:
    return ClientConfiguration(endpoints, Credentials(), namespace=namespace, request_timeout=REQUEST_TIMEOUT_S)


@contextmanager
def producer(endpoints: str, *topics: str, namespace: str = "") -> Iterator[Producer]:
    client = Producer(configuration(endpoints, namespace), topics or None)
    start(client)
    try:
        yield client
    finally:
        client.shutdown()


@contextmanager
def simple_consumer(
    endpoints: str, group: str, subscription: dict[str, FilterExpression], *, namespace: str = "",
    await_duration_s: int = AWAIT_DURATION_S,
) -> Iterator[SimpleConsumer]:  # fmt: skip
    client = SimpleConsumer(configuration(endpoints, namespace), group, subscription, await_duration=await_duration_s)
    start(client)
    try:
        yield client
    finally:
        client.shutdown()


@contextmanager
def producer_and_consumer(
    endpoints: str, topic: str, group: str, expression: FilterExpression | None = None
) -> Iterator[tuple[Producer, SimpleConsumer]]:
    """A producer of `topic` and a SimpleConsumer of `group` subscribed to it (default: every tag)."""
    with (
        producer(endpoints, topic) as p,
        simple_consumer(endpoints, group, {topic: expression or FilterExpression()}) as c,
    ):
        yield p, c


@contextmanager
def push_consumer(
    endpoints: str, group: str, listener: MessageListener, subscription: dict[str, FilterExpression],
    *, consumption_threads: int = 4,
) -> Iterator[PushConsumer]:  # fmt: skip
    client = PushConsumer(configuration(endpoints), group, listener, subscription,
                          consumption_thread_count=consumption_threads)  # fmt: skip
    start(client)
    try:
        yield client
    finally:
        client.shutdown()


def message(
    topic: str, body: bytes, *, tag: str | None = None, keys: Sequence[str] = (), group: str | None = None,
    properties: dict[str, str] | None = None,
) -> Message:  # fmt: skip
    msg = Message()
    msg.topic = topic
    msg.body = body
    if tag is not None:
        msg.tag = tag
    for key in keys:  # the client's setter takes one key per assignment
        msg.keys = key
    if group is not None:
        msg.message_group = group
    for k, v in (properties or {}).items():
        msg.add_property(k, v)
    return msg


def send_all(client: Producer, messages: Sequence[Message]) -> list[str]:
    """Send synchronously; the message ids in send order."""
    return [client.send(m).message_id for m in messages]


def receive_until(
    consumer: SimpleConsumer, done: Callable[[list[Message]], bool], *, timeout_s: float = RECEIVE_TIMEOUT_S,
    invisible_s: int = INVISIBLE_S, ack: bool = True, max_messages: int = 16, retry_unavailable: bool = False,
) -> list[Message]:  # fmt: skip
    """Receive (and by default ack) until `done(all received so far)` holds; fails after `timeout_s`.

    `retry_unavailable`: a receive answered "unavailable" (a broker just restarted and the proxy's
    channel to it is still reconnecting) is retried, as an application would, instead of failing.
    """
    got: list[Message] = []
    deadline = time.monotonic() + timeout_s
    while not done(got):
        if time.monotonic() >= deadline:
            raise AssertionError(f"condition not met within {timeout_s} s; received {describe(got)}")
        try:
            batch = consumer.receive(max_messages, invisible_s)
        except Exception as exc:
            if not retry_unavailable or "unavailable" not in str(exc):
                raise
            time.sleep(0.5)
            continue
        for msg in batch:
            if ack:
                consumer.ack(msg)
            got.append(msg)
    return got


def receive_count(consumer: SimpleConsumer, count: int, **kwargs: object) -> list[Message]:
    return receive_until(consumer, lambda got: len(got) >= count, **kwargs)  # type: ignore[arg-type]


def describe(messages: Sequence[Message]) -> str:
    return "[" + ", ".join(f"{m.message_id}/{m.tag}/{m.body[:20]!r}/attempt {m.delivery_attempt}"
                           for m in messages) + "]"  # fmt: skip
