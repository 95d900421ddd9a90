"""`S3ObjectStore`: the object store seam over boto3, for AWS S3 and S3-compatible stores.

Every call is bounded: botocore's connect and read timeouts and a fixed number of attempts
(`TieringConfig.connect_timeout_s`, `read_timeout_s`, `max_attempts`, standard retry mode). Objects
of `multipart_threshold_bytes` or more go up as a multipart upload of `multipart_part_bytes` parts
(aborted if any part fails). Every request body carries Content-MD5, so the server rejects bytes
damaged in transit; the whole object's SHA-256 travels as user metadata `sha256`, and a put reports
success only after a HEAD shows the expected size and SHA-256.

Errors: connection failures, timeouts, throttling and 5xx answers become `Unavailable` (retriable);
a missing key on `get` is `ObjectNotFound`; other refusals (access denied, no such bucket, missing
credentials) are `InternalError`. Every message names the endpoint, bucket and key.

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

from broker.tiering.config import TieringConfig
from broker.tiering.objectstore import SHA256_METADATA_KEY, ObjectInfo, ObjectNotFound, hash_stream
from common.errors import InternalError, SluiceError, Unavailable

T = TypeVar("T")

_RETRIABLE_CODES = frozenset(
    {"SlowDown", "RequestTimeout", "ServiceUnavailable", "InternalError", "Throttling", "ThrottlingException",
     "RequestTimeTooSkewed", "OperationAborted"}
)  # fmt: skip
_MISSING_CODES = frozenset({"NoSuchKey", "404", "NotFound"})
_CONFIG_ERRORS = (botocore.exceptions.NoCredentialsError, botocore.exceptions.PartialCredentialsError)


def make_client(config: TieringConfig) -> Any:
    """A boto3 S3 client built from the tiering configuration (standard credential chain unless keys are set)."""
    session = boto3.session.Session(
        aws_access_key_id=config.access_key_id or None,
        aws_secret_access_key=config.secret_access_key or None,
        aws_session_token=config.session_token or None,
        region_name=config.region,
    )
    client_config = botocore.config.Config(
        connect_timeout=config.connect_timeout_s,
        read_timeout=config.read_timeout_s,
        # botocore reads `max_attempts` as retries after the first try; `total_max_attempts` counts every try.
        retries={"total_max_attempts": config.max_attempts, "mode": "standard"},
        s3={"addressing_style": config.addressing_style},
        max_pool_connections=max(10, 2 * config.upload_concurrency + 4),
        # Integrity is ours (Content-MD5 per request, SHA-256 per object); botocore's newer default
        # CRC trailers are not understood by every S3-compatible store.
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )
    return session.client("s3", endpoint_url=config.endpoint_url or None, config=client_config)


def _md5_b64(data: bytes) -> str:
    return base64.b64encode(hashlib.md5(data, usedforsecurity=False).digest()).decode("ascii")


class S3ObjectStore:
    def __init__(self, config: TieringConfig, client: Any = None) -> None:
        if not config.bucket:
            raise ValueError("S3ObjectStore needs tiering.bucket")
        self.bucket = config.bucket
        self.endpoint = config.endpoint_url or f"aws:{config.region}"
        self.client = client if client is not None else make_client(config)
        self._threshold_bytes = config.multipart_threshold_bytes
        self._part_bytes = config.multipart_part_bytes

    def describe(self) -> str:
        return f"s3://{self.bucket} at {self.endpoint}"

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

    def list_objects(self, prefix: str) -> Iterator[ObjectInfo]:
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        it = iter(pages)
        while True:
            page = self._call("LIST", prefix + "*", lambda: next(it, None))
            if page is None:
                return
            for item in page.get("Contents", ()):
                yield ObjectInfo(item["Key"], int(item["Size"]), "", str(item.get("ETag", "")).strip('"'))

    # -- writes ----------------------------------------------------------------------------------

    def put(self, key: str, data: bytes) -> ObjectInfo:
        return self.put_stream(key, io.BytesIO(data))

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
