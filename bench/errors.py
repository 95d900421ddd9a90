"""The load generator's one error: a call that failed, with a short code name."""

from __future__ import annotations


class CallError(Exception):
    """A failed call: the protocol's `Code` name for a non-OK response status (`TOPIC_NOT_FOUND`),
    or `grpc.<STATUS>` for a transport failure (`grpc.UNAVAILABLE`)."""

    def __init__(self, code: str, message: str = "") -> None:
        super().__init__(f"{code}: {message}" if message else code)
        self.code = code
