"""Parsing of `sluice admin` arguments into `broker.client.api` values, and the spread of a topic's queues.

Every function raises `ConfigError` with a message that says what was expected, so the command
prints one line and exits 2. Pure: no I/O.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

from broker.client.api import BackoffKind, ConsumeFrom, RetryPolicy
from common.config import ConfigError
from common.model import ALL_MESSAGE_TYPES, EXCLUSIVE_TYPES, MessageType
from common.moments import RELATIVE_FORMS, relative_ms

MIXED = "mixed"
_MS_PER_S = 1000


def parse_message_types(text: str) -> frozenset[MessageType]:
    """`normal`, `fifo`, `delay`, `transaction`, `mixed` (all four), or a comma list like `normal,delay`;
    `lite` and `priority` stand alone (docs/lite-topics.md, docs/priority.md)."""
    types: set[MessageType] = set()
    for part in text.split(","):
        word = part.strip().lower()
        if word == MIXED:
            types |= ALL_MESSAGE_TYPES
            continue
        try:
            types.add(MessageType.parse(word))
        except ValueError:
            allowed = ", ".join([*(t.name.lower() for t in MessageType), MIXED])
            raise ConfigError(f"--type {text!r}: {word!r} is not a message type; use {allowed}") from None
    if len(types) > 1 and types & EXCLUSIVE_TYPES:
        raise ConfigError(f"--type {text!r}: lite and priority topics accept only their own type; give it alone")
    return frozenset(types)


_UNITS_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration_s(text: str, flag: str) -> int:
    """`90`, `90s`, `10m`, `2h`, `1d` → whole seconds (at least 1)."""
    word = text.strip().lower()
    unit = _UNITS_S.get(word[-1:], 0) if word else 0
    number = word[:-1] if unit else word
    if not number.isdigit() or int(number) * (unit or 1) < 1:
        raise ConfigError(f"{flag} {text!r}: use a positive duration such as 30s, 10m, 2h or 1d")
    return int(number) * (unit or 1)


def parse_names(text: str) -> list[str]:
    """`a,b,c` → ["a", "b", "c"] (order kept, duplicates and blanks dropped)."""
    names: list[str] = []
    for part in text.split(","):
        name = part.strip()
        if name and name not in names:
            names.append(name)
    if not names:
        raise ConfigError(f"no name in {text!r}; give a comma-separated list")
    return names


def parse_retry_policy(text: str) -> RetryPolicy:
    """`exponential:INITIAL_MS:MAX_MS:MULTIPLIER` or `customized:MS,MS,...`."""
    kind, _, rest = text.partition(":")
    kind = kind.strip().lower()
    try:
        if kind == BackoffKind.EXPONENTIAL.value:
            initial, maximum, multiplier = rest.split(":")
            return RetryPolicy(BackoffKind.EXPONENTIAL, int(initial), int(maximum), float(multiplier))
        if kind == BackoffKind.CUSTOMIZED.value:
            delays = tuple(int(d) for d in rest.split(",") if d.strip())
            if not delays:
                raise ValueError("no delay")
            return RetryPolicy(BackoffKind.CUSTOMIZED, customized_ms=delays)
    except ValueError:
        pass
    raise ConfigError(
        f"--retry-policy {text!r}: use exponential:INITIAL_MS:MAX_MS:MULTIPLIER (e.g. exponential:1000:60000:2) "
        "or customized:MS,MS,... (e.g. customized:1000,5000,30000)"
    )


def parse_consume_from(text: str) -> tuple[ConsumeFrom, int]:
    """`latest`, `earliest`, or a time: epoch milliseconds or ISO-8601 (no zone: UTC)."""
    word = text.strip().lower()
    if word in (ConsumeFrom.LATEST.value, ConsumeFrom.EARLIEST.value):
        return ConsumeFrom(word), 0
    if word.isdigit():
        return ConsumeFrom.TIMESTAMP, int(word)
    try:
        moment = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise ConfigError(
            f"--consume-from {text!r}: use latest, earliest, epoch milliseconds or an ISO-8601 time "
            "(e.g. 2024-05-01T12:00:00Z)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return ConsumeFrom.TIMESTAMP, int(moment.timestamp() * _MS_PER_S)


def parse_time_ms(text: str, what: str) -> int:
    """A moment as epoch milliseconds, ISO-8601 (no zone: UTC) or relative to now (`now-2h`:
    common/moments.py); ConfigError naming `what` otherwise."""
    word = text.strip()
    if word.isdigit():
        return int(word)
    if (relative := relative_ms(word)) is not None:
        return relative
    try:
        moment = dt.datetime.fromisoformat(word)
    except ValueError:
        raise ConfigError(
            f"{what} {text[:64]!r} is not a time: use epoch milliseconds, ISO-8601 (e.g. 2024-05-01T12:00:00Z) "
            f"or a moment relative to now ({RELATIVE_FORMS})"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return int(moment.timestamp() * _MS_PER_S)


def spread_queues(queue_count: int, brokers: Sequence[str]) -> dict[str, int]:
    """Share `queue_count` queues over `brokers`: each gets at least one, the first ones the remainder.

    Each broker holds queue ids 0..share-1 of the topic (the official Node.js client needs queue 0
    on every broker of a route), so the shares are all a topic needs to know.
    """
    if not brokers:
        raise ConfigError("no broker to put the topic on")
    if queue_count < len(brokers):
        raise ConfigError(
            f"--queues {queue_count} cannot be spread over {len(brokers)} brokers ({', '.join(brokers)}): every "
            f"broker needs at least one queue; give --queues {len(brokers)} or more, or fewer --brokers"
        )
    base, extra = divmod(queue_count, len(brokers))
    return {name: base + (1 if i < extra else 0) for i, name in enumerate(brokers)}


@dataclass(frozen=True)
class ResetTarget:
    """Where `group reset-offset --to` moves a group: earliest, latest, a time (epoch ms) or an offset."""

    kind: str  # "earliest", "latest", "time", "offset"
    value: int = 0


def parse_reset_target(text: str) -> ResetTarget:
    """`earliest`, `latest`, an ISO-8601 time (no zone: UTC), or a queue offset (a plain number)."""
    word = text.strip().lower()
    if word in ("earliest", "latest"):
        return ResetTarget(word)
    if word.isdigit():
        return ResetTarget("offset", int(word))
    try:
        moment = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise ConfigError(
            f"--to {text!r}: use earliest, latest, an ISO-8601 time (e.g. 2024-05-01T12:00:00Z) or a queue offset"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return ResetTarget("time", int(moment.timestamp() * _MS_PER_S))
