"""What `sluice bench` prints at the end: a table (one row per meter) or the result as JSON.

Meters: `send` / `echo` (SendMessage calls; latency per call), `receive` (ReceiveMessage calls,
including long polls that returned nothing: `empty`), `ack` (AckMessage calls; latency from the
end of the receive), `e2e` (one sample per message of this run: receive time minus born time).
Rates are per second of measured time (after the warm-up).
"""

from __future__ import annotations

import json
from typing import Any

COLUMNS = ("meter", "msg/s", "MiB/s", "calls/s", "p50 ms", "p99 ms", "p999 ms", "max ms", "empty", "errors")
_GAP = "  "


def render_json(result: dict[str, Any], *, histograms: bool = False) -> str:
    """The result as JSON; the raw histograms (for merging runs) only when asked."""
    if not histograms:
        result = {**result, "meters": {n: {k: v for k, v in m.items() if k != "histogram"}
                                       for n, m in result["meters"].items()}}  # fmt: skip
    return json.dumps(result, indent=2)


def render_table(result: dict[str, Any]) -> str:
    opts = result["options"]
    rate = "max rate" if opts["rate_per_s"] is None else f"rate {opts['rate_per_s']:,.0f} msg/s"
    title = (
        f"sluice bench {result['mode']}: {';'.join(opts['endpoints'])}, "
        + ("" if result["mode"] == "echo" else f"topic {opts['topic']}, ")
        + f"{opts['size_bytes']}-byte bodies, batch {opts['batch']}, concurrency {opts['concurrency']}, {rate}, "
        f"{result['measured_s']:.1f} s measured after {opts['warmup_s']:g} s warm-up"
        + (" (stopped early)" if result["stopped_early"] else "")
    )
    rows = [_row(name, m) for name, m in result["meters"].items()]
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(COLUMNS)]
    lines = [title, "", _line(COLUMNS, widths), *(_line(r, widths) for r in rows)]
    if result.get("generator"):
        lines.append(f"generator: {result['generator']}")
    cpu = result.get("cpu")
    if cpu:
        watched = ""
        if opts.get("watch_pids"):
            watched = (
                f", watched processes {cpu['watched_cores']:.2f} cores ({cpu['watched_us_per_message']:,.0f} µs/msg)"
            )
        lines.append(
            f"CPU while measuring: generator {cpu['generator_cores']:.2f} cores "
            f"({cpu['generator_us_per_message']:,.0f} µs/msg){watched}, everything else {cpu['other_cores']:.2f} cores"
        )
    for name, m in result["meters"].items():
        if m.get("unsent"):
            lines.append(f"{name}: {m['unsent']:,} scheduled messages not sent: the server did not keep the rate")
        if m["errors"]:
            lines.append(f"errors of {name}: " + ", ".join(f"{code} x{n}" for code, n in m["errors"].items()))
    return "\n".join(lines)


def _row(name: str, m: dict[str, Any]) -> tuple[str, ...]:
    lat = m["latency_ms"]
    return (
        name,
        f"{m['messages_per_s']:,.0f}",
        f"{m['mib_per_s']:,.2f}",
        f"{m['calls_per_s']:,.0f}",
        f"{lat['p50']:.2f}",
        f"{lat['p99']:.2f}",
        f"{lat['p999']:.2f}",
        f"{lat['max']:.2f}",
        str(m["empty_calls"]),
        str(m["error_total"]),
    )


def _line(cells: tuple[str, ...], widths: list[int]) -> str:
    first = cells[0].ljust(widths[0])
    return _GAP.join([first, *(c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True))]).rstrip()
