"""`S3Settings`: how to reach the tiering bucket, one meaning for every key whoever reads it (the
broker's `[broker.tiering]`, `sluice spark` flags, the Spark source's options). It is frozen and
picklable, so it travels to Spark executors.

Kept apart from broker/tiering/s3store.py so that reading a configuration does not import boto3
(about 0.1 s): `sluice admin`, and every broker without tiering, never load it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Literal

AddressingStyle = Literal["auto", "path", "virtual"]


@dataclass(frozen=True)
class S3Settings:
    """How to reach the bucket. Empty keys mean the standard AWS credential chain (environment,
    shared config/credentials files, instance or container roles).

    Stated once: the broker's `[broker.tiering]` (`TieringConfig`) and `sluice spark`'s `[spark]`
    (`SparkJobsConfig`) derive from it, so one file's keys of these names serve both and the jobs
    read the bucket the broker writes; `s3()` hands the plain settings to an `S3ObjectStore`."""

    bucket: str = ""  # empty: tiering disabled
    endpoint_url: str = ""  # empty: AWS's own endpoint for `region`
    region: str = "us-east-1"
    access_key_id: str = ""
    secret_access_key: str = ""
    session_token: str = ""
    addressing_style: AddressingStyle = "auto"
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 30.0
    max_attempts: int = 3  # per S3 call in all, the first and botocore's own retries included
    # boto3's connection pool (the broker raises it to what its upload concurrency needs).
    max_pool_connections: int = 10

    def s3(self) -> S3Settings:
        """These settings alone (picklable for Spark executors), from a config that derives from them."""
        return S3Settings(**{f.name: getattr(self, f.name) for f in fields(S3Settings)})

    def describe(self) -> str:
        """Bucket and endpoint, for messages (never credentials)."""
        return f"s3://{self.bucket} at {self.endpoint_url or 'aws:' + self.region}"
