"""Messages for tests as the contract sends them: `common.record.outgoing`'s record bytes, which a
test can still read back field by field (`sent.message_id`, `sent.body`, ...) to compare with what
a consumer got."""

from __future__ import annotations

from typing import Any

from common import record
from common.model import MessageType


class Sent(bytes):
    """A record made by `outgoing`; its fields read by decoding it (tests only: slow, exact)."""

    def __getattr__(self, name: str) -> Any:
        rec = record.decode(self)
        if name == "message_type":
            return MessageType(rec.message_type)
        if name == "body_gzip":
            return bool(rec.flags & record.FLAG_BODY_GZIP)
        if name == "dedup":
            return bool(rec.flags & record.FLAG_DEDUP)
        return getattr(rec, name)


def outgoing(*args: Any, **kwargs: Any) -> Sent:
    """`common.record.outgoing`, readable back."""
    return Sent(record.outgoing(*args, **kwargs))
