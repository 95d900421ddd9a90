"""Who may connect: SASL PLAIN and AMQPLAIN against Sluice's users (the security document's
access keys and secrets), and guest/guest from loopback only, as RabbitMQ allows, unless the
proxy requires authentication (`[proxy.auth] enabled`): then only the document's users."""

from __future__ import annotations

import hmac
import ipaddress
import struct

from pamqp import decode

from common.security import SecurityDoc

MECHANISMS = "PLAIN AMQPLAIN"
GUEST = ("guest", "guest")


def credentials(mechanism: str, response: bytes) -> tuple[str, str] | None:
    """(user, password) from a start-ok response; None when it cannot be read."""
    try:
        if mechanism == "PLAIN":
            parts = response.split(b"\x00")
            if len(parts) != 3:
                return None
            return parts[1].decode(), parts[2].decode()
        if mechanism == "AMQPLAIN":
            _, table = decode.field_table(struct.pack(">I", len(response)) + response)
            user, password = table.get("LOGIN"), table.get("PASSWORD")
            if isinstance(user, bytes):
                user = user.decode()
            if isinstance(password, bytes):
                password = password.decode()
            return (user, password) if isinstance(user, str) and isinstance(password, str) else None
    except (ValueError, UnicodeDecodeError, struct.error, KeyError, IndexError, TypeError):
        return None
    return None


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False


def allowed(user: str, password: str, peer_host: str, doc: SecurityDoc | None, *, guest: bool = True) -> bool:
    """A user of the security document with its secret; or, when `guest` (the proxy does not
    require authentication), guest/guest from loopback."""
    for u in doc.users if doc is not None else ():
        if u.access_key == user:
            return hmac.compare_digest(u.secret.encode(), password.encode())
    return guest and (user, password) == GUEST and is_loopback(peer_host)
