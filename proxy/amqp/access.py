"""Vhosts as Sluice namespaces, and Sluice's access rules applied to AMQP (docs/amqp.md, "Vhosts
and access").

A vhost is the namespace of its name (`/`: the default namespace); a name that is no valid
namespace is no vhost (530, as RabbitMQ answers for an unknown vhost). When the proxy requires
authentication (`[proxy.auth] enabled`, as for the gRPC edge) the user's rules of that namespace
decide (docs/security.md): connection.open needs an allow rule of the user in the namespace
(else 530 "access to vhost refused", as RabbitMQ), and RabbitMQ's permissions map to actions on
resources: an exchange X is `topic:X` (configure and write: PUB, read: SUB; the default
exchange is `topic:amq.default`), a queue Q is `group:Q` (configure, write, read: SUB).
Refusals are 403 ACCESS_REFUSED with RabbitMQ's text.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from common.errors import Forbidden
from common.security import Action, Effect, ResourceKind, SecurityDoc
from proxy.amqp.codes import ACCESS_REFUSED, NOT_ALLOWED, AmqpError
from proxy.amqp.meta import DEFAULT_VHOST, namespace_of

Authorize = Callable[[str, str, ResourceKind, str, Action], None]  # raises Forbidden
CONFIGURE, WRITE, READ = "configure", "write", "read"
DEFAULT_EXCHANGE = "amq.default"
_NAMESPACE_RE = re.compile(r"^[a-zA-Z0-9_.|-]{1,127}$")


def namespace(vhost: str) -> str:
    """The namespace of a vhost a client opens; 530 when the name is no namespace."""
    if vhost != DEFAULT_VHOST and not _NAMESPACE_RE.match(vhost):
        raise AmqpError(NOT_ALLOWED, f"vhost '{vhost}' not found: a vhost is '/' or a Sluice namespace name "
                        "(letters, digits, '_', '.', '-')")  # fmt: skip
    return namespace_of(vhost)


def may_use_vhost(doc: SecurityDoc | None, user: str, vhost: str) -> bool:
    """The user has an allow rule in the vhost's namespace."""
    ns = namespace_of(vhost)
    return doc is not None and any(r.access_key == user and r.namespace == ns and r.effect is Effect.ALLOW
                                   for r in doc.rules)  # fmt: skip


class Permissions:
    """One connection's checks; all pass when `authorize` is None (the proxy requires no authentication)."""

    def __init__(self, authorize: Authorize | None, user: str, vhost: str) -> None:
        self._authorize = authorize
        self._user = user
        self._vhost = vhost
        self._ns = namespace_of(vhost)

    def exchange(self, permission: str, name: str) -> None:
        if self._authorize is not None:
            action = Action.SUB if permission == READ else Action.PUB
            self._check(ResourceKind.TOPIC, "exchange", name or DEFAULT_EXCHANGE, permission, action)

    def queue(self, permission: str, name: str) -> None:
        if self._authorize is not None:
            self._check(ResourceKind.GROUP, "queue", name, permission, Action.SUB)

    def _check(self, kind: ResourceKind, what: str, name: str, permission: str, action: Action) -> None:
        assert self._authorize is not None
        try:
            self._authorize(self._user, self._ns, kind, name, action)
        except Forbidden:
            raise AmqpError(ACCESS_REFUSED, f"{permission} access to {what} '{name}' in vhost '{self._vhost}' "
                            f"refused for user '{self._user}'") from None  # fmt: skip
