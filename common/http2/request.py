"""A request's header block, validated as RFC 9113 8.2 and 8.3.1 ask: lowercase field names of token
characters, no connection-specific fields, `te` only "trailers", pseudo-header fields only the
request's four, each once and before every other field, with :method, :scheme and :path present,
and no value holding NUL, CR or LF or starting or ending with a space or tab. A block that breaks
any of these is malformed: its stream is reset with PROTOCOL_ERROR.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from common.http2.hpackcodec import Header

_CONNECTION_HEADERS = frozenset(("connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade"))
_REQUEST_PSEUDO = frozenset((":method", ":scheme", ":path", ":authority"))
_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9a-z]+\Z")
# Searched for in the values joined by CR (each a C-level substring search: a regular expression
# with these alternatives cost ~150,000 instructions per request of the official Python client,
# a third of the edge's work): a NUL or LF anywhere, white space after or before a CR (at either
# end of a value inside); the ends of the whole are checked apart.
_BAD_INSIDE = ("\0", "\n", "\r ", "\r\t", " \r", "\t\r")
_BLANK = (" ", "\t")
_NAMES_MAX = 1024  # field names found valid, remembered (a request's are usually all known: one lookup)


class Request(NamedTuple):
    """A request's validated header block: its pseudo-header fields and the others, in order."""

    method: str
    scheme: str
    path: str
    authority: str
    fields: list[Header]


_good_names: set[str] = set()


def parse_request(fields: list[Header]) -> Request | None:
    """The request of a header block, or None when it is malformed (RFC 9113 8.2, 8.3.1)."""
    pseudo: dict[str, str] = {}
    i, count = 0, len(fields)
    while i < count:  # the pseudo-header fields, first
        name, value = fields[i]
        if name[:1] != ":":
            break
        if name not in _REQUEST_PSEUDO or name in pseudo:
            return None
        pseudo[name] = value
        i += 1
    regular = fields[i:]
    names = [name for name, _ in regular]
    if not _good_names.issuperset(names) and not _check_names(names):
        return None  # (a pseudo-header field among them fails the name's syntax)
    if "te" in names and any(value != "trailers" for name, value in regular if name == "te"):
        return None
    values = "\r".join([value for _, value in fields])
    if values.count("\r") != count - 1 or values[:1] in _BLANK or values[-1:] in _BLANK:
        return None  # (a CR inside a value, or a blank at the very start or end)
    for bad in _BAD_INSIDE:
        if bad in values:
            return None
    method, scheme, path = pseudo.get(":method"), pseudo.get(":scheme"), pseudo.get(":path")
    if not method or not scheme or not path:
        return None
    return Request(method, scheme, path, pseudo.get(":authority", ""), regular)


def _check_names(names: list[str]) -> bool:
    """Every name is a lower-case token and not connection-specific; the valid ones are remembered."""
    for name in names:
        if name not in _good_names:
            if name in _CONNECTION_HEADERS or not _NAME.match(name):
                return False
            if len(_good_names) >= _NAMES_MAX:
                _good_names.clear()
            _good_names.add(name)
    return True
