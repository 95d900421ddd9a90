"""Messages for tests as the contract sends them: `common.record.outgoing`'s record bytes, which a
test can still read back field by field (`sent.message_id`, `sent.body`, ...) to compare with what
a consumer got."""

from __future__ import annotations

from typing import Any

from broker.client.api import StoredMessage
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


def delivered(
    topic: str = "t", queue_id: int = 0, queue_offset: int = 0, body: bytes = b"x", message_id: str = "id",
    message_type: MessageType = MessageType.NORMAL, tag: str | None = None, keys: tuple[str, ...] = (),
    message_group: str | None = None, properties: dict[str, str] | None = None,
    system_properties: dict[str, str] | None = None, born_timestamp_ms: int = 0, born_host: str = "",
    store_timestamp_ms: int = 0, store_host: str = "", delivery_timestamp_ms: int = 0, delivery_attempt: int = 1,
    body_gzip: bool = False, receipt_handle: str = "", invisible_until_ms: int = 0,
) -> StoredMessage:  # fmt: skip
    """A delivered message with these fields (as a consumer reads them), over the record they make."""
    rec = record.MessageRecord(
        topic, queue_id, body, message_id, tag, keys, message_group, dict(properties or {}),
        dict(system_properties or {}), int(message_type), record.FLAG_BODY_GZIP if body_gzip else 0,
        born_timestamp_ms, born_host, store_host, delivery_timestamp_ms, 0, queue_offset, 0, store_timestamp_ms,
    )  # fmt: skip
    return StoredMessage(rec, delivery_attempt, receipt_handle, invisible_until_ms)
