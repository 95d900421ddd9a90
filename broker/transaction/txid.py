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

import base64
import binascii
import struct
from dataclasses import dataclass

from common.errors import InvalidTransactionId

_FORMAT = 1
_PAYLOAD = struct.Struct("<BQI")
SEPARATOR = "~"
_MARK = "t"
MAX_TXID_CHARS = 512


@dataclass(frozen=True, slots=True)
class TransactionId:
    broker: str
    physical_offset: int
    size: int

    def encode(self) -> str:
        payload = _PAYLOAD.pack(_FORMAT, self.physical_offset, self.size)
        return f"{self.broker}{SEPARATOR}{_MARK}{base64.urlsafe_b64encode(payload).decode('ascii').rstrip('=')}"


def decode(text: str) -> TransactionId:
    """Parse a transaction id; anything malformed is InvalidTransactionId, never another error."""
    if not text:
        raise InvalidTransactionId("transaction id is empty: send the transaction id of the send receipt")
    if len(text) > MAX_TXID_CHARS:
        raise InvalidTransactionId("transaction id is too long to be one issued by Sluice")
    broker, sep, rest = text.rpartition(SEPARATOR)
    if not sep or not broker or not rest.startswith(_MARK):
        raise InvalidTransactionId(f"transaction id {text[:64]!r} was not issued by Sluice (malformed)")
    b64 = rest[len(_MARK) :]
    try:
        raw = base64.urlsafe_b64decode(b64 + "=" * (-len(b64) % 4))
        fmt, position, size = _PAYLOAD.unpack(raw)
    except (binascii.Error, ValueError, struct.error):
        raise InvalidTransactionId(f"transaction id {text[:64]!r} was not issued by Sluice (malformed)") from None
    if fmt != _FORMAT:
        raise InvalidTransactionId(f"transaction id has unknown format {fmt}")
    return TransactionId(broker, position, size)


def broker_of(text: str) -> str:
    """The broker that holds the transaction's half message (for routing an EndTransaction)."""
    return decode(text).broker
