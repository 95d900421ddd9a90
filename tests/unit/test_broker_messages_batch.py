"""Column-wise checks and conversion of a send (broker/messages.py): `plainly_valid` accepts a batch
only if `validate_message` accepts each of its messages (a False only sends the batch through the
per-message check, which names the error)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.config import LimitsConfig
from broker.messages import plainly_valid, validate_message
from common.errors import IllegalMessagePropertyKey, SluiceError
from common.model import MessageType, TopicInfo
from common.record import MessageRecord

PROPS = settings(deadline=None, derandomize=True, database=None, max_examples=400)
LIMITS = LimitsConfig(max_body_bytes=8, max_property_count=2, max_properties_bytes=24, max_key_count=2,
                      max_key_chars=4, max_tag_chars=4, max_message_group_chars=4, max_message_id_chars=6)  # fmt: skip

# Short texts from an alphabet with the characters the rules care about: blanks, '|', control ones.
texts = st.text(alphabet="ab \x01|é", max_size=7)
opt_texts = st.none() | texts

messages = st.builds(
    MessageRecord,
    topic=st.just("t"),
    queue_id=st.just(0),
    body=st.binary(max_size=10),
    message_id=texts,
    message_type=st.sampled_from(list(MessageType)),
    tag=opt_texts,
    keys=st.lists(texts, max_size=3).map(tuple),
    message_group=opt_texts,
    properties=st.dictionaries(texts, texts, max_size=3),
    born_timestamp_ms=st.integers(0, 2**40),
    born_host=st.sampled_from(["h1", "h2"]),
    delivery_timestamp_ms=st.sampled_from([0, 0, 5]),
    flags=st.sampled_from([0, 1]),
)
topics = st.builds(
    TopicInfo, name=st.just("t"), queue_count=st.just(4),
    message_types=st.sets(st.sampled_from(list(MessageType)), min_size=1).map(frozenset),
)  # fmt: skip


def each_valid(msgs: list[MessageRecord], topic: TopicInfo) -> bool:
    try:
        for m in msgs:
            validate_message(m, topic, LIMITS)
    except SluiceError:
        return False
    return True


@PROPS
@given(st.lists(messages, min_size=1, max_size=5), topics)
def test_plainly_valid_only_accepts_what_validate_message_accepts(msgs: list[MessageRecord], topic: TopicInfo) -> None:
    if plainly_valid(msgs, topic, LIMITS):
        assert each_valid(msgs, topic)
        assert all(m.message_type in (MessageType.NORMAL, MessageType.FIFO) for m in msgs)


@PROPS
@given(st.lists(messages.filter(lambda m: m.message_type is MessageType.NORMAL and not m.message_group
                                and not m.delivery_timestamp_ms), min_size=1, max_size=5))  # fmt: skip
def test_plainly_valid_accepts_valid_normal_batches(msgs: list[MessageRecord]) -> None:
    topic = TopicInfo("t", 4, message_types=frozenset(MessageType))
    # Per-message property sizes within the limit but not their sum: the batch goes one by one.
    total = sum(len(k.encode()) + len(v.encode()) for m in msgs for k, v in m.properties.items())
    if each_valid(msgs, topic) and total <= LIMITS.max_properties_bytes:
        assert plainly_valid(msgs, topic, LIMITS)


def test_a_bad_user_property_name_is_named() -> None:
    topic = TopicInfo("t", 4, message_types=frozenset(MessageType))
    validate_message(MessageRecord("t", 0, b"x", "id", properties={"a": "\x01", "b": ""}), topic, LIMITS)
    for bad in ("", "b\x01"):
        with pytest.raises(IllegalMessagePropertyKey, match=re.escape(repr(bad))):
            validate_message(MessageRecord("t", 0, b"x", "id", properties={"a": "1", bad: "2"}), topic, LIMITS)
