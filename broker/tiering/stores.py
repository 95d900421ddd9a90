"""`open_object_store(config)`: the object store a `TieringConfig` describes.

An `endpoint_url` of the form `file:///some/dir` selects `LocalDirObjectStore(<dir>/<bucket>)` (for
users without S3, and for single-host trials); anything else is `S3ObjectStore` over boto3
(`s3_store`), with the configuration's `S3Settings` (`s3_settings`). boto3 is imported only then: a
broker that tiers to a directory, or not at all, starts without it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

from broker.tiering.config import TieringConfig
from broker.tiering.localstore import LocalDirObjectStore
from broker.tiering.objectstore import ObjectStore
from broker.tiering.s3settings import S3Settings

if TYPE_CHECKING:
    from broker.tiering.s3store import S3ObjectStore

FILE_SCHEME = "file://"


def open_object_store(config: TieringConfig) -> ObjectStore:
    if not config.enabled:
        raise ValueError("tiering is disabled: tiering.bucket is not set")
    if config.endpoint_url.startswith(FILE_SCHEME):
        return LocalDirObjectStore(Path(config.endpoint_url.removeprefix(FILE_SCHEME)) / config.bucket)
    return s3_store(config)


def s3_settings(config: TieringConfig) -> S3Settings:
    """The bucket's settings, with a connection pool for every concurrent upload and a few reads."""
    pool = max(config.max_pool_connections, 2 * config.upload_concurrency + 4)
    return dataclasses.replace(config.s3(), max_pool_connections=pool)


def s3_store(config: TieringConfig) -> S3ObjectStore:
    from broker.tiering.s3store import S3ObjectStore  # boto3 only where S3 is used

    return S3ObjectStore(
        s3_settings(config),
        multipart_threshold_bytes=config.multipart_threshold_bytes,
        multipart_part_bytes=config.multipart_part_bytes,
    )
