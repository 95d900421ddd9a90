"""Transaction ids: opaque to clients, self-describing to Sluice (like receipt handles).

    <broker name> "~" "t" base64url(payload)

payload (little-endian): format u8 (=1), physical_offset u64 (the half message's CommitLog
position), size u32 (its record size).

Any proxy routes an EndTransaction by the broker name alone. The position is unique within one
broker's CommitLog, so it is also the key of the half message's pending entry; the size lets the
broker read the half message without an index lookup. The "t" keeps transaction ids and receipt
handles apart.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from broker.client.handles import unwrap, wrap
from common.errors import InvalidTransactionId

_FORMAT = 1
_PAYLOAD = struct.Struct("<BQI")
_MARK = "t"


@dataclass(frozen=True, slots=True)
class TransactionId:
    broker: str
    physical_offset: int
    size: int

    def encode(self) -> str:
        payload = _PAYLOAD.pack(_FORMAT, self.physical_offset, self.size)
        return wrap(self.broker, payload, _MARK)


def decode(text: str) -> TransactionId:
    """Parse a transaction id; anything malformed is InvalidTransactionId, never another error."""
    broker, (fmt, position, size) = unwrap(
        text, _PAYLOAD, what="transaction id", error=InvalidTransactionId, mark=_MARK,
        hint=": send the transaction id of the send receipt",
    )  # fmt: skip
    if fmt != _FORMAT:
        raise InvalidTransactionId(f"transaction id has unknown format {fmt}")
    return TransactionId(broker, position, size)


def broker_of(text: str) -> str:
    """The broker that holds the transaction's half message (for routing an EndTransaction)."""
    return decode(text).broker
