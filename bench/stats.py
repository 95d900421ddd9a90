"""Counters and latency histograms of a bench run, and the once-a-second progress line.

`Histogram` is HDR-like: logarithmic buckets 1% wide from 1 µs to ~1,000 s (fixed memory, ~2,100
counters, O(1) record); a percentile is the upper bound of its bucket, so it overstates by at most
1% (and never exceeds the recorded maximum). Histograms merge by adding counters, which is how
several generator processes combine (`to_json` / `from_json`).

`Meter` counts one kind of call (send, receive, ack, or end-to-end deliveries): successful
messages, calls, calls that returned nothing, errors by code, and the latency of each call. Only
the event loop's thread touches a meter.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import sys
import time
from collections.abc import Sequence
from typing import Any, TextIO

LOWEST_S = 1e-6
BUCKET_GROWTH = 1.01
BUCKETS = 2100  # 1.01 ** 2100 µs ≈ 1,200 s
ERROR_KINDS_MAX = 32  # distinct error codes kept; the rest count as "OTHER"
PROGRESS_INTERVAL_S = 1.0
_LOG_GROWTH = math.log(BUCKET_GROWTH)


class Histogram:
    def __init__(self) -> None:
        self.counts = [0] * BUCKETS
        self.total = 0
        self.sum_s = 0.0
        self.max_s = 0.0

    def record(self, value_s: float) -> None:
        if value_s <= LOWEST_S:
            i = 0
        else:
            i = min(int(math.log(value_s / LOWEST_S) / _LOG_GROWTH) + 1, BUCKETS - 1)
        self.counts[i] += 1
        self.total += 1
        self.sum_s += value_s
        if value_s > self.max_s:
            self.max_s = value_s

    def percentile_s(self, q: float) -> float:
        """The value at quantile `q` (0..1); 0 when empty."""
        if not self.total:
            return 0.0
        rank = max(1, math.ceil(q * self.total))
        seen = 0
        for i, c in enumerate(self.counts):
            seen += c
            if seen >= rank:
                return min(LOWEST_S * BUCKET_GROWTH**i, self.max_s)
        return self.max_s

    def mean_s(self) -> float:
        return self.sum_s / self.total if self.total else 0.0

    def summary_ms(self) -> dict[str, float]:
        return {
            "p50": round(self.percentile_s(0.50) * 1000, 3),
            "p99": round(self.percentile_s(0.99) * 1000, 3),
            "p999": round(self.percentile_s(0.999) * 1000, 3),
            "max": round(self.max_s * 1000, 3),
            "mean": round(self.mean_s() * 1000, 3),
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "buckets": {str(i): c for i, c in enumerate(self.counts) if c},
            "sum_s": self.sum_s,
            "max_s": self.max_s,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Histogram:
        h = cls()
        for i, c in data["buckets"].items():
            h.counts[int(i)] = int(c)
        h.total = sum(h.counts)
        h.sum_s, h.max_s = float(data["sum_s"]), float(data["max_s"])
        return h


class Meter:
    def __init__(self, name: str, payload_bytes: int = 0) -> None:
        self.name = name
        self.payload_bytes = payload_bytes  # bytes per message, for MiB/s
        # Never reset (the progress line's counters): messages and errors since the start.
        self.seen_messages = 0
        self.seen_errors = 0
        # Incremented by every reset: work that started before a reset (the warm-up) is not counted after it.
        self.epoch = -1
        self.reset()

    def reset(self) -> None:
        self.epoch += 1
        self.messages = 0
        self.calls = 0
        self.empty_calls = 0
        self.unsent = 0  # on a schedule: messages due before the deadline but never sent
        self.errors: dict[str, int] = {}
        self.latency = Histogram()
        self.interval = Histogram()  # since the last progress line

    def record(self, latency_s: float, messages: int) -> None:
        self.calls += 1
        self.messages += messages
        self.seen_messages += messages
        if not messages:
            self.empty_calls += 1
        self.latency.record(latency_s)
        self.interval.record(latency_s)

    def error(self, code: str, count: int = 1) -> None:
        if code not in self.errors and len(self.errors) >= ERROR_KINDS_MAX:
            code = "OTHER"
        self.errors[code] = self.errors.get(code, 0) + count
        self.seen_errors += count

    @property
    def error_total(self) -> int:
        return sum(self.errors.values())

    def summary(self, elapsed_s: float) -> dict[str, Any]:
        per_s = 1 / elapsed_s if elapsed_s > 0 else 0.0
        return {
            "messages": self.messages,
            "messages_per_s": round(self.messages * per_s, 1),
            "mib_per_s": round(self.messages * self.payload_bytes * per_s / (1 << 20), 2),
            "calls": self.calls,
            "calls_per_s": round(self.calls * per_s, 1),
            "empty_calls": self.empty_calls,
            "unsent": self.unsent,
            "latency_ms": self.latency.summary_ms(),
            "errors": dict(sorted(self.errors.items())),
            "error_total": self.error_total,
            "histogram": self.latency.to_json(),
        }


async def progress(meters: Sequence[Meter], started_s: float, done: asyncio.Event, out: TextIO = sys.stderr) -> None:
    """Print one line per second until `done` is set: per meter the rate, errors and p99 of the last second."""
    last = {m.name: (m.seen_messages, m.seen_errors) for m in meters}
    tick = time.monotonic()
    while not done.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), PROGRESS_INTERVAL_S)
        now = time.monotonic()
        span, tick = now - tick, now
        if span < PROGRESS_INTERVAL_S / 2:
            return  # the run ended just after a line: the table follows
        parts = []
        for m in meters:
            msgs, errs = last[m.name]
            d_msgs, d_errs = m.seen_messages - msgs, m.seen_errors - errs
            last[m.name] = (m.seen_messages, m.seen_errors)
            p99_ms = m.interval.percentile_s(0.99) * 1000
            m.interval = Histogram()
            parts.append(f"{m.name} {d_msgs / span:>9,.0f} msg/s  p99 {p99_ms:7.2f} ms  err {d_errs}")
        print(f"[{now - started_s:5.1f}s] " + " | ".join(parts), file=out, flush=True)
