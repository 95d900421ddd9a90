"""`sluice admin message send|tail` output a newcomer reads: tail's rows under its header, blank
cells for what a message lacks (it printed `None` for an untagged message), one line on what tail
is doing before it waits, and a type conflict naming the flag that sends the accepted type."""

from __future__ import annotations

from admin import produce
from admin.messages import MESSAGE_COLUMNS
from broker.client.api import StoredMessage
from common.model import MessageType
from tests.helpers.records import delivered


def _message(tag: str | None, keys: tuple[str, ...] = ()) -> StoredMessage:
    return delivered(topic="orders", queue_id=3, queue_offset=12, body=b"hello", message_id="01" + "A" * 32,
                         message_type=MessageType.NORMAL, tag=tag, keys=keys, message_group=None, properties={},
                         system_properties={}, born_timestamp_ms=1, born_host="h",
                         store_timestamp_ms=1_780_000_000_000, store_host="s", delivery_timestamp_ms=0,
                         delivery_attempt=1)  # fmt: skip


def _starts(line: str) -> list[int]:
    """Where each of the header's column names starts."""
    return [line.index(c.upper()) for c in MESSAGE_COLUMNS]


def test_tail_rows_line_up_with_the_header() -> None:
    header = produce.tail_header()
    starts = dict(zip(MESSAGE_COLUMNS, _starts(header), strict=True))
    for msg in (_message("T1", ("order-1",)), _message(None)):
        row = produce.tail_line("broker-a", msg, as_json=False)
        filled = [c for c in MESSAGE_COLUMNS if (c, msg.tag) != ("tag", None) and (c, msg.keys) != ("keys", ())]
        for column in filled:  # each cell begins where its column's name does, after a gap
            at = starts[column]
            assert row[at] != " " and (at == 0 or row[at - 1] == " "), (column, header, row)
        assert row[starts["body"] :] == "hello"


def test_an_untagged_message_has_a_blank_tag_not_none() -> None:
    row = produce.tail_line("broker-a", _message(None), as_json=False)
    assert "None" not in row
    tag_at = produce.tail_header().index("TAG")
    assert row[tag_at : tag_at + produce.TAIL_WIDTHS["tag"]].strip() == ""


def test_tail_says_what_it_does_before_waiting() -> None:
    latest = produce.tail_start("orders", produce.TailOptions())
    assert latest == (
        "tailing orders: messages arriving from now on; Ctrl-C stops; --from earliest shows what is stored"
    )
    bounded = produce.tail_start("orders", produce.TailOptions(start="earliest", count=5, for_s=10))
    assert bounded == "tailing orders: from the first stored message; stops after 5 message(s) or 10 s"
    acking = produce.tail_start("orders", produce.TailOptions(start="group", group="billing", ack=True))
    assert acking == "tailing orders: consuming as group billing (acknowledging); Ctrl-C stops"


def test_a_type_conflict_names_the_flag_of_each_accepted_type() -> None:
    assert produce.type_hint({MessageType.FIFO}) == (
        "send with --message-group MG (a FIFO message; MG orders messages among themselves)"
    )
    both = produce.type_hint({MessageType.DELAY, MessageType.NORMAL})
    assert both.startswith("send with neither --message-group nor --deliver-at") and "--deliver-at TIME" in both
    assert "use a client" in produce.type_hint({MessageType.TRANSACTION})
