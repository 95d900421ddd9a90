"""A known archive for the Spark tests and the Spark benchmark, built by the real tiering core.

`build_archive` fills a bucket of a moto server (tests/helpers/archive.py) with `ORDERS` (3
queues, 6 hours crossing midnight UTC, several small segments, 4-row row groups) and `AUDIT` (2
queues, 2 hours); one message of each topic carries `SHARED_KEY`. `Archive.produced` is exactly
what the store acknowledged: the expected answers.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from broker.tiering.config import TieringConfig
from tests.helpers.archive import ArchiveBuilder, Produced, message

if TYPE_CHECKING:
    from tests.helpers.s3 import MotoS3Server

HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS
BASE_MS = 1_717_200_000_000 // DAY_MS * DAY_MS + DAY_MS - 3 * HOUR_MS  # 21:00 UTC: hours 3..5 are the next day
HOURS = 6
ORDERS, AUDIT = "orders", "audit"
SHARED_KEY = "shared-key"
PREFIX = "archive"
# JVM flags for the tests' short-lived Spark drivers: C1 JIT only (no C2 compiler threads competing
# for a shared 2-core machine over code that runs a few times) and the serial GC.
SHORT_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


@dataclass(frozen=True)
class Archive:
    server: MotoS3Server
    config: TieringConfig
    produced: tuple[Produced, ...]

    def options(self, **extra: str) -> dict[str, str]:
        """Data source options that reach this archive, plus `extra`."""
        from tests.helpers.s3 import ACCESS_KEY, REGION, SECRET_KEY

        base = {
            "endpoint": self.server.endpoint_url, "bucket": self.config.bucket, "prefix": PREFIX, "region": REGION,
            "accessKeyId": ACCESS_KEY, "secretAccessKey": SECRET_KEY, "addressingStyle": "path",
        }  # fmt: skip
        return {**base, **extra}

    def flags(self) -> list[str]:
        """The `sluice spark` flags that reach this archive."""
        from tests.helpers.s3 import ACCESS_KEY, SECRET_KEY

        return ["--s3-endpoint", self.server.endpoint_url, "--s3-bucket", self.config.bucket, "--s3-prefix", PREFIX,
                "--s3-access-key", ACCESS_KEY, "--s3-secret-key", SECRET_KEY, "--s3-addressing-style", "path",
                "--progress-interval", "0.5"]  # fmt: skip

    def segment_gets(self) -> set[str]:
        """Keys of the segment objects the server answered a GET for since the last clear."""
        keys = set()
        for method, path in self.server.requests():
            if method == "GET" and ".parquet" in path:
                keys.add(path.split("?")[0].split("/", 2)[2])
        return keys


def _produce(builder: ArchiveBuilder) -> None:
    for h in range(HOURS):
        for minute in range(2 * (h + 1)):
            batch = []
            for q in range(3):
                i = minute * 3 + q
                keys = [f"k{i % 5}"] + ([f"x{h}"] if i % 4 == 0 else []) + ([SHARED_KEY] if (h, i) == (0, 1) else [])
                batch.append(
                    message(ORDERS, q, f"{ORDERS}-{h}-{i}", keys=keys, body=bytes([65 + i % 26]) * (50 + i * 37 % 200),
                            group=f"g{i % 3}" if i % 2 else None, tag="TagA" if i % 2 else None)
                )  # fmt: skip
            builder.produce(batch, BASE_MS + h * HOUR_MS + minute * 60_000)
    for h in (1, 4):
        batch = [
            message(AUDIT, i % 2, f"{AUDIT}-{h}-{i}", keys=[SHARED_KEY] if (h, i) == (4, 2) else [f"a{i}"])
            for i in range(5)
        ]
        builder.produce(batch, BASE_MS + h * HOUR_MS + 30 * 60_000)


def build_archive(server: MotoS3Server, bucket: str, data_dir: Path) -> Archive:
    from tests.helpers.s3 import ACCESS_KEY, REGION, SECRET_KEY

    server.client().create_bucket(Bucket=bucket)
    config = TieringConfig(
        endpoint_url=server.endpoint_url, region=REGION, bucket=bucket, prefix=PREFIX, access_key_id=ACCESS_KEY,
        secret_access_key=SECRET_KEY, addressing_style="path", max_attempts=1, segment_target_bytes=4 << 10,
        row_group_rows=4, row_group_bytes=4 << 10, mirror_interval_s=0.0,
    )  # fmt: skip
    builder = ArchiveBuilder(data_dir, config)
    try:
        _produce(builder)
        builder.tier()
    finally:
        builder.close()
    return Archive(server, config, tuple(builder.produced))
