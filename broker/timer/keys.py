"""RocksDB layouts of the timer index. Pure functions, no I/O. (The recall handle a DELAY message's
send receipt carries is in broker/client/recall.py: the proxy decodes it too.)

Column families (keys big-endian so byte order is numeric order, values little-endian):

- `timer`: due_ms u64, position u64 -> size u32, u16 len + target topic
  One key per pending timer. `due_ms` is the delivery time rounded UP to the configured precision
  (never early); `position` is the CommitLog position of the stored message (unique, so it is the
  sequence that orders timers due at the same instant).
- `timer_pos`: position u64 -> due_ms u64
  The same timers by CommitLog position: the smallest is the oldest byte retention must keep.
- `timer_state`: b"n:" + topic -> pending count u64; b"inflight" -> the `timer` key of the last
  entry of the delivery batch being appended (present only while a batch is in flight).
"""

from __future__ import annotations

import struct

from broker.client.handles import name_crc

CF_TIMER = "timer"
CF_TIMER_POS = "timer_pos"
CF_TIMER_STATE = "timer_state"
TIMER_CFS = (CF_TIMER, CF_TIMER_POS, CF_TIMER_STATE)

# The internal topic the CommitLog keeps pending timer messages under (one queue).
TIMER_TOPIC = "%SYS_TIMER"

STATE_INFLIGHT = b"inflight"
STATE_COUNT_PREFIX = b"n:"

_KEY = struct.Struct(">QQ")
_U64BE = struct.Struct(">Q")
_U64 = struct.Struct("<Q")
_VALUE = struct.Struct("<IH")
MAX_KEY = _KEY.pack((1 << 64) - 1, (1 << 64) - 1)


def timer_key(due_ms: int, position: int) -> bytes:
    return _KEY.pack(due_ms, position)


def parse_timer_key(key: bytes) -> tuple[int, int]:
    due, pos = _KEY.unpack(key)
    return int(due), int(pos)


def timer_value(size: int, topic: str) -> bytes:
    t = topic.encode("utf-8")
    return _VALUE.pack(size, len(t)) + t


def parse_timer_value(raw: bytes) -> tuple[int, str]:
    size, n = _VALUE.unpack_from(raw)
    return int(size), raw[_VALUE.size : _VALUE.size + n].decode("utf-8")


def pos_key(position: int) -> bytes:
    return _U64BE.pack(position)


def parse_pos_key(key: bytes) -> int:
    return int(_U64BE.unpack(key)[0])


def u64(value: int) -> bytes:
    return _U64.pack(value)


def parse_u64(raw: bytes) -> int:
    return int(_U64.unpack(raw)[0])


def count_key(topic: str) -> bytes:
    return STATE_COUNT_PREFIX + topic.encode("utf-8")


def round_up(ms: int, precision_ms: int) -> int:
    """`ms` rounded up to a multiple of `precision_ms`: a timer fires at the end of its tick, never early."""
    return -(-ms // precision_ms) * precision_ms


def topic_crc(topic: str) -> int:
    return name_crc(topic)
