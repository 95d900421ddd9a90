"""`SparkJobsConfig`: the `[spark]` table of a Sluice TOML file, overridden by `sluice spark` flags.

The S3 keys are `S3Settings` (broker/tiering/s3store.py), the broker's `[broker.tiering]` keys of
the same names, so one file can hold both and the jobs read the bucket the broker writes.
"""

from __future__ import annotations

from dataclasses import dataclass

from broker.tiering.s3store import S3Settings


@dataclass(frozen=True)
class SparkJobsConfig:
    bucket: str = ""
    endpoint_url: str = ""  # "" = AWS
    region: str = "us-east-1"
    prefix: str = "sluice"
    access_key_id: str = ""
    secret_access_key: str = ""
    session_token: str = ""
    addressing_style: str = "auto"
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 30.0
    max_attempts: int = 3
    # "" = spark-submit's --master when run by spark-submit, else local[*]; or spark://..., yarn, k8s://...
    master: str = ""
    app_name: str = "sluice"
    shuffle_partitions: int = 8  # aggregations of one archive are small; Spark's default of 200 is slow here
    split_bytes: int = 128 << 20  # segments larger than this are read by several tasks
    progress_interval_s: float = 2.0  # progress lines on stderr while a job runs; 0 = none

    def s3(self) -> S3Settings:
        return S3Settings(
            bucket=self.bucket, endpoint_url=self.endpoint_url, region=self.region,
            access_key_id=self.access_key_id, secret_access_key=self.secret_access_key,
            session_token=self.session_token, addressing_style=self.addressing_style,
            connect_timeout_s=self.connect_timeout_s, read_timeout_s=self.read_timeout_s,
            max_attempts=self.max_attempts,
        )  # fmt: skip

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
