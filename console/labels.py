"""Column headings as an operator reads them, from the admin reports' column keys.

The admin functions name their columns for scripts (`last_heartbeat_s`, `rate_in_per_s`); a page
shows `Last heartbeat (s ago)` and `In (msg/s)`. Keys with a wording of their own are in `LABELS`;
any other key reads as its words in sentence case with its unit suffix in brackets (`lag_s` ->
`Lag (s)`), so a new column never shows a bare unit as a word. Which columns may wrap (free text)
is decided here too: every other cell stays on one line (identifiers, sizes and times must not
break).
"""

from __future__ import annotations

LABELS = {
    "last_heartbeat_s": "Last heartbeat (s ago)",
    "last_seen_s": "Last seen (s ago)",
    "rate_in_per_s": "In (msg/s)",
    "rate_out_per_s": "Out (msg/s)",
    "lag_messages": "Not yet tiered (messages)",
    "lag_s": "Oldest not tiered (s)",
    "written": "Written (all time)",
    "retained": "Retained",
    "stored": "Stored at",
    "on_disk": "On local disk",
    "in_s3": "In S3",
    "s3_size": "Size in S3",
    "store": "Store size",
    "store_lag": "Unflushed",
    "dispatch_lag": "Not yet indexed",
    "disk_used": "Disk used",
    "disk_free": "Disk free",
    "client_id": "Client ID",
    "message_id": "Message ID",
    "new_message_id": "New message ID",
    "max_offset": "Max offset",
    "min_offset": "Min offset",
    "consumed_offset": "Consumed offset",
    "half_messages": "Half messages (transactions)",
    "in_flight": "In flight",
    "lite_topics": "Lite topics",
    "dead_letters": "Dead letters",
    "max_attempts": "Max attempts",
    "messages_per_s": "Messages (/s)",
    "bytes_per_s": "Bytes (/s)",
    "bytes": "Bytes",
    "fifo": "FIFO",
    "origin_queue": "Queue",
    "origin_offset": "Offset",
    "local": "On local disk",
    "tiered": "In S3",
}

# Unit suffixes of column keys (common/config.py: units last in names), longest first.
_UNITS = (("_per_s", "/s"), ("_bytes", "bytes"), ("_pct", "%"), ("_ms", "ms"), ("_s", "s"))

# Free text: these columns may wrap; all others stay on one line.
PROSE = frozenset({"error", "body", "detail", "tiering", "topics", "rules", "note", "endpoints", "resource",
                   "arguments"})  # fmt: skip


def heading(key: str) -> str:
    """`last_heartbeat_s` -> "Last heartbeat (s ago)"; `lag_after` -> "Lag after"; `bytes_per_s` -> "Bytes (/s)"."""
    if key in LABELS:
        return LABELS[key]
    unit = ""
    for suffix, name in _UNITS:
        if key.endswith(suffix) and len(key) > len(suffix):
            key, unit = key[: -len(suffix)], f" ({name})"
            break
    words = key.replace("_", " ").strip()
    return words[:1].upper() + words[1:] + unit


def cell_class(key: str) -> str:
    """The CSS class of a column's cells: "prose" may wrap, "nowrap" (the rest) may not."""
    return "prose" if key in PROSE else "nowrap"
