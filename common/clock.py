"""`Clock`: where the broker reads the time its message state depends on.

Invisible durations and redelivery (broker/consumer.py), delivery times of DELAY messages
(broker/timer/), transaction check-backs (broker/transaction/), lite topic expiry and idle lite
clients (broker/lite/) read `now_ms()` (wall clock, epoch milliseconds: stored in indexes and
receipt handles, so it must agree across restarts and brokers) or `monotonic()` (seconds, for ages
kept only in memory). `LocalBroker` takes one at construction and hands it to each of them;
`SYSTEM_CLOCK` reads the operating system's clocks. A test may pass a clock it moves itself
(tests/helpers/clock.py), so that it can test "after the invisible duration" without sleeping.

Waits are not read here: a long poll's deadline and a background task's interval are the event
loop's time, which a test's clock does not move.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int:
        """Wall-clock time, milliseconds since the epoch."""
        ...

    def monotonic(self) -> float:
        """Seconds from an arbitrary start, never going back."""
        ...


class SystemClock:
    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic(self) -> float:
        return time.monotonic()


SYSTEM_CLOCK: Clock = SystemClock()
