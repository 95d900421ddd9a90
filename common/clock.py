"""`Clock`: where the broker reads the time its message state depends on.

`LocalBroker` takes one at construction and hands it to each part that keeps time-dependent
state: invisible durations, redelivery and retry delays (broker/consumer.py), delivery times of
DELAY messages (broker/timer/), transaction check-backs (broker/transaction/), lite topic expiry
and idle lite clients (broker/lite/), the dedup window (broker/dedup.py), the age of CommitLog
segments for retention (`MessageStore.run_retention(now_s)`), tiering's upload ages, tiered
retention and the manifest's time (broker/tiering/runtime.py), message-trace event times and
their expiry (broker/trace.py) and the time to live of proxies' client reports
(broker/clients.py). They read `now_ms()` (wall clock, epoch milliseconds: stored in indexes and
receipt handles, so it must agree across restarts and brokers) or `monotonic()` (seconds, for
ages kept only in memory). `SYSTEM_CLOCK` reads the operating system's clocks. A test may pass a
clock it moves itself (tests/helpers/clock.py), so that it can test "after the invisible
duration" without sleeping.

Still on the system clock: the CommitLog's store timestamps (broker/store/writer.py, the append
path), and what is compared with them: a group's creation time (broker/metadata.py, where a
group that starts at "latest" begins) and the dispatch lag metric (broker/store/dispatcher.py).
Waits are not read here either: a long poll's deadline, a call's deadline and a background
task's interval are the event loop's time, which a test's clock does not move.
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
