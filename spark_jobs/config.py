"""`SparkJobsConfig`: the `[spark]` table of a Sluice TOML file, overridden by `sluice spark` flags.

The S3 keys are `S3Settings`'s (broker/tiering/s3settings.py), which `SparkJobsConfig` derives from as
the broker's `TieringConfig` does, so one file can hold both and the jobs read the bucket the broker
writes.
"""

from __future__ import annotations

from dataclasses import dataclass

from broker.tiering.s3settings import S3Settings


@dataclass(frozen=True)
class SparkJobsConfig(S3Settings):
    """The `[spark]` table: the bucket's keys (S3Settings), then the jobs' own."""

    prefix: str = "sluice"  # the broker's tiering prefix: object keys start with "<prefix>/"
    # "" = spark-submit's --master when run by spark-submit, else local[*]; or spark://..., yarn, k8s://...
    master: str = ""
    app_name: str = "sluice"
    shuffle_partitions: int = 8  # aggregations of one archive are small; Spark's default of 200 is slow here
    split_bytes: int = 128 << 20  # segments larger than this are read by several tasks
    progress_interval_s: float = 2.0  # progress lines on stderr while a job runs; 0 = none

    def source_options(self) -> dict[str, str]:
        """The `sluice` data source options that say where the archive is."""
        opts = {
            "bucket": self.bucket, "endpoint": self.endpoint_url, "region": self.region, "prefix": self.prefix,
            "accessKeyId": self.access_key_id, "secretAccessKey": self.secret_access_key,
            "sessionToken": self.session_token, "addressingStyle": self.addressing_style,
            "connectTimeoutS": str(self.connect_timeout_s), "readTimeoutS": str(self.read_timeout_s),
            "maxAttempts": str(self.max_attempts), "splitBytes": str(self.split_bytes),
        }  # fmt: skip
        return {k: v for k, v in opts.items() if v != ""}
