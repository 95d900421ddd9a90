"""A request's header block, validated as RFC 9113 8.2 and 8.3.1 ask: lowercase field names of token
characters, no connection-specific fields, `te` only "trailers", pseudo-header fields only the
request's four, each once and before every other field, with :method, :scheme and :path present,
and no value holding NUL, CR or LF or starting or ending with a space or tab. A block that breaks
any of these is malformed: its stream is reset with PROTOCOL_ERROR.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from common.http2.hpackcodec import Header

_CONNECTION_HEADERS = frozenset(("connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade"))
_REQUEST_PSEUDO = frozenset((":method", ":scheme", ":path", ":authority"))
_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9a-z]+\Z")
# Over the values joined by CR: a NUL or LF anywhere, white space at either end of a value.
_BAD_VALUES = re.compile(r"[\0\n]|\r[ \t]|[ \t]\r|\A[ \t]|[ \t]\Z")
_NAMES_MAX = 1024  # field names found valid, remembered


@dataclass(frozen=True, slots=True)
class Request:
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
    regular: list[Header] = []
    for name, value in fields:
        if name[:1] == ":":
            if regular or name not in _REQUEST_PSEUDO or name in pseudo:
                return None
            pseudo[name] = value
            continue
        if name not in _good_names:
            if name in _CONNECTION_HEADERS or not _NAME.match(name):
                return None
            if len(_good_names) >= _NAMES_MAX:
                _good_names.clear()
            _good_names.add(name)
        if name == "te" and value != "trailers":
            return None
        regular.append((name, value))
    values = "\r".join(v for _, v in fields)
    if _BAD_VALUES.search(values) or values.count("\r") != len(fields) - 1:
        return None
    method, scheme, path = pseudo.get(":method"), pseudo.get(":scheme"), pseudo.get(":path")
    if not method or not scheme or not path:
        return None
    return Request(method, scheme, path, pseudo.get(":authority", ""), regular)
