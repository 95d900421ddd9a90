"""Which stored copy a delivery is, read from its receipt handle, for the history checker.

The official Python client keeps a delivered message's receipt handle but drops its queue and
offset; a history needs them to tell a second stored copy of a send (a resend) from a redelivery of
the same copy. A receipt handle is self-describing (docs/proxy.md; broker/client/receipt.py):
`<broker>~` then, in unpadded URL-safe base64, the little-endian payload format u8 (1), queue id
u32, queue offset u64, handle version u32, then fields this reader leaves alone. Read here, not with the broker's
codec: this process runs the official client and imports nothing of Sluice's packages
(tests/e2e/conftest.py); tests/unit/test_e2e_handles.py holds the two readings equal.
"""

from __future__ import annotations

import base64
import struct
from typing import NamedTuple

_SEPARATOR = "~"
_HEAD = struct.Struct("<BIQI")  # format, queue id, queue offset, handle version
_FORMAT = 1


class Handle(NamedTuple):
    broker: str
    queue_id: int
    queue_offset: int
    version: int  # changes with every delivery of the copy and every invisible-duration change


def fields(receipt_handle: str) -> Handle:
    """What a receipt handle says of the delivery it was issued for; ValueError for anything else."""
    broker, _, b64 = receipt_handle.rpartition(_SEPARATOR)
    raw = base64.urlsafe_b64decode(b64 + "=" * (-len(b64) % 4))
    fmt, queue_id, queue_offset, version = _HEAD.unpack_from(raw)
    if not broker or fmt != _FORMAT:
        raise ValueError(f"not a receipt handle of format {_FORMAT}: {receipt_handle!r}")
    return Handle(broker, queue_id, queue_offset, version)
