"""The recall handle of a DELAY message's send receipt: which broker holds the pending timer and
where. Opaque to clients and self-describing to Sluice, like receipt handles:

    <broker name> "~" base64url(format u8 = 1, due_ms u64, position u64, topic_crc u32)

The proxy reads the broker name to route a RecallMessage; the broker's timer service the rest.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from broker.client.handles import unwrap, wrap
from common.errors import BadRequest

_HANDLE = struct.Struct("<BQQI")
_HANDLE_FORMAT = 1


@dataclass(frozen=True, slots=True)
class RecallHandle:
    broker: str
    due_ms: int
    position: int
    topic_crc: int

    def encode(self) -> str:
        raw = _HANDLE.pack(_HANDLE_FORMAT, self.due_ms, self.position, self.topic_crc)
        return wrap(self.broker, raw)


def decode_recall_handle(text: str) -> RecallHandle:
    """Parse a recall handle; anything malformed is BadRequest with a readable message."""
    broker, (fmt, due, pos, crc) = unwrap(
        text, _HANDLE, what="recall handle", error=BadRequest,
        hint="; use the recall handle from the DELAY message's send receipt",
    )  # fmt: skip
    if fmt != _HANDLE_FORMAT:
        raise BadRequest(f"recall handle has unknown format {fmt}")
    return RecallHandle(broker, due, pos, crc)


def broker_of_recall_handle(text: str) -> str:
    return decode_recall_handle(text).broker
