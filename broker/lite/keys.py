"""RocksDB key layouts of lite topics (big-endian numbers, so byte order = numeric order).

A lite topic is one queue of its bind topic: queue id `LITE_QUEUE_BASE + n`, n allocated once per
bind topic and never reused (the ConsumeQueue and the CommitLog's per-segment queue maxima of an
expired lite topic may outlive it until retention drops its segments). So its messages, offsets,
pop state, receipt handles, retries and trace are the store's and the pop engine's as they are.

| column family | key | value |
|---|---|---|
| `lite_name` | topic_id u32, lite name | queue_id u32, created_ms u64, last_write_ms u64 |
| `lite_exp` | expires_ms u64, topic_id u32, lite name | empty: the expiry index, due first |
| `lite_meta` | topic_id u32 | next lite number u32, live lite topics u32 |
| `lite_sub` | u16 size + group, topic_id u32, u16 size + client id, lite name | empty |
| `lite_subr` | topic_id u32, u16 size + lite name, u16 size + group, u16 size + client id | empty |
| `lite_filt` | u16 size + group, topic_id u32, u16 size + client id, filter | empty |

A lite topic is two rows: its record, found by name (every send and subscription), and its expiry
key, which names it, so the sweep needs no row from queue id back to name. `lite_sub` holds each
client's set (prefix scan per client); `lite_subr` answers "who subscribes to this lite topic" when
it expires (prefix scan per lite topic); both exist only for subscribed lite topics. `lite_filt`
holds filter subscriptions (`a/+/c`, common/litefilter.py): every broker loads them all at start
into a trie per bind topic; a lite topic a filter matches is subscribed (`lite_sub`, `lite_subr`)
when a message is first stored in it after the filter was added.
"""

from __future__ import annotations

import struct

CF_LITE_NAME = "lite_name"
CF_LITE_EXP = "lite_exp"
CF_LITE_META = "lite_meta"
CF_LITE_SUB = "lite_sub"
CF_LITE_SUBR = "lite_subr"
CF_LITE_FILT = "lite_filt"
LITE_CFS = (CF_LITE_NAME, CF_LITE_EXP, CF_LITE_META, CF_LITE_SUB, CF_LITE_SUBR, CF_LITE_FILT)
# The first layout (before two rows per lite topic) had a `lite_id` column family, topic_id u32 +
# queue_id u32 -> lite name, and expiry keys expires_ms u64 + topic_id u32 + queue_id u32. A store
# that still has it is migrated on open (`LiteState.migrate_v1`).
CF_LITE_ID_V1 = "lite_id"
ID_V1 = struct.Struct(">II")
EXP_V1 = struct.Struct(">QII")

LITE_QUEUE_BASE = 1 << 16  # queue ids of lite topics start here (the route's queues stay below)
MAX_LITE_QUEUE = (1 << 31) - 1  # queue ids travel as int32

U16 = struct.Struct(">H")
U32 = struct.Struct(">I")
EXP_HEAD = struct.Struct(">QI")  # expires_ms, topic_id: an expiry key without the name
RECORD = struct.Struct(">IQQ")
META = struct.Struct(">II")


def name_key(topic_id: int, name: str) -> bytes:
    return U32.pack(topic_id) + name.encode()


def exp_key(expires_ms: int, topic_id: int, name: str) -> bytes:
    return EXP_HEAD.pack(expires_ms, topic_id) + name.encode()


def parse_exp_key(key: bytes) -> tuple[int, int, str]:
    """(expires_ms, topic_id, lite name) of a `lite_exp` key."""
    expires, tid = EXP_HEAD.unpack_from(key)
    return expires, tid, key[EXP_HEAD.size :].decode()


def _text(value: str) -> bytes:
    raw = value.encode()
    return U16.pack(len(raw)) + raw


def client_prefix(group: str, topic_id: int, client_id: str) -> bytes:
    return _text(group) + U32.pack(topic_id) + _text(client_id)


def group_prefix(group: str, topic_id: int) -> bytes:
    return _text(group) + U32.pack(topic_id)


def sub_key(group: str, topic_id: int, client_id: str, name: str) -> bytes:
    return client_prefix(group, topic_id, client_id) + name.encode()


def parse_filt_key(key: bytes) -> tuple[str, int, str, str]:
    """(group, topic_id, client id, filter) of a `lite_filt` key (same layout as a `lite_sub` key)."""
    (n,) = U16.unpack_from(key, 0)
    group = key[2 : 2 + n].decode()
    (tid,) = U32.unpack_from(key, 2 + n)
    pos = 6 + n
    (m,) = U16.unpack_from(key, pos)
    return group, tid, key[pos + 2 : pos + 2 + m].decode(), key[pos + 2 + m :].decode()


def subr_prefix(topic_id: int, name: str) -> bytes:
    return U32.pack(topic_id) + _text(name)


def subr_key(topic_id: int, name: str, group: str, client_id: str) -> bytes:
    return subr_prefix(topic_id, name) + _text(group) + _text(client_id)


def parse_subr_tail(key: bytes, prefix_len: int) -> tuple[str, str]:
    """(group, client id) of a `lite_subr` key whose prefix is `prefix_len` bytes."""
    pos = prefix_len
    (n,) = U16.unpack_from(key, pos)
    group = key[pos + 2 : pos + 2 + n].decode()
    pos += 2 + n
    (m,) = U16.unpack_from(key, pos)
    return group, key[pos + 2 : pos + 2 + m].decode()


def parse_group_client(key: bytes, group_prefix_len: int) -> tuple[str, str]:
    """(client id, lite name) of a `lite_sub` key below a group prefix of `group_prefix_len` bytes."""
    (n,) = U16.unpack_from(key, group_prefix_len)
    start = group_prefix_len + 2
    return key[start : start + n].decode(), key[start + n :].decode()


def next_prefix(prefix: bytes) -> bytes:
    """The smallest key greater than every key starting with `prefix` (prefix is never all 0xff here)."""
    raw = bytearray(prefix)
    while raw and raw[-1] == 0xFF:
        raw.pop()
    raw[-1] += 1
    return bytes(raw)
