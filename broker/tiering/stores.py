"""`open_object_store(config)`: the object store a `TieringConfig` describes.

An `endpoint_url` of the form `file:///some/dir` selects `LocalDirObjectStore(<dir>/<bucket>)` (for
users without S3, and for single-host trials); anything else is `S3ObjectStore` over boto3.
"""

from __future__ import annotations

from pathlib import Path

from broker.tiering.config import TieringConfig
from broker.tiering.localstore import LocalDirObjectStore
from broker.tiering.objectstore import ObjectStore
from broker.tiering.s3store import S3ObjectStore

FILE_SCHEME = "file://"


def open_object_store(config: TieringConfig) -> ObjectStore:
    if not config.enabled:
        raise ValueError("tiering is disabled: tiering.bucket is not set")
    if config.endpoint_url.startswith(FILE_SCHEME):
        return LocalDirObjectStore(Path(config.endpoint_url.removeprefix(FILE_SCHEME)) / config.bucket)
    return S3ObjectStore(config)
