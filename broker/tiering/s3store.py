"""S3 access for tiering, the broker's and the Spark source's alike: `S3ObjectStore`.

It reaches the bucket that `S3Settings` (broker/tiering/s3settings.py) names. Every call is
bounded: botocore's connect and read timeouts and `max_attempts` tries in all (the first
included; standard retry mode). Objects of `multipart_threshold_bytes` or more go up as a
multipart upload of `multipart_part_bytes` parts (aborted if any part fails). Every request
body carries Content-MD5, so the server rejects bytes damaged in transit; the whole object's
SHA-256 travels as user metadata `sha256`, and a put reports success only after a HEAD shows the
expected size and SHA-256.

Errors: connection failures, timeouts, throttling and 5xx answers become `Unavailable` (retriable);
a missing key on `get` is `ObjectNotFound`; `check_bucket` raises `BucketNotFound` for a missing
bucket; other refusals (access denied, no such bucket, missing credentials) are `InternalError`.
Every message names the endpoint, bucket and key.

Thread-safety: the boto3 client is thread-safe; one `S3ObjectStore` serves every thread.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO, TypeVar

import boto3
import botocore.config
import botocore.exceptions

from broker.tiering.objectstore import SHA256_METADATA_KEY, ObjectInfo, ObjectNotFound, hash_stream
from broker.tiering.s3settings import S3Settings
from common.errors import InternalError, NotFound, PreconditionFailed, SluiceError, Unavailable

T = TypeVar("T")

_RETRIABLE_CODES = frozenset(
    {"SlowDown", "RequestTimeout", "ServiceUnavailable", "InternalError", "Throttling", "ThrottlingException",
     "RequestTimeTooSkewed", "OperationAborted"}
)  # fmt: skip
_MISSING_CODES = frozenset({"NoSuchKey", "404", "NotFound"})
# A conditional write whose condition failed (412), or that raced another conditional write (409).
_CONDITION_CODES = frozenset({"PreconditionFailed", "412", "ConditionalRequestConflict"})
_CONFIG_ERRORS = (botocore.exceptions.NoCredentialsError, botocore.exceptions.PartialCredentialsError)


MIB = 1 << 20


class BucketNotFound(NotFound):
    """The bucket does not exist at the endpoint."""


def make_client(settings: S3Settings) -> Any:
    """A boto3 S3 client for `settings`."""
    session = boto3.session.Session(
        aws_access_key_id=settings.access_key_id or None,
        aws_secret_access_key=settings.secret_access_key or None,
        aws_session_token=settings.session_token or None,
        region_name=settings.region,
    )
    client_config = botocore.config.Config(
        connect_timeout=settings.connect_timeout_s,
        read_timeout=settings.read_timeout_s,
        # botocore reads `max_attempts` as retries after the first try; `total_max_attempts` counts every try.
        retries={"total_max_attempts": max(1, settings.max_attempts), "mode": "standard"},
        s3={"addressing_style": settings.addressing_style},
        max_pool_connections=settings.max_pool_connections,
        # Integrity is ours (Content-MD5 per request, SHA-256 per object); botocore's newer default
        # CRC trailers are not understood by every S3-compatible store.
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )
    return session.client("s3", endpoint_url=settings.endpoint_url or None, config=client_config)


def _md5_b64(data: bytes) -> str:
    return base64.b64encode(hashlib.md5(data, usedforsecurity=False).digest()).decode("ascii")


class S3ObjectStore:
    def __init__(
        self,
        settings: S3Settings,
        *,
        multipart_threshold_bytes: int = 16 * MIB,
        multipart_part_bytes: int = 8 * MIB,
        client: Any = None,
    ) -> None:
        if not settings.bucket:
            raise ValueError("S3ObjectStore needs a bucket")
        self.settings = settings
        self.bucket = settings.bucket
        self.endpoint = settings.endpoint_url or f"aws:{settings.region}"
        self.client = client if client is not None else make_client(settings)
        self._threshold_bytes = multipart_threshold_bytes
        self._part_bytes = multipart_part_bytes

    def describe(self) -> str:
        return self.settings.describe()

    # -- error mapping ---------------------------------------------------------------------------

    def _error(self, exc: BaseException, op: str, key: str) -> SluiceError:
        where = f"S3 {op} of s3://{self.bucket}/{key} at {self.endpoint}"
        if isinstance(exc, botocore.exceptions.ClientError):
            err = exc.response.get("Error", {})
            code = str(err.get("Code", ""))
            status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
            if code in _MISSING_CODES or (status == 404 and code != "NoSuchBucket"):
                return ObjectNotFound(f"{where}: no such object")
            if status >= 500 or status == 429 or code in _RETRIABLE_CODES:
                return Unavailable(f"{where} failed, retry later: {code or status} {err.get('Message', '')}".rstrip())
            return InternalError(f"{where} was refused: {code or status} {err.get('Message', '')}".rstrip())
        if isinstance(exc, _CONFIG_ERRORS):
            return InternalError(f"{where}: {exc} (configure credentials or the AWS credential chain)")
        return Unavailable(f"{where} failed, retry later: {exc}")

    def _call(self, op: str, key: str, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except SluiceError:
            raise
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError, OSError) as exc:
            raise self._error(exc, op, key) from exc

    # -- reads -----------------------------------------------------------------------------------

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        if start < 0 or (end is not None and end <= start):
            return b""
        args: dict[str, Any] = {"Bucket": self.bucket, "Key": key}
        if start > 0 or end is not None:
            args["Range"] = f"bytes={start}-{'' if end is None else end - 1}"

        def fetch() -> bytes:
            try:
                resp = self.client.get_object(**args)
            except botocore.exceptions.ClientError as exc:
                if exc.response.get("Error", {}).get("Code") == "InvalidRange":
                    return b""  # start at or past the end of the object
                raise
            return bytes(resp["Body"].read())

        return self._call("GET", key, fetch)

    def head(self, key: str) -> ObjectInfo | None:
        try:
            resp = self._call("HEAD", key, lambda: self.client.head_object(Bucket=self.bucket, Key=key))
        except ObjectNotFound:
            return None
        meta = {k.lower(): v for k, v in (resp.get("Metadata") or {}).items()}
        etag = str(resp.get("ETag", "")).strip('"')
        return ObjectInfo(key, int(resp["ContentLength"]), meta.get(SHA256_METADATA_KEY, ""), etag)

    def _pages(self, prefix: str, **listing: str) -> Iterator[dict[str, Any]]:
        """The pages of a ListObjectsV2 of `prefix`, each fetched under the error mapping."""
        paginator = self.client.get_paginator("list_objects_v2")
        pages = iter(paginator.paginate(Bucket=self.bucket, Prefix=prefix, **listing))
        while (page := self._call("LIST", prefix + "*", lambda: next(pages, None))) is not None:
            yield page

    def list_objects(self, prefix: str) -> Iterator[ObjectInfo]:
        for page in self._pages(prefix):
            for item in page.get("Contents", ()):
                yield ObjectInfo(item["Key"], int(item["Size"]), "", str(item.get("ETag", "")).strip('"'))

    def child_prefixes(self, prefix: str) -> Iterator[str]:
        """The "directories" directly under `prefix` (which ends with `/` or is empty), with their `/`."""
        for page in self._pages(prefix, Delimiter="/"):
            for common in page.get("CommonPrefixes", ()):
                yield str(common["Prefix"])

    def check_bucket(self) -> None:
        """Raise BucketNotFound if the bucket does not exist (one HEAD)."""
        try:
            self._call("HEAD bucket", "", lambda: self.client.head_bucket(Bucket=self.bucket))
        except ObjectNotFound:  # HEAD answers a bare 404, without the NoSuchBucket code
            raise BucketNotFound(
                f"bucket {self.bucket!r} does not exist at {self.endpoint}: check the bucket and endpoint settings "
                "(the broker's tiering.bucket and tiering.endpoint_url)"
            ) from None

    # -- writes ----------------------------------------------------------------------------------

    def put(self, key: str, data: bytes) -> ObjectInfo:
        return self.put_stream(key, io.BytesIO(data))

    def put_if(self, key: str, data: bytes, etag: str) -> ObjectInfo:
        sha = hashlib.sha256(data).hexdigest()
        condition = {"IfMatch": f'"{etag}"'} if etag else {"IfNoneMatch": "*"}

        def put() -> dict[str, Any]:
            try:
                resp: dict[str, Any] = self.client.put_object(
                    Bucket=self.bucket, Key=key, Body=data, ContentMD5=_md5_b64(data),
                    Metadata={SHA256_METADATA_KEY: sha}, **condition,
                )  # fmt: skip
            except botocore.exceptions.ClientError as exc:
                code = str(exc.response.get("Error", {}).get("Code", ""))
                if code in _CONDITION_CODES or (etag and code in _MISSING_CODES):  # If-Match on no object: 404
                    raise PreconditionFailed(
                        f"S3 conditional PUT of s3://{self.bucket}/{key} at {self.endpoint}: the object changed "
                        f"({'it is not version ' + etag if etag else 'it exists'})"
                    ) from None
                raise
            return resp

        resp = self._call("PUT", key, put)
        return ObjectInfo(key, len(data), sha, str(resp.get("ETag", "")).strip('"'))

    def put_stream(self, key: str, stream: BinaryIO) -> ObjectInfo:
        size, sha = hash_stream(stream)
        metadata = {SHA256_METADATA_KEY: sha}
        if size < self._threshold_bytes:
            body = stream.read()
            self._call(
                "PUT", key,
                lambda: self.client.put_object(
                    Bucket=self.bucket, Key=key, Body=body, ContentMD5=_md5_b64(body), Metadata=metadata
                ),
            )  # fmt: skip
        else:
            self._multipart(key, stream, metadata)
        return self._verify(key, size, sha)

    def _multipart(self, key: str, stream: BinaryIO, metadata: dict[str, str]) -> None:
        created = self._call(
            "CreateMultipartUpload", key,
            lambda: self.client.create_multipart_upload(Bucket=self.bucket, Key=key, Metadata=metadata),
        )  # fmt: skip
        upload_id = created["UploadId"]
        try:
            parts = []
            number = 1
            while chunk := stream.read(self._part_bytes):
                resp = self._call(
                    f"UploadPart {number}", key,
                    lambda c=chunk, n=number: self.client.upload_part(  # type: ignore[misc]
                        Bucket=self.bucket, Key=key, UploadId=upload_id, PartNumber=n, Body=c, ContentMD5=_md5_b64(c)
                    ),
                )  # fmt: skip
                parts.append({"PartNumber": number, "ETag": resp["ETag"]})
                number += 1
            self._call(
                "CompleteMultipartUpload", key,
                lambda: self.client.complete_multipart_upload(
                    Bucket=self.bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts}
                ),
            )  # fmt: skip
        except BaseException:
            # Best effort: an unfinished upload costs storage until a lifecycle rule removes it, and
            # the original error is what the caller needs.
            with contextlib.suppress(Exception):
                self.client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
            raise

    def _verify(self, key: str, size: int, sha: str) -> ObjectInfo:
        info = self.head(key)
        if info is None:
            raise Unavailable(f"S3 PUT of s3://{self.bucket}/{key} at {self.endpoint}: the object is not visible")
        if info.size != size or info.sha256 != sha:
            raise Unavailable(
                f"S3 PUT of s3://{self.bucket}/{key} at {self.endpoint} failed verification: stored "
                f"{info.size} bytes sha256={info.sha256 or '?'}, expected {size} bytes sha256={sha}"
            )
        return info

    def delete(self, key: str) -> None:
        self._call("DELETE", key, lambda: self.client.delete_object(Bucket=self.bucket, Key=key))
