"""The one envelope of every self-describing handle a broker issues: `<broker>~<mark><base64url>`.

Receipt handles, transaction ids and recall handles all travel through clients and come back to
any proxy, which must find the broker that issued them without asking anyone: the broker's name
comes first, then `~`, then an optional one-letter mark naming the kind, then the kind's binary
payload in unpadded URL-safe base64 (its first byte is the payload's format number). Broker names
may contain `~`; the last one separates.

`wrap` and `unwrap` handle the envelope; each kind packs and checks its own payload and raises its
own error (a malformed receipt handle is INVALID_RECEIPT_HANDLE, a transaction id
INVALID_TRANSACTION_ID, a recall handle BAD_REQUEST).
"""

from __future__ import annotations

import binascii
import functools
import struct
import zlib
from collections.abc import Callable

from common.errors import SluiceError

SEPARATOR = "~"
MAX_HANDLE_CHARS = 512


# URL-safe base64 through binascii and a byte translation: what `base64.urlsafe_b64encode` and
# `urlsafe_b64decode` do, without their Python-level wrappers (a handle is encoded for every
# delivered message and decoded for every acknowledged one).
_TO_URLSAFE = bytes.maketrans(b"+/", b"-_")
_FROM_URLSAFE = bytes.maketrans(b"-_", b"+/")


def wrap(broker: str, payload: bytes, mark: str = "") -> str:
    b64 = binascii.b2a_base64(payload, newline=False).translate(_TO_URLSAFE).decode("ascii").rstrip("=")
    return f"{broker}{SEPARATOR}{mark}{b64}"


def unwrap(
    text: str, layout: struct.Struct, *, what: str, error: Callable[[str], SluiceError], hint: str = "",
    mark: str = "",
) -> tuple[str, tuple[int, ...]]:  # fmt: skip
    """(broker, unpacked payload fields) of a handle; anything malformed raises `error(message)`.

    `what` names the handle in messages ("receipt handle"); `hint` ends them (what to do instead).
    The payload's first field is its format number, which the caller checks.
    """
    broker, rest = _split(text, what=what, error=error, hint=hint, mark=mark)
    b64 = rest[len(mark) :]
    try:
        raw = binascii.a2b_base64((b64 + "=" * (-len(b64) % 4)).encode("ascii").translate(_FROM_URLSAFE))
        return broker, layout.unpack(raw)
    except (binascii.Error, ValueError, struct.error):  # ValueError: also a non-ASCII character
        raise error(f"{what} is malformed{hint}") from None


def fast_unwrap(text: str, layout: struct.Struct, b64_chars: int) -> tuple[str, tuple[int, ...]] | None:
    """`unwrap` of a well-formed handle without a mark whose payload is `b64_chars` long, or None
    for anything else (the caller then calls `unwrap`, which names the error). Once per ack."""
    broker, _, b64 = text.rpartition(SEPARATOR)
    if not broker or len(b64) != b64_chars or len(text) > MAX_HANDLE_CHARS:
        return None
    try:
        return broker, layout.unpack(binascii.a2b_base64(b64.encode("ascii").translate(_FROM_URLSAFE)))
    except (binascii.Error, ValueError, struct.error):
        return None


def broker_name(text: str, *, what: str, error: Callable[[str], SluiceError], hint: str = "", mark: str = "") -> str:
    """The broker that issued a handle, from the envelope alone (the payload is not decoded).

    For routing: the broker that gets the handle decodes and checks the payload, and answers a
    malformed one with the same error `unwrap` raises.
    """
    return _split(text, what=what, error=error, hint=hint, mark=mark)[0]


def _split(text: str, *, what: str, error: Callable[[str], SluiceError], hint: str, mark: str) -> tuple[str, str]:
    if not text:
        raise error(f"{what} is empty{hint}")
    if len(text) > MAX_HANDLE_CHARS:
        raise error(f"{what} is too long to be one issued by Sluice")
    broker, sep, rest = text.rpartition(SEPARATOR)
    if not sep or not broker or not rest.startswith(mark):
        raise error(f"{what} is malformed (no broker name){hint}")
    return broker, rest


@functools.lru_cache(maxsize=4096)  # twice per delivered and per acknowledged message, few distinct names
def name_crc(name: str) -> int:
    """CRC-32 of a topic or group name: handles carry it to refuse use with another name."""
    return zlib.crc32(name.encode("utf-8"))
