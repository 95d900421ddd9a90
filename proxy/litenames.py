"""Lite topic names and the names the other protocols give them (docs/mqtt.md "Names", docs/amqp.md
"Both protocols"): one lite topic is one MQTT topic and one AMQP routing key.

- **MQTT.** A lite topic name keeps letters, digits and `-_.:@#/`; any other character of the MQTT
  topic, and `=`, is `=XX` per UTF-8 byte (`home kitchen/t` is `home=20kitchen/t`). Reversible:
  `mqtt_topic` turns a name back (`=` not followed by two hex digits stays as it is, so a RocketMQ
  producer's own names survive).
- **AMQP.** A routing key is the MQTT topic with `.` and `/` swapped, as RabbitMQ's MQTT plugin maps
  them (`sensors.kitchen.temp` is the MQTT topic `sensors/kitchen/temp`), so an AMQP topic exchange's
  `*` and `#` bindings match what MQTT's `+` and `#` filters match.
"""

from __future__ import annotations

import re

_LITE_KEEP = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.:@#/")
_LITE_UNESCAPE = re.compile(r"(?:=[0-9A-F]{2})+")
_SWAP = str.maketrans("./", "/.")


def escape(text: str, keep: frozenset[str], mark: str) -> str:
    """`text` with every character outside `keep` written `mark` + two hex digits per UTF-8 byte."""
    if all(c in keep for c in text):
        return text
    return "".join(c if c in keep else "".join(f"{mark}{b:02X}" for b in c.encode()) for c in text)


def lite_name(topic: str) -> str:
    """The lite topic name of an MQTT topic name (or of a filter's non-wildcard levels)."""
    return escape(topic, _LITE_KEEP, "=")


def _unescape(match: re.Match[str]) -> str:
    raw = bytes(int(match.group(0)[i + 1 : i + 3], 16) for i in range(0, len(match.group(0)), 3))
    return raw.decode(errors="replace")


def mqtt_topic(lite: str) -> str:
    """The MQTT topic a lite topic name spells."""
    return lite if "=" not in lite else _LITE_UNESCAPE.sub(_unescape, lite)


def lite_of_routing_key(routing_key: str) -> str:
    """The lite topic name of an AMQP routing key (its MQTT topic's)."""
    return lite_name(routing_key.translate(_SWAP))


def routing_key_of(lite: str) -> str:
    """The AMQP routing key of a lite topic name."""
    return mqtt_topic(lite).translate(_SWAP)
