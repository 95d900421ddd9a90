"""A session's subscriptions: what each topic filter asked for, and the one answer a delivery needs:
which of them match a message, at which QoS, with which identifiers (docs/mqtt.md, "Subscriptions
and matching"). Overlapping filters of one session share one consumer group, so a message reaches
the session once; the highest QoS of the filters that match applies (3.1.1 3.3.5, 5.0 3.3.4).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from dataclasses import dataclass

from common.litefilter import matches
from proxy.mqtt.packets import SubOptions
from proxy.mqtt.topics import SYS_PREFIX, Filter, parse_filter
from proxy.names import wrap

GROUP_PREFIX = "MQTT_"
SHARE_PREFIX = "MQTT_SHARE_"
_PLAIN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def session_group(namespace: str, client_id: str) -> str:
    """The consumer group of a session (in its namespace): a hash of the namespace and client id."""
    digest = hashlib.sha256(f"{namespace}\x00{client_id}".encode()).hexdigest()[:32]
    return wrap(namespace, GROUP_PREFIX + digest)


def share_group(namespace: str, share: str) -> str:
    """The consumer group of a shared subscription's share name: `MQTT_SHARE_<name>` when the name
    is made of letters, digits, `-` and `_` (at most 64), else of a hash of it."""
    if _PLAIN.match(share):
        return wrap(namespace, SHARE_PREFIX + share)
    return wrap(namespace, SHARE_PREFIX + "h" + hashlib.sha256(share.encode()).hexdigest()[:32])


@dataclass(frozen=True, slots=True)
class Subscription:
    filter: Filter
    options: SubOptions
    identifier: int = 0  # 5.0 Subscription Identifier (0: none)

    @property
    def local(self) -> bool:
        """A `$SYS/...` filter: served by this proxy, never registered with the brokers."""
        return self.filter.filter.startswith(SYS_PREFIX) or self.filter.filter == SYS_PREFIX[:-1]

    def encode(self) -> list[int]:
        o = self.options
        return [o.qos, int(o.no_local), int(o.retain_as_published), o.retain_handling, self.identifier]

    @classmethod
    def decode(cls, text: str, raw: list[int]) -> Subscription:
        qos, nl, rap, rh, sid = raw
        return cls(parse_filter(text), SubOptions(qos, bool(nl), bool(rap), rh), sid)


@dataclass(frozen=True, slots=True)
class Match:
    qos: int
    retain_as_published: bool
    identifiers: tuple[int, ...]


class Subscriptions:
    """One session's filters, by the text the client wrote."""

    def __init__(self, namespace: str, client_id: str) -> None:
        self.namespace = namespace
        self.group = session_group(namespace, client_id)
        self.by_text: dict[str, Subscription] = {}

    def __len__(self) -> int:
        return len(self.by_text)

    def __iter__(self) -> Iterator[Subscription]:
        return iter(self.by_text.values())

    def group_of(self, sub: Subscription) -> str:
        return share_group(self.namespace, sub.filter.share) if sub.filter.share else self.group

    def match(self, topic: str, group: str, origin_is_self: bool) -> Match | None:
        """The subscriptions of `group` (the session's own, or one share group) that take a message
        of `topic`, as one delivery; None when none does (No Local ones skip the session's own)."""
        qos, rap, ids, found = -1, False, [], False
        for sub in self.by_text.values():
            if self.group_of(sub) != group or not matches(sub.filter.filter, topic):
                continue
            if sub.options.no_local and origin_is_self:
                continue
            found = True
            qos = max(qos, sub.options.qos)
            rap = rap or sub.options.retain_as_published
            if sub.identifier:
                ids.append(sub.identifier)
        return Match(qos, rap, tuple(ids)) if found else None
