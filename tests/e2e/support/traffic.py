"""An application under test: the official Python Producer and SimpleConsumer in loops, in threads.

`Traffic` starts both clients with one endpoints setting (as an application configured from
navigation would), then one thread sends a message every `interval_s` and another receives (long
polling) and acks each message. It records what the application sees: every message id whose send
returned (with the proxy endpoint of the queue it went to), every delivery and ack (with the proxy
endpoint it came through), and every exception a client call raised, with its time — so a test can
ask "which exceptions reached the application between t1 and t2?". Bodies are `<label>-<n>`.

Every loop stops on its own event; `close()` joins the threads with a bound and shuts the clients
down (the Python client's shutdown talks to every endpoint it knows, dead ones included).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType

from rocketmq import FilterExpression, Producer, SimpleConsumer

from tests.e2e.support.clients import configuration, message

INTERVAL_S = 0.05
ERROR_PAUSE_S = 0.2
INVISIBLE_S = 10  # an un-acked delivery comes back this long after it was received
AWAIT_S = 1
RECEIVE_BATCH = 16
JOIN_TIMEOUT_S = 20.0


@dataclass(frozen=True)
class Failure:
    at: float  # time.monotonic()
    call: str  # send, receive, ack
    error: str


@dataclass(frozen=True)
class Delivery:
    at: float
    message_id: str
    endpoint: str  # the proxy it came through
    attempt: int


@dataclass
class Traffic:
    endpoints: str
    topic: str
    group: str
    label: str
    interval_s: float = INTERVAL_S
    sent: dict[str, tuple[float, str]] = field(default_factory=dict)  # id -> (time, proxy endpoint)
    deliveries: list[Delivery] = field(default_factory=list)
    acked: set[str] = field(default_factory=set)
    ack_failed: set[str] = field(default_factory=set)  # ids whose ack raised at least once
    acked_per_broker: set[str] = field(default_factory=set)  # of those, acked all the same (`wait_all_acked`)
    failures: list[Failure] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._stop_producing = threading.Event()
        self._stop_consuming = threading.Event()
        self._threads: list[threading.Thread] = []
        self._producer: Producer | None = None
        self._consumer: SimpleConsumer | None = None

    # -- lifecycle ---------------------------------------------------------------------------------

    def __enter__(self) -> Traffic:
        self.start()
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()

    def start(self) -> None:
        """Start both clients (in this thread: a startup failure raises here), then both loops."""
        config = configuration(self.endpoints)
        self._producer = Producer(config, (self.topic,))
        self._producer.startup()
        self._consumer = SimpleConsumer(config, self.group, {self.topic: FilterExpression()}, await_duration=AWAIT_S)
        self._consumer.startup()
        self.started_at = time.monotonic()
        for name, loop in (("produce", self._produce), ("consume", self._consume)):
            thread = threading.Thread(target=loop, name=f"traffic-{self.label}-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop_producing(self) -> None:
        self._stop_producing.set()
        self._threads[0].join(JOIN_TIMEOUT_S)
        assert not self._threads[0].is_alive(), "the producer loop did not stop"

    def close(self) -> None:
        self._stop_producing.set()
        self._stop_consuming.set()
        for thread in self._threads:
            thread.join(JOIN_TIMEOUT_S)
        for client in (self._producer, self._consumer):
            if client is not None:
                client.shutdown()
        left = [t.name for t in self._threads if t.is_alive()]
        assert not left, f"loops still running after {JOIN_TIMEOUT_S} s: {left}"

    # -- loops -----------------------------------------------------------------------------------

    def _produce(self) -> None:
        assert self._producer is not None
        for n in itertools.count():
            if self._stop_producing.is_set():
                return
            try:
                receipt = self._producer.send(message(self.topic, f"{self.label}-{n}".encode()))
            except Exception as exc:  # whatever reaches the application is recorded
                self._fail("send", exc)
                self._stop_producing.wait(ERROR_PAUSE_S)
                continue
            with self._lock:
                self.sent[receipt.message_id] = (time.monotonic(), str(receipt.message_queue.endpoints))
            self._stop_producing.wait(self.interval_s)

    def _consume(self) -> None:
        assert self._consumer is not None
        while not self._stop_consuming.is_set():
            try:
                messages = self._consumer.receive(RECEIVE_BATCH, INVISIBLE_S)
            except Exception as exc:
                self._fail("receive", exc)
                self._stop_consuming.wait(ERROR_PAUSE_S)
                continue
            for m in messages:
                with self._lock:
                    self.deliveries.append(Delivery(time.monotonic(), m.message_id, str(m.endpoints),
                                                    m.delivery_attempt))  # fmt: skip
                try:
                    self._consumer.ack(m)
                except Exception as exc:
                    self._fail("ack", exc)
                    with self._lock:
                        self.ack_failed.add(m.message_id)
                    continue
                with self._lock:
                    self.acked.add(m.message_id)

    def _fail(self, call: str, exc: BaseException) -> None:
        with self._lock:
            self.failures.append(Failure(time.monotonic(), call, f"{type(exc).__name__}: {exc}"[:300]))

    # -- questions -------------------------------------------------------------------------------

    def failures_between(self, start: float, end: float = float("inf")) -> list[Failure]:
        with self._lock:
            return [f for f in self.failures if start <= f.at <= end]

    def not_acked(self) -> set[str]:
        """Sent messages neither acked by the consumer nor found acked by the broker (`wait_all_acked`)."""
        with self._lock:
            return set(self.sent) - self.acked - self.acked_per_broker

    def endpoints_used(self, start: float, end: float = float("inf")) -> tuple[set[str], set[str]]:
        """(proxies sends went to, proxies deliveries came through) between `start` and `end`."""
        with self._lock:
            sends = {ep for at, ep in self.sent.values() if start <= at <= end}
            delivered = {d.endpoint for d in self.deliveries if start <= d.at <= end}
        return sends, delivered

    def wait(self, what: str, condition: Callable[[], bool], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            if time.monotonic() >= deadline:
                raise AssertionError(f"{what}: not within {timeout_s:g} s ({self.summary()})")
            time.sleep(0.1)

    def wait_all_acked(self, timeout_s: float, acked_by_broker: Callable[[str], bool] | None = None) -> None:
        """Wait until every sent message is acked. An ack that raised is ambiguous when a proxy dies
        mid-call: the broker may have committed it before the proxy could answer, and then the message
        is (rightly) never delivered again. Once every message still missing is such a one,
        `acked_by_broker(message_id)` asks the broker (the message trace) whether its ack landed."""

        def done() -> bool:
            missing = self.not_acked()
            if not missing or acked_by_broker is None:
                return not missing
            with self._lock:
                if not missing <= self.ack_failed:
                    return False  # others are still to come back: wait for their redelivery first
            for message_id in missing:
                if acked_by_broker(message_id):
                    with self._lock:
                        self.acked_per_broker.add(message_id)
            return not self.not_acked()

        self.wait("every sent message acked", done, timeout_s)

    def summary(self) -> str:
        missing = self.not_acked()
        with self._lock:
            calls: dict[str, int] = {}
            for f in self.failures:
                calls[f.call] = calls.get(f.call, 0) + 1
            return (f"{len(self.sent)} sent, {len(self.deliveries)} deliveries, {len(self.acked)} acked, "
                    f"{len(self.acked_per_broker)} acked per the broker after a failed ack, "
                    f"{len(missing)} sent but not acked, failures {calls}")  # fmt: skip
