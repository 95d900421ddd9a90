"""The archive bucket as the Spark side reads it: bounded boto3 calls with errors a person can act on.

`S3Settings` is picklable (it travels to the executors inside the data source's partitions plan);
`Bucket` is built where it is used (driver or executor) and is not. Every call is bounded by
botocore's connect/read timeouts and `max_attempts`. Errors: a missing bucket or object is
`NotFound`, an unreachable endpoint `Unavailable`, any other refusal (access denied, bad
credentials) `InternalError`; each message names the endpoint, bucket and key.

`Bucket.gets` counts GET requests made through it (planning statistics and the tests' pruning
checks), `bytes_read` the bytes they returned.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import boto3
import botocore.config
import botocore.exceptions

from common.errors import InternalError, NotFound, SluiceError, Unavailable

T = TypeVar("T")

_MISSING_BUCKET = frozenset({"NoSuchBucket"})
_MISSING_KEY = frozenset({"NoSuchKey", "404", "NotFound"})
_UNAVAILABLE_CODES = frozenset({"SlowDown", "RequestTimeout", "ServiceUnavailable", "InternalError", "503", "500"})


@dataclass(frozen=True)
class S3Settings:
    """How to reach the bucket; the same meaning as the broker's `[broker.tiering]` keys of the same names."""

    bucket: str
    endpoint_url: str = ""  # "" = AWS
    region: str = "us-east-1"
    access_key_id: str = ""  # "" = the standard AWS credential chain
    secret_access_key: str = ""
    session_token: str = ""
    addressing_style: str = "auto"
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 30.0
    max_attempts: int = 3

    def describe(self) -> str:
        return f"s3://{self.bucket} at {self.endpoint_url or 'AWS'}"

    def client(self) -> Any:
        session = boto3.session.Session(
            aws_access_key_id=self.access_key_id or None,
            aws_secret_access_key=self.secret_access_key or None,
            aws_session_token=self.session_token or None,
            region_name=self.region,
        )
        config = botocore.config.Config(
            connect_timeout=self.connect_timeout_s,
            read_timeout=self.read_timeout_s,
            retries={"max_attempts": max(1, self.max_attempts), "mode": "standard"},
            s3={"addressing_style": self.addressing_style},
        )
        return session.client("s3", endpoint_url=self.endpoint_url or None, config=config)


class BucketNotFound(NotFound):
    """The bucket does not exist at the endpoint."""


class ObjectMissing(NotFound):
    """The object does not exist (never written, or deleted by tiered retention since it was listed)."""


class Bucket:
    """Blocking, bounded reads of one bucket."""

    def __init__(self, settings: S3Settings) -> None:
        self.settings = settings
        self._client = settings.client()
        self.gets = 0
        self.bytes_read = 0

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        where = f"{what} in {self.settings.describe()}"
        try:
            return fn()
        except botocore.exceptions.ClientError as exc:
            err = exc.response.get("Error", {})
            code = str(err.get("Code", ""))
            if code in _MISSING_BUCKET:
                raise BucketNotFound(
                    f"bucket {self.settings.bucket!r} does not exist at {self.settings.endpoint_url or 'AWS'}: "
                    "check --s3-bucket and --s3-endpoint (the broker's tiering bucket)"
                ) from None
            if code in _MISSING_KEY:
                raise ObjectMissing(f"{where}: no such object") from None
            if code in _UNAVAILABLE_CODES:
                raise Unavailable(f"{where}: the store answered {code}; retry later") from None
            raise InternalError(f"{where}: refused with {code or 'an error'}: {err.get('Message', exc)}") from None
        except (botocore.exceptions.NoCredentialsError, botocore.exceptions.PartialCredentialsError) as exc:
            raise InternalError(f"{where}: no usable credentials ({exc}); pass an access key or set AWS_*") from None
        except (botocore.exceptions.BotoCoreError, OSError) as exc:
            if isinstance(exc, SluiceError):
                raise
            raise Unavailable(f"{where}: cannot reach the store: {exc}") from None

    def check(self) -> None:
        """Raise NotFound if the bucket does not exist (one HEAD)."""
        try:
            self._call("bucket", lambda: self._client.head_bucket(Bucket=self.settings.bucket))
        except ObjectMissing:  # HEAD answers a bare 404, without the NoSuchBucket code
            raise BucketNotFound(
                f"bucket {self.settings.bucket!r} does not exist at {self.settings.endpoint_url or 'AWS'}: "
                "check --s3-bucket and --s3-endpoint (the broker's tiering bucket)"
            ) from None

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        """Bytes [start, end) of an object (the whole object by default)."""
        kwargs: dict[str, Any] = {"Bucket": self.settings.bucket, "Key": key}
        if start or end is not None:
            kwargs["Range"] = f"bytes={start}-{'' if end is None else end - 1}"

        def fetch() -> bytes:
            body = self._client.get_object(**kwargs)["Body"]
            try:
                return bytes(body.read())
            finally:
                body.close()

        self.gets += 1
        data = self._call(f"object {key!r}", fetch)
        self.bytes_read += len(data)
        return data

    def get_optional(self, key: str) -> bytes | None:
        try:
            return self.get(key)
        except ObjectMissing:
            return None

    def child_prefixes(self, prefix: str) -> Iterator[str]:
        """The "directories" directly under `prefix` (which ends with `/` or is empty), with their `/`."""
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"Bucket": self.settings.bucket, "Prefix": prefix, "Delimiter": "/"}
            if token:
                kwargs["ContinuationToken"] = token
            page = self._call(f"listing {prefix!r}", lambda kw=kwargs: self._client.list_objects_v2(**kw))  # type: ignore[misc]
            for common in page.get("CommonPrefixes", ()):
                yield str(common["Prefix"])
            if not page.get("IsTruncated"):
                return
            token = page.get("NextContinuationToken")
