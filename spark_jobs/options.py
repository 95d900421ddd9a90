"""What to read: the `sluice` data source's options (and the jobs' flags) as one frozen, checked dataclass.

Spark hands a data source its options as strings; `ScanOptions.parse` turns them into typed values
once, on the driver, and every mistake becomes a `BadRequest` that names the option and says what
is accepted. Time bounds are `[from, to)` on `store_timestamp`, offsets `[fromOffset, toOffset)`.

| option | meaning |
|---|---|
| `endpoint`, `region`, `bucket`, `prefix` | where the archive is (prefix default `sluice`, as the broker's) |
| `accessKeyId`, `secretAccessKey`, `sessionToken` | credentials; default: the standard AWS chain |
| `addressingStyle`, `connectTimeoutS`, `readTimeoutS`, `maxAttempts` | S3 client tuning |
| `cluster`, `broker` | comma-separated names; default every cluster and broker in the bucket |
| `topic` / `topics`, `topicPattern` | comma-separated names and/or a regular expression (full match) |
| `queues` | comma-separated queue ids |
| `from`, `to` | ISO-8601 timestamps (no zone = UTC) or epoch milliseconds |
| `fromOffset`, `toOffset` | queue offset range |
| `key`, `messageId` | comma-separated: keep only messages with one of these keys or one of these ids |
| `splitBytes` | larger segments are read by several tasks (row-group ranges); the most a partition packs |
| `openCostBytes` | what opening one object costs, in bytes, when small segments are packed into partitions |
| `minPartitions` | spread a scan over at least this many partitions when it has that many segments |
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TypeVar, cast, get_args

from broker.tiering.s3settings import AddressingStyle, S3Settings
from common.errors import BadRequest
from common.moments import RELATIVE_FORMS, relative_ms

DEFAULT_PREFIX = "sluice"
DEFAULT_SPLIT_BYTES = 128 << 20
MIN_SPLIT_BYTES = 1 << 20
DEFAULT_OPEN_COST_BYTES = 4 << 20  # as Spark's spark.sql.files.openCostInBytes
DEFAULT_MIN_PARTITIONS = 8
_INT64_MAX = (1 << 63) - 1
N = TypeVar("N", int, float)


@dataclass(frozen=True)
class ScanOptions:
    s3: S3Settings
    prefix: str = DEFAULT_PREFIX
    clusters: frozenset[str] | None = None  # None = every one
    brokers: frozenset[str] | None = None
    topics: frozenset[str] = frozenset()
    topic_pattern: str = ""  # a topic is read when it is in `topics` or matches this; both empty = all
    only_topics: frozenset[str] | None = None  # and, when set, is one of these (pushed-down filters)
    queues: frozenset[int] | None = None
    from_ms: int = 0
    to_ms: int = _INT64_MAX  # exclusive
    from_offset: int = 0
    to_offset: int = _INT64_MAX  # exclusive
    keys: frozenset[str] | None = None  # keep messages with one of these keys; None = every message
    message_ids: frozenset[str] | None = None
    split_bytes: int = DEFAULT_SPLIT_BYTES
    open_cost_bytes: int = DEFAULT_OPEN_COST_BYTES
    min_partitions: int = DEFAULT_MIN_PARTITIONS
    _pattern: re.Pattern[str] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.topic_pattern:
            try:
                object.__setattr__(self, "_pattern", re.compile(self.topic_pattern))
            except re.error as exc:
                raise BadRequest(
                    f"option topicPattern {self.topic_pattern!r} is not a regular expression: {exc}"
                ) from None
        if self.from_ms > self.to_ms:
            raise BadRequest(f"time range is reversed: from ({_iso(self.from_ms)}) is after to ({_iso(self.to_ms)})")
        if self.from_offset > self.to_offset:
            raise BadRequest(f"offset range is reversed: fromOffset {self.from_offset} > toOffset {self.to_offset}")
        if self.split_bytes < MIN_SPLIT_BYTES:
            raise BadRequest(f"option splitBytes must be at least {MIN_SPLIT_BYTES}, got {self.split_bytes}")
        if self.min_partitions < 1:
            raise BadRequest(f"option minPartitions must be at least 1, got {self.min_partitions}")

    def wants_topic(self, topic: str) -> bool:
        if self.only_topics is not None and topic not in self.only_topics:
            return False
        if not self.topics and self._pattern is None:
            return True
        return topic in self.topics or (self._pattern is not None and self._pattern.fullmatch(topic) is not None)

    def wants_queue(self, queue_id: int) -> bool:
        return self.queues is None or queue_id in self.queues

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> ScanOptions:
        """From Spark options (any key case). Raises BadRequest naming the option at fault."""
        opts = {k.lower(): v for k, v in options.items() if v is not None}

        def get(name: str, default: str = "") -> str:
            return str(opts.get(name.lower(), default)).strip()

        bucket = get("bucket")
        if not bucket:
            raise BadRequest("option bucket is required: the S3 bucket the broker tiers into (--s3-bucket)")
        style = get("addressingStyle", "auto")
        if style not in get_args(AddressingStyle):
            raise BadRequest(f"option addressingStyle must be auto, path or virtual, got {style!r}")
        s3 = S3Settings(
            endpoint_url=get("endpoint"), bucket=bucket, region=get("region", "us-east-1"),
            access_key_id=get("accessKeyId"), secret_access_key=get("secretAccessKey"),
            session_token=get("sessionToken"), addressing_style=cast(AddressingStyle, style),
            connect_timeout_s=_number(get("connectTimeoutS", "5"), "connectTimeoutS"),
            read_timeout_s=_number(get("readTimeoutS", "30"), "readTimeoutS"),
            max_attempts=_integer(get("maxAttempts", "3"), "maxAttempts"),
        )  # fmt: skip
        topics = _names(get("topic")) | _names(get("topics"))
        return cls(
            s3=s3, prefix=get("prefix", DEFAULT_PREFIX), clusters=_names(get("cluster")) or None,
            brokers=_names(get("broker")) or None, topics=topics, topic_pattern=get("topicPattern"),
            queues=frozenset(_integer(q, "queues") for q in _names(get("queues"))) or None,
            from_ms=parse_time(get("from"), "from") if get("from") else 0,
            to_ms=parse_time(get("to"), "to") if get("to") else _INT64_MAX,
            from_offset=_integer(get("fromOffset", "0"), "fromOffset"),
            to_offset=_integer(get("toOffset", str(_INT64_MAX)), "toOffset"),
            keys=(_names(get("key")) | _names(get("keys"))) or None, message_ids=_names(get("messageId")) or None,
            split_bytes=_integer(get("splitBytes", str(DEFAULT_SPLIT_BYTES)), "splitBytes"),
            open_cost_bytes=_integer(get("openCostBytes", str(DEFAULT_OPEN_COST_BYTES)), "openCostBytes"),
            min_partitions=_integer(get("minPartitions", str(DEFAULT_MIN_PARTITIONS)), "minPartitions"),
        )  # fmt: skip


def _names(value: str) -> frozenset[str]:
    return frozenset(v.strip() for v in value.split(",") if v.strip())


def option_number(value: str, name: str, kind: type[N], *, positive: bool = False) -> N:
    """Option `name`'s `value` as an int or a float (`kind`), at least 0, or above 0 when `positive`.
    Raises BadRequest naming the option."""
    try:
        number = kind(value)
    except ValueError:
        what = "a whole number" if kind is int else "a number"
        raise BadRequest(f"option {name} must be {what}, got {value!r}") from None
    if number < 0 or (positive and number == 0):
        raise BadRequest(f"option {name} must be {'positive' if positive else 'not negative'}, got {value!r}")
    return number


def _number(value: str, name: str) -> float:
    return option_number(value, name, float)


def _integer(value: str, name: str) -> int:
    return option_number(value, name, int)


def parse_time(value: str, name: str) -> int:
    """Epoch milliseconds from an ISO-8601 timestamp (no zone = UTC), a number of epoch milliseconds,
    or a moment relative to now (`now`, `now-2h`: common/moments.py)."""
    text = value.strip()
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    if (relative := relative_ms(text)) is not None:
        return relative
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise BadRequest(
            f"option {name} {value!r} is not a time: use ISO-8601 (2024-06-01T12:00:00Z), epoch milliseconds "
            f"or a moment relative to now ({RELATIVE_FORMS})"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def _iso(ms: int) -> str:
    try:
        return datetime.fromtimestamp(ms / 1000, UTC).isoformat()
    except (OverflowError, ValueError, OSError):
        return str(ms)
