"""The typed request context built once at the edge and passed first to every core call.

It is a `CallContext` (request id, client id, namespace, deadline): the proxy's core hands it on to
`BrokerApi` as it is, so the client's ids and deadline reach the broker, local or remote.
"""

from __future__ import annotations

from dataclasses import dataclass

from broker.client.api import CallContext


@dataclass(frozen=True, slots=True)
class RequestContext(CallContext):
    language: str = ""
    client_version: str = ""
    peer: str = ""
    authorization: str = ""  # the signature header, checked by proxy/grpc/guard.py when auth is on
    date_time: str = ""  # x-mq-date-time, the signed value
