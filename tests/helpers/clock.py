"""`JumpClock`: a `common.clock.Clock` a test moves ahead instead of sleeping."""

from __future__ import annotations

import time


class JumpClock:
    """The system's clocks plus every `advance` the test made: time still passes on its own (the
    broker's background work and the waits the test does not convert keep their meaning), and a
    test that needs "after the invisible duration" jumps there instead of sleeping."""

    def __init__(self) -> None:
        self._ahead_s = 0.0

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000 + round(self._ahead_s * 1000)

    def monotonic(self) -> float:
        return time.monotonic() + self._ahead_s

    def advance(self, seconds: float) -> None:
        assert seconds >= 0, "a clock does not go back"
        self._ahead_s += seconds
