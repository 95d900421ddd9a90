"""Moments as people type them on a command line: `now`, or `now-` a duration (`now-90s`,
`now-30m`, `now-2h`, `now-7d`), so that examples stay true whenever they are run.

`relative_ms` answers None for anything else: each caller parses its own absolute forms (epoch
milliseconds, ISO-8601) and names its own flag in its error.
"""

from __future__ import annotations

import re
import time

RELATIVE_FORMS = "now, now-90s, now-30m, now-2h, now-7d"
_RELATIVE = re.compile(r"now(?:-(\d+)([smhd]))?")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def relative_ms(text: str, now_ms: int | None = None) -> int | None:
    """Epoch milliseconds of `now` or `now-N<s|m|h|d>` (case and spaces ignored); None otherwise."""
    match = _RELATIVE.fullmatch(text.strip().lower().replace(" ", ""))
    if match is None:
        return None
    now = int(time.time() * 1000) if now_ms is None else now_ms
    if match.group(1) is None:
        return now
    return now - int(match.group(1)) * _UNIT_S[match.group(2)] * 1000
