"""The streaming source's options, parsed once on the driver into one frozen, checked dataclass.

| option | meaning |
|---|---|
| `namesrv` | the cluster's NameServers, `host:port[;host:port]` (as `sluice admin --namesrv`); required |
| `topics` / `topic`, `topicPattern` | comma-separated names and/or a regular expression (full match); one is required |
| `startingOffsets` | `latest` (default), `earliest`, or JSON (docs/spark.md; queues not named: earliest) |
| `startingTimestamp` | each queue from its first message stored at or after this time (ISO-8601, epoch ms, now-1h) |
| `maxRecordsPerTrigger` | the most messages one micro-batch reads, spread over the queues by backlog |
| `maxBytesPerTrigger` | the most bytes (estimated from the brokers' mean stored message size) one micro-batch reads |
| `minRecordsPerTrigger`, `maxTriggerDelay` | wait for at least this many messages, but no longer than the delay (15m) |
| `failOnDataLoss` | `true` (default): fail when unread messages were removed; `false`: log and skip them |
| `includeProperties` | `true` (default); `false`: the `properties` and `system_properties` columns are null |
| `group` | a consumer group (created beforehand) whose offsets follow the query's commits: its lag is the query's |
| `readRows`, `readBytes` | rows and bytes of one bulk read from a broker (default 4096, 8 MiB) |
| `timeoutS` | deadline of each call to a NameServer or broker (default 30) |
| `bucket`, `endpoint`, ... | the batch source's archive options: tiered messages are read from Parquet (cold.py) |
| `testFaultFile` | tests only: the first task to create this file fails after its first rows |
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from common.errors import BadRequest
from nameserver.client import parse_addresses
from spark_jobs.options import ScanOptions, option_number, parse_time
from spark_jobs.stream.offsets import Positions, parse_tree

DEFAULT_READ_ROWS = 4096
DEFAULT_READ_BYTES = 8 << 20
DEFAULT_TIMEOUT_S = 30.0
DEFAULT_MAX_TRIGGER_DELAY_S = 900.0  # Kafka's source's default, 15m
_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?")
_DURATION_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


@dataclass(frozen=True)
class StreamOptions:
    namesrv: tuple[str, ...]
    topics: frozenset[str] = frozenset()
    topic_pattern: str = ""
    starting: str | Positions = "latest"  # "latest", "earliest" or explicit positions
    starting_timestamp_ms: int | None = None  # wins over `starting` when set
    max_records_per_trigger: int | None = None
    max_bytes_per_trigger: int | None = None
    min_records_per_trigger: int | None = None
    max_trigger_delay_s: float = DEFAULT_MAX_TRIGGER_DELAY_S
    fail_on_data_loss: bool = True
    include_properties: bool = True
    group: str = ""  # commit progress as this consumer group's offsets ("" = none)
    read_rows: int = DEFAULT_READ_ROWS
    read_bytes: int = DEFAULT_READ_BYTES
    timeout_s: float = DEFAULT_TIMEOUT_S
    archive: ScanOptions | None = None  # where the tiered archive is (the batch source's options); None = hot only
    fault_file: str = ""  # tests only: the first task to create this file fails mid-partition
    _pattern: re.Pattern[str] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not self.topics and not self.topic_pattern:
            raise BadRequest("option topics (or topicPattern) is required: the topics to read")
        most, least = self.max_records_per_trigger, self.min_records_per_trigger
        if most is not None and least is not None and least > most:
            raise BadRequest(f"option minRecordsPerTrigger ({least}) is above maxRecordsPerTrigger ({most})")
        if self.topic_pattern:
            try:
                object.__setattr__(self, "_pattern", re.compile(self.topic_pattern))
            except re.error as exc:
                pattern = self.topic_pattern
                raise BadRequest(f"option topicPattern {pattern!r} is not a regular expression: {exc}") from None

    def wants_topic(self, topic: str) -> bool:
        return topic in self.topics or (self._pattern is not None and self._pattern.fullmatch(topic) is not None)

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> StreamOptions:
        """From Spark options (any key case). Raises BadRequest naming the option at fault."""
        opts = {k.lower(): str(v).strip() for k, v in options.items() if v is not None}
        namesrv = opts.get("namesrv", "")
        if not namesrv:
            raise BadRequest("option namesrv is required: the cluster's NameServers, host:port[;host:port]")
        try:
            addresses = tuple(parse_addresses(namesrv))
        except ValueError as exc:
            raise BadRequest(f"option namesrv {namesrv!r}: {exc}") from None
        topics = frozenset(t.strip() for key in ("topic", "topics") for t in opts.get(key, "").split(",") if t.strip())
        max_records, min_records = opts.get("maxrecordspertrigger", ""), opts.get("minrecordspertrigger", "")
        timestamp = opts.get("startingtimestamp", "")
        if timestamp and opts.get("startingoffsets"):
            raise BadRequest("options startingOffsets and startingTimestamp exclude each other: set one")
        max_bytes = opts.get("maxbytespertrigger", "")
        delay = opts.get("maxtriggerdelay", "")
        if delay and not min_records:
            raise BadRequest("option maxTriggerDelay needs minRecordsPerTrigger: the count it waits for")
        return cls(
            namesrv=addresses, topics=topics, topic_pattern=opts.get("topicpattern", ""),
            starting=_starting(opts.get("startingoffsets", "latest")),
            starting_timestamp_ms=parse_time(timestamp, "startingTimestamp") if timestamp else None,
            max_records_per_trigger=_positive(max_records, "maxRecordsPerTrigger") if max_records else None,
            min_records_per_trigger=_positive(min_records, "minRecordsPerTrigger") if min_records else None,
            max_bytes_per_trigger=_positive(max_bytes, "maxBytesPerTrigger") if max_bytes else None,
            max_trigger_delay_s=_duration(delay, "maxTriggerDelay") if delay else DEFAULT_MAX_TRIGGER_DELAY_S,
            fail_on_data_loss=_boolean(opts.get("failondataloss", "true"), "failOnDataLoss"),
            include_properties=_boolean(opts.get("includeproperties", "true"), "includeProperties"),
            group=opts.get("group", ""),
            read_rows=_positive(opts.get("readrows", str(DEFAULT_READ_ROWS)), "readRows"),
            read_bytes=_positive(opts.get("readbytes", str(DEFAULT_READ_BYTES)), "readBytes"),
            timeout_s=_seconds(opts.get("timeouts", str(DEFAULT_TIMEOUT_S)), "timeoutS"),
            archive=ScanOptions.parse(options) if opts.get("bucket") else None,
            fault_file=opts.get("testfaultfile", ""),
        )  # fmt: skip


def _starting(value: str) -> str | Positions:
    if value.lower() in ("earliest", "latest"):
        return value.lower()
    try:
        doc = json.loads(value)
    except json.JSONDecodeError:
        raise BadRequest(
            f"option startingOffsets {value!r}: use earliest, latest or JSON "
            '{"topic": {"broker": {"queue": offset}}}'
        ) from None
    return parse_tree(doc, "option startingOffsets", allow_special=True)


def _positive(value: str, name: str) -> int:
    return option_number(value, name, int, positive=True)


def _seconds(value: str, name: str) -> float:
    return option_number(value, name, float, positive=True)


def _duration(value: str, name: str) -> float:
    """Seconds from `90`, `500ms`, `30s`, `15m`, `1h`, `1d` (Kafka's `maxTriggerDelay` forms)."""
    match = _DURATION.fullmatch(value.lower())
    if match is None or float(match.group(1)) <= 0:
        raise BadRequest(f"option {name} must be a positive duration such as 30s, 15m or 1h, got {value!r}")
    return float(match.group(1)) * _DURATION_UNIT_S[match.group(2)]


def _boolean(value: str, name: str) -> bool:
    if value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise BadRequest(f"option {name} must be true or false, got {value!r}")
