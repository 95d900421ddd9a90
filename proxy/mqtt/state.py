"""The MQTT gateway's durable state in the home broker's store (broker/mqtt_store.py; docs/mqtt.md,
"Durable state"): its keys, its records, and the calls that read and write them.

| key | value |
|---|---|
| `s` namespace NUL client id | the session record (JSON, below) |
| `i` namespace NUL client id NUL packet id u16 | inbound QoS 2: the message id stored, until PUBREL |
| `o` namespace NUL client id NUL packet id u16 | outbound QoS 2: `p` / `r` (PUBLISH / PUBREL sent), message id |
| `r` namespace NUL topic | a retained message: its record (common/record.py `outgoing`) |
| `d` namespace NUL client id NUL packet id u16 | a retained delivery in flight (below) |
| `k` proxy id NUL namespace NUL client id | that proxy is to close the client's connection (a takeover) |
| `w` proxy id NUL namespace NUL client id | (empty): the session is connected through that proxy (`owner`) |
| `x` due ms u64 namespace NUL client id | (empty): the disconnected session expires then (index of `gone_ms` + `exp`) |
| `h` proxy id | that proxy's last janitor round, ms u64: a proxy silent for three rounds died |

MQTT strings hold no NUL, so NUL separates the parts. The session record: `v` protocol level,
`exp` session expiry interval (s), `subs` {filter as written: [qos, no local, retain as published,
retain handling, subscription identifier]}, `reg` [[bind topic, group, lite filter], ...] (what the
brokers hold for it), `owner` the proxy of its connection ("" when none), `epoch` (raised by each
connection), `gone_ms` when its connection ended, `will` (its will while connected, to publish if
its proxy dies). A retained delivery in flight is a retained message sent on SUBSCRIBE at QoS 1 or
2 to a persistent session, until the client completed it: QoS u8, `p` / `r` (PUBLISH / PUBREL
sent), subscription identifier u32 (0: none), then its record.

Every write of a session record writes its index entries (`w`, `x`) in the same atomic write
(`record_write`), so the janitors' work follows what expires and which proxies died, never the
number of sessions (proxy/mqtt/janitor.py).

The home broker is the first broker by name (as for the AMQP metadata); proxy/mqtt/statestore.py
makes the calls. This module is the pure codec (`sluice admin mqtt` reads it too).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from typing import Any

SEP = b"\x00"
_PID = struct.Struct(">H")
SESSION, INBOUND, OUTBOUND, RETAINED, KICK, RETAINED_OUT = b"s", b"i", b"o", b"r", b"k", b"d"
OWNED, EXPIRES, HEARTBEAT = b"w", b"x", b"h"
NEVER = 0xFFFFFFFF  # a session expiry interval that never ends
_U64 = struct.Struct(">Q")
PUBLISHED, RELEASED = "p", "r"
_RETAINED_OUT = struct.Struct(">B1sI")  # QoS, state, subscription identifier; then the record


def session_key(namespace: str, client_id: str) -> bytes:
    return SESSION + namespace.encode() + SEP + client_id.encode()


def qos2_prefix(kind: bytes, namespace: str, client_id: str) -> bytes:
    return kind + namespace.encode() + SEP + client_id.encode() + SEP


def qos2_key(kind: bytes, namespace: str, client_id: str, packet_id: int) -> bytes:
    return qos2_prefix(kind, namespace, client_id) + _PID.pack(packet_id)


def packet_id_of(key: bytes) -> int:
    return int(_PID.unpack_from(key, len(key) - 2)[0])


def retained_key(namespace: str, topic: str) -> bytes:
    return RETAINED + namespace.encode() + SEP + topic.encode()


def retained_prefix(namespace: str, topic_prefix: str = "") -> bytes:
    return RETAINED + namespace.encode() + SEP + topic_prefix.encode()


def topic_of_retained(key: bytes, namespace: str) -> str:
    return key[len(RETAINED) + len(namespace.encode()) + 1 :].decode()


def kick_prefix(proxy: str) -> bytes:
    return KICK + proxy.encode() + SEP


def kick_key(proxy: str, namespace: str, client_id: str) -> bytes:
    return kick_prefix(proxy) + namespace.encode() + SEP + client_id.encode()


def parse_kick(key: bytes, proxy: str) -> tuple[str, str]:
    namespace, _, client_id = key[len(kick_prefix(proxy)) :].partition(SEP)
    return namespace.decode(), client_id.decode()


def owned_prefix(proxy: str) -> bytes:
    return OWNED + proxy.encode() + SEP


def owned_key(proxy: str, namespace: str, client_id: str) -> bytes:
    return owned_prefix(proxy) + namespace.encode() + SEP + client_id.encode()


def parse_owned(key: bytes, proxy: str) -> tuple[str, str]:
    namespace, _, client_id = key[len(owned_prefix(proxy)) :].partition(SEP)
    return namespace.decode(), client_id.decode()


def expiry_key(due_ms: int, namespace: str, client_id: str) -> bytes:
    return EXPIRES + _U64.pack(max(0, due_ms)) + namespace.encode() + SEP + client_id.encode()


def parse_expiry(key: bytes) -> tuple[int, str, str]:
    """(due ms, namespace, client id) of an `x` key."""
    (due,) = _U64.unpack_from(key, len(EXPIRES))
    namespace, _, client_id = key[len(EXPIRES) + _U64.size :].partition(SEP)
    return due, namespace.decode(), client_id.decode()


def heartbeat_key(proxy: str) -> bytes:
    return HEARTBEAT + proxy.encode()


def heartbeat_value(now_ms: int) -> bytes:
    return _U64.pack(now_ms)


def parse_heartbeat(key: bytes, value: bytes) -> tuple[str, int]:
    return key[len(HEARTBEAT) :].decode(), _U64.unpack(value)[0]


def parse_session_key(key: bytes) -> tuple[str, str]:
    namespace, _, client_id = key[len(SESSION) :].partition(SEP)
    return namespace.decode(), client_id.decode()


@dataclass
class SessionRecord:
    version: int
    expiry_s: int
    subs: dict[str, list[int]] = field(default_factory=dict)  # filter -> [qos, nl, rap, rh, sub id]
    reg: list[list[str]] = field(default_factory=list)  # [bind topic, group, lite filter]
    owner: str = ""
    epoch: int = 0
    gone_ms: int = 0
    will: dict[str, Any] | None = None

    def encode(self) -> bytes:
        doc = {"v": self.version, "exp": self.expiry_s, "subs": self.subs, "reg": self.reg, "owner": self.owner,
               "epoch": self.epoch, "gone_ms": self.gone_ms, "will": self.will}  # fmt: skip
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, raw: bytes) -> SessionRecord:
        doc = json.loads(raw)
        return cls(int(doc["v"]), int(doc["exp"]), {k: list(v) for k, v in doc["subs"].items()},
                   [list(r) for r in doc["reg"]], str(doc["owner"]), int(doc["epoch"]), int(doc["gone_ms"]),
                   doc.get("will"))  # fmt: skip


def outbound_value(state: str, message_id: str) -> bytes:
    return f"{state}{message_id}".encode()


def parse_outbound(raw: bytes) -> tuple[str, str]:
    text = raw.decode()
    return text[:1], text[1:]


@dataclass(frozen=True, slots=True)
class RetainedOut:
    """A retained message sent on SUBSCRIBE and not yet completed by the client (`d` keys)."""

    qos: int
    state: str  # PUBLISHED or RELEASED
    identifier: int  # the subscription's identifier (0: none)
    record: bytes

    def encode(self) -> bytes:
        return _RETAINED_OUT.pack(self.qos, self.state.encode(), self.identifier) + self.record

    @classmethod
    def decode(cls, raw: bytes) -> RetainedOut:
        qos, kind, identifier = _RETAINED_OUT.unpack_from(raw)
        return cls(qos, kind.decode(), identifier, raw[_RETAINED_OUT.size :])


def index_keys(namespace: str, client_id: str, rec: SessionRecord | None) -> set[bytes]:
    """The index entries of a session record: its owner's while connected, its expiry's while not."""
    if rec is None:
        return set()
    if rec.owner:
        return {owned_key(rec.owner, namespace, client_id)}
    if rec.expiry_s == NEVER:
        return set()
    return {expiry_key(rec.gone_ms + rec.expiry_s * 1000, namespace, client_id)}


def record_write(
    namespace: str, client_id: str, before: set[bytes], after: SessionRecord | None
) -> tuple[list[tuple[bytes, bytes]], list[bytes]]:
    """(puts, deletes) that store `after` as the session's record (None: remove it) with its index
    entries, the record's earlier entries being `before` (`index_keys` of what was stored)."""
    key = session_key(namespace, client_id)
    new = index_keys(namespace, client_id, after)
    puts = [(k, b"") for k in sorted(new - before)]
    deletes = sorted(before - new)
    if after is None:
        deletes.append(key)
    else:
        puts.append((key, after.encode()))
    return puts, deletes
