"""MQTT topic names and filters, and where they live in Sluice (docs/mqtt.md, "Mapping" and "Names").

An MQTT topic `a/b/c` is the lite topic `a/b/c` (the whole name, escaped) of the bind topic `a`
(its first level, escaped), or of the bind topic an operator maps a prefix to (`bind_topics`).

- A bind topic name keeps letters, digits, `-` and `_`; any other character, and `|`, is `|XX` per
  UTF-8 byte (`|` alone is the empty first level of `/a`).
- A lite topic name is the topic escaped as proxy/litenames.py says (AMQP routing keys name the
  same lite topics).

Both are reversible, and a filter's levels are escaped the same way, so the broker matches escaped
names against escaped filters (common/litefilter.py) exactly as MQTT matches topics.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from common import litefilter
from common.errors import IllegalLiteTopic
from proxy.litenames import lite_name
from proxy.mqtt.codes import TOPIC_FILTER_INVALID, TOPIC_NAME_INVALID, MqttError

SHARE_PREFIX = "$share/"
SYS_PREFIX = "$SYS/"
MAX_TOPIC_BYTES = 65_535
_BIND_KEEP = re.compile(r"[A-Za-z0-9_-]")
_BIND_SAFE = re.compile(r"^[A-Za-z0-9_-]+$")
_MAX_TOPIC_CHARS = 127


def _escape_bind(text: str) -> str:
    if _BIND_SAFE.match(text):
        return text
    return "".join(c if _BIND_KEEP.match(c) else "".join(f"|{b:02X}" for b in c.encode()) for c in text)


def bind_name(first_level: str) -> str:
    """The bind topic (namespace not applied) of an MQTT topic's first level."""
    return _escape_bind(first_level) if first_level else "|"


def validate_topic(topic: str) -> str:
    """A PUBLISH topic name: non-empty, no wildcard, at most 65,535 bytes (U+0000 is refused by the codec)."""
    if not topic:
        raise MqttError(TOPIC_NAME_INVALID, "the topic name is empty")
    if "+" in topic or "#" in topic:
        raise MqttError(TOPIC_NAME_INVALID, f"topic name {topic[:64]!r} contains a wildcard ('+' or '#')")
    if len(topic.encode()) > MAX_TOPIC_BYTES:
        raise MqttError(TOPIC_NAME_INVALID, "the topic name is longer than 65,535 bytes")
    return topic


def validate_filter(text: str) -> str:
    try:
        return litefilter.validate_filter(text)
    except IllegalLiteTopic as exc:
        raise MqttError(TOPIC_FILTER_INVALID, exc.message) from None


@dataclass(frozen=True, slots=True)
class Filter:
    """A SUBSCRIBE's topic filter: the filter proper and, for `$share/g/f`, its share group."""

    text: str  # as the client wrote it (the session's key for this subscription)
    filter: str  # without $share/g/
    share: str = ""

    @property
    def wild_first(self) -> bool:
        """Its first level is a wildcard: it applies to every bind topic."""
        first = self.filter.split("/", 1)[0]
        return first in ("+", "#")

    @property
    def first_level(self) -> str:
        return self.filter.split("/", 1)[0]

    def lite_filter(self) -> str:
        """The filter the brokers match escaped lite topic names with."""
        return "/".join(level if level in ("+", "#") else lite_name(level) for level in self.filter.split("/"))


def parse_filter(text: str) -> Filter:
    """A SUBSCRIBE or UNSUBSCRIBE entry; MqttError(TOPIC_FILTER_INVALID) when it is not one."""
    if text.startswith(SHARE_PREFIX):
        rest = text[len(SHARE_PREFIX) :]
        group, sep, inner = rest.partition("/")
        if not sep or not group or "+" in group or "#" in group:
            raise MqttError(TOPIC_FILTER_INVALID, f"shared subscription {text[:64]!r} must be $share/<group>/<filter>")
        return Filter(text, validate_filter(inner), group)
    return Filter(text, validate_filter(text))


class TopicMap:
    """Where a topic lives: the bind topic of its first level, or of the longest operator prefix
    (`bind_topics`: MQTT topic prefix -> bind topic name; a prefix ends at a level, `a/b/`)."""

    def __init__(self, bind_topics: dict[str, str], max_lite_chars: int) -> None:
        self._prefixes = sorted(bind_topics.items(), key=lambda kv: -len(kv[0]))
        self.max_lite_chars = max_lite_chars

    def bind_of(self, topic: str) -> str:
        for prefix, bind in self._prefixes:
            if topic.startswith(prefix) or topic == prefix.rstrip("/"):
                return bind
        bind = bind_name(topic.split("/", 1)[0])
        if len(bind) > _MAX_TOPIC_CHARS:
            raise MqttError(TOPIC_NAME_INVALID, f"the first level of {topic[:64]!r} makes a bind topic name of "
                            f"{len(bind)} characters; at most {_MAX_TOPIC_CHARS}")  # fmt: skip
        return bind

    def lite_of(self, topic: str) -> str:
        lite = lite_name(topic)
        if len(lite) > self.max_lite_chars:
            raise MqttError(TOPIC_NAME_INVALID, f"topic {topic[:64]!r} is {len(lite)} characters as a lite topic "
                            f"name; at most {self.max_lite_chars} (docs/mqtt.md, Names)")  # fmt: skip
        return lite

    def binds_of_filter(self, f: Filter) -> list[str] | None:
        """The bind topics a filter can match in: one, or None for all (a wildcard first level)."""
        if f.wild_first:
            return None
        first = f.first_level
        out = {bind for prefix, bind in self._prefixes if prefix.split("/", 1)[0] == first}
        if not any(f.filter.startswith(prefix) for prefix, _ in self._prefixes):
            out.add(self.bind_of(first))
        return sorted(out)
