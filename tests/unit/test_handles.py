"""The handle envelope and receipt handles: the binascii-based base64 and the fast receipt decode
must give exactly what the `base64` module and the general `unwrap` give, on valid and garbage input."""

from __future__ import annotations

import base64
import binascii
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.client import handles, receipt
from common.errors import InvalidReceiptHandle, SluiceError

NAMES = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=30)
LAYOUT = struct.Struct("<BIQ")


def reference_wrap(broker: str, payload: bytes, mark: str = "") -> str:
    return f"{broker}~{mark}{base64.urlsafe_b64encode(payload).decode('ascii').rstrip('=')}"


def reference_payload(b64: str) -> bytes:
    return base64.urlsafe_b64decode(b64 + "=" * (-len(b64) % 4))


@given(broker=NAMES, payload=st.binary(max_size=64), mark=st.sampled_from(["", "t", "r"]))
def test_wrap_is_urlsafe_base64_without_padding(broker: str, payload: bytes, mark: str) -> None:
    text = handles.wrap(broker, payload, mark)
    assert text == reference_wrap(broker, payload, mark)


@given(text=st.text(max_size=80) | st.from_regex(r"\Ab~[A-Za-z0-9_\-=!]{0,20}\Z"))
def test_unwrap_accepts_and_refuses_what_base64_does(text: str) -> None:
    def error(message: str) -> SluiceError:
        return InvalidReceiptHandle(message)

    try:
        expected: object = LAYOUT.unpack(reference_payload(text.rpartition("~")[2]))
        broker = text.rpartition("~")[0]
        if not broker or "~" not in text:
            expected = InvalidReceiptHandle
    except (binascii.Error, ValueError, struct.error):
        expected = InvalidReceiptHandle
    try:
        got: object = handles.unwrap(text, LAYOUT, what="handle", error=error)[1]
    except InvalidReceiptHandle:
        got = InvalidReceiptHandle
    assert got == expected


@given(broker=NAMES, qid=st.integers(0, 2**32 - 1), offset=st.integers(0, 2**64 - 1),
       version=st.integers(0, 2**32 - 1), until=st.integers(0, 2**64 - 1), tcrc=st.integers(0, 2**32 - 1),
       gcrc=st.integers(0, 2**32 - 1))  # fmt: skip
def test_receipt_fields_round_trip(broker: str, qid: int, offset: int, version: int, until: int, tcrc: int,
                                   gcrc: int) -> None:  # fmt: skip
    text = receipt.encode(broker, qid, offset, version, until, tcrc, gcrc)
    assert text == receipt.ReceiptHandle(broker, qid, offset, version, until, tcrc, gcrc).encode()
    assert text == reference_wrap(broker, struct.pack("<BIQIQII", 1, qid, offset, version, until, tcrc, gcrc))
    assert receipt.fields(text) == (broker, qid, offset, version, until, tcrc, gcrc)
    assert receipt.decode(text) == receipt.ReceiptHandle(broker, qid, offset, version, until, tcrc, gcrc)


@given(text=st.text(max_size=70) | st.from_regex(r"\Ab~[A-Za-z0-9_\-]{44}\Z"))
def test_receipt_fast_path_agrees_with_the_general_decode(text: str) -> None:
    """`fields` tries a shortcut first; whatever it takes must decode as `unwrap` decodes it."""
    try:
        general: object = handles.unwrap(text, struct.Struct("<BIQIQII"), what="receipt handle",
                                         error=InvalidReceiptHandle)  # fmt: skip
    except InvalidReceiptHandle:
        general = None
    try:
        fast: object = receipt.fields(text)
    except InvalidReceiptHandle:
        fast = None
    if general is None or general[1][0] != 1:  # type: ignore[index]
        assert fast is None
    else:
        broker, values = general  # type: ignore[misc]
        assert fast == (broker, *values[1:])


@pytest.mark.parametrize("text", ["", "b~", "~" + "A" * 44, "b~" + "A" * 43 + "é", "b~" + "A" * 600])
def test_malformed_receipt_handles_are_invalid(text: str) -> None:
    with pytest.raises(InvalidReceiptHandle):
        receipt.fields(text)
