"""Configuration of tiered storage (`[broker.tiering]`): where cold data goes and how it is cut.

Tiering is off unless `bucket` is set (`enabled`). Every S3 call is bounded by the connect and read
timeouts and a fixed number of attempts; upload failures are retried by the uploader with
exponential backoff from `retry_initial_s` up to `retry_max_s`, forever, without ever blocking
produce or consume. Units are last in names.

Where the bucket is and how to reach it are the keys of `S3Settings` (broker/tiering/s3settings.py),
which `TieringConfig` derives from; `sluice spark`'s `[spark]` table states them the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from broker.tiering.s3settings import S3Settings

MIB = 1 << 20
_S3_MIN_PART_BYTES = 5 * MIB


@dataclass(frozen=True)
class TieringConfig(S3Settings):
    """The `[broker.tiering]` table: the bucket's keys (S3Settings), then how tiering cuts and reads."""

    prefix: str = "sluice"  # object keys start with "<prefix>/"; may be empty

    # -- S3 uploads ------------------------------------------------------------------------------
    upload_concurrency: int = 4  # topics uploaded in parallel
    multipart_threshold_bytes: int = 16 * MIB
    multipart_part_bytes: int = 8 * MIB

    # -- what is tiered and how it is cut --------------------------------------------------------
    min_age_s: float = 60.0  # only messages stored at least this long ago are tiered
    segment_target_bytes: int = 32 * MIB  # cut a segment once this much is pending
    segment_max_age_s: float = 600.0  # ... or once the oldest pending message is this old
    segment_max_messages: int = 500_000
    row_group_rows: int = 1024
    row_group_bytes: int = 1 * MIB  # uncompressed, so a point read fetches about this much
    scan_interval_s: float = 5.0  # how often the uploader looks for work
    retry_initial_s: float = 1.0
    retry_max_s: float = 60.0
    mirror_interval_s: float = 10.0  # the bucket's manifest.json is rewritten at most this often

    # -- reading back ----------------------------------------------------------------------------
    cache_bytes: int = 256 * MIB  # decoded row groups and footers kept in memory
    # Kept decoded or on their way ahead of a sequential reader, fetched that many per GET: 4 keeps a
    # catching-up consumer reading from memory at a quarter of the requests (tests/bench/tier_bench.py).
    read_ahead_row_groups: int = 4
    lookup_max_segments: int = 64  # segments one lookup by message id or key may scan
    read_concurrency: int = 4  # cold reads (pop, pull, lookups) in flight at once in the broker

    # -- tiered retention ------------------------------------------------------------------------
    retention_s: float = 30 * 24 * 3600.0  # 0 keeps tiered data forever
    topic_retention_s: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        positive = {
            "connect_timeout_s": self.connect_timeout_s,
            "read_timeout_s": self.read_timeout_s,
            "max_attempts": self.max_attempts,
            "upload_concurrency": self.upload_concurrency,
            "segment_target_bytes": self.segment_target_bytes,
            "segment_max_messages": self.segment_max_messages,
            "row_group_rows": self.row_group_rows,
            "row_group_bytes": self.row_group_bytes,
            "scan_interval_s": self.scan_interval_s,
            "retry_initial_s": self.retry_initial_s,
            "lookup_max_segments": self.lookup_max_segments,
            "read_concurrency": self.read_concurrency,
        }
        for name, value in positive.items():
            if value <= 0:
                raise ValueError(f"tiering.{name} must be positive, got {value}")
        non_negative = {
            "min_age_s": self.min_age_s,
            "segment_max_age_s": self.segment_max_age_s,
            "cache_bytes": self.cache_bytes,
            "read_ahead_row_groups": self.read_ahead_row_groups,
            "retention_s": self.retention_s,
            "mirror_interval_s": self.mirror_interval_s,
        }
        for name, value in non_negative.items():
            if value < 0:
                raise ValueError(f"tiering.{name} must not be negative, got {value}")
        if self.retry_max_s < self.retry_initial_s:
            raise ValueError("tiering.retry_max_s must be at least tiering.retry_initial_s")
        if self.multipart_part_bytes < _S3_MIN_PART_BYTES:
            raise ValueError(f"tiering.multipart_part_bytes must be at least {_S3_MIN_PART_BYTES} (S3's minimum)")
        if self.multipart_threshold_bytes < self.multipart_part_bytes:
            raise ValueError("tiering.multipart_threshold_bytes must be at least tiering.multipart_part_bytes")
        if bool(self.access_key_id) != bool(self.secret_access_key):
            raise ValueError("tiering.access_key_id and tiering.secret_access_key must be given together")
        for topic, seconds in self.topic_retention_s.items():
            if seconds < 0:
                raise ValueError(f"tiering.topic_retention_s.{topic} must not be negative, got {seconds}")

    @property
    def enabled(self) -> bool:
        return bool(self.bucket)

    def retention_for(self, topic: str) -> float:
        """Seconds tiered data of `topic` is kept (0 = forever)."""
        return self.topic_retention_s.get(topic, self.retention_s)

    def describe(self) -> str:
        """Endpoint and bucket, for log lines and error messages (never credentials)."""
        return f"{self.endpoint_url or 'aws:' + self.region}/{self.bucket}"
