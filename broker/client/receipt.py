"""Receipt handles: opaque to clients, self-describing to Sluice.

    <broker name> "~" base64url(payload)

payload (little-endian): format u8 (=1), queue_id u32, queue_offset u64, handle_version u32,
invisible_until_ms u64, topic_crc u32, group_crc u32.

Any proxy routes an ack by the broker name alone, with no lookup. The broker checks the rest
against its pop state: the version changes on every delivery and every invisible-duration change,
so a superseded handle is rejected (INVALID_RECEIPT_HANDLE), as is a handle presented with another
topic or group than the one it was issued for.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from broker.client.handles import broker_name, fast_unwrap, name_crc, unwrap, wrap
from common.errors import InvalidReceiptHandle

_FORMAT = 1
_PAYLOAD = struct.Struct("<BIQIQII")
_B64_CHARS = (_PAYLOAD.size * 4 + 2) // 3  # unpadded base64 of the payload


@dataclass(frozen=True, slots=True)
class ReceiptHandle:
    broker: str
    queue_id: int
    queue_offset: int
    version: int
    invisible_until_ms: int
    topic_crc: int
    group_crc: int

    def encode(self) -> str:
        return encode(self.broker, self.queue_id, self.queue_offset, self.version, self.invisible_until_ms,
                      self.topic_crc, self.group_crc)  # fmt: skip

    def check(self, topic: str, group: str) -> None:
        check_names(self.topic_crc, self.group_crc, topic, group)


def encode(
    broker: str, queue_id: int, queue_offset: int, version: int, invisible_until_ms: int, topic_crc: int,
    group_crc: int,
) -> str:  # fmt: skip
    """`ReceiptHandle(...).encode()` without building the object (once per delivered message)."""
    payload = _PAYLOAD.pack(_FORMAT, queue_id, queue_offset, version, invisible_until_ms, topic_crc, group_crc)
    return wrap(broker, payload)


def fields(text: str) -> tuple[str, int, int, int, int, int, int]:
    """(broker, queue_id, queue_offset, version, invisible_until_ms, topic_crc, group_crc) of a handle,
    checked as `decode` checks it, without building a `ReceiptHandle` (once per acknowledged message)."""
    found = fast_unwrap(text, _PAYLOAD, _B64_CHARS)
    if found is None:  # malformed (unwrap says how), or a well-formed handle fast_unwrap does not take
        found = unwrap(text, _PAYLOAD, what="receipt handle", error=InvalidReceiptHandle)
    broker, (fmt, qid, qoff, version, until, tcrc, gcrc) = found
    if fmt != _FORMAT:
        raise InvalidReceiptHandle(f"receipt handle has unknown format {fmt}")
    return broker, qid, qoff, version, until, tcrc, gcrc


def decode(text: str) -> ReceiptHandle:
    """Parse a handle; anything malformed is InvalidReceiptHandle, never another error."""
    return ReceiptHandle(*fields(text))


def check_names(topic_crc: int, group_crc: int, topic: str, group: str) -> None:
    """`ReceiptHandle.check` on the fields of a handle (the CRCs of `topic` and `group` are cached)."""
    if topic_crc != name_crc(topic):
        raise InvalidReceiptHandle(f"receipt handle was not issued for topic {topic}")
    if group_crc != name_crc(group):
        raise InvalidReceiptHandle(f"receipt handle was not issued for consumer group {group}")


def broker_of(text: str) -> str:
    """The broker a handle belongs to (for routing an ack), read from the envelope only.

    Much cheaper than `decode` on the ack path, where every handle is decoded again by the broker
    that resolves it: that broker answers a handle with a malformed payload INVALID_RECEIPT_HANDLE.
    """
    return broker_name(text, what="receipt handle", error=InvalidReceiptHandle)
