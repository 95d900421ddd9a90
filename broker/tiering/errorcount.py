"""`ErrorCountingObjectStore`: an ObjectStore wrapper that counts failed calls in
`sluice_tier_s3_errors_total{broker, operation}` (docs/metrics.md).

A call fails when it raises a `SluiceError` other than ObjectNotFound (a missing object is an
answer, not an error: `head` and `get` of absent keys are normal). The error is re-raised
unchanged; the wrapper adds nothing else. The broker wraps its object store with it when it
starts tiering: `ErrorCountingObjectStore(open_object_store(cfg), broker_name)`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import BinaryIO, TypeVar

from broker.tiering.objectstore import ObjectInfo, ObjectNotFound, ObjectStore
from common import metrics
from common.errors import SluiceError

T = TypeVar("T")


class ErrorCountingObjectStore:
    def __init__(self, inner: ObjectStore, broker: str) -> None:
        self.inner = inner
        self._broker = broker

    def _counted(self, operation: str, call: Callable[[], T]) -> T:
        try:
            return call()
        except ObjectNotFound:
            raise
        except SluiceError:
            metrics.TIER_S3_ERRORS.labels(self._broker, operation).inc()
            raise

    def describe(self) -> str:
        return self.inner.describe()

    def put(self, key: str, data: bytes) -> ObjectInfo:
        return self._counted("put", lambda: self.inner.put(key, data))

    def put_if(self, key: str, data: bytes, etag: str) -> ObjectInfo:
        return self._counted("put", lambda: self.inner.put_if(key, data, etag))

    def put_stream(self, key: str, stream: BinaryIO) -> ObjectInfo:
        return self._counted("put", lambda: self.inner.put_stream(key, stream))

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        return self._counted("get", lambda: self.inner.get(key, start, end))

    def head(self, key: str) -> ObjectInfo | None:
        return self._counted("head", lambda: self.inner.head(key))

    def list_objects(self, prefix: str) -> Iterator[ObjectInfo]:
        # Listing pages lazily: errors surface while iterating, so count them there.
        try:
            yield from self.inner.list_objects(prefix)
        except ObjectNotFound:
            raise
        except SluiceError:
            metrics.TIER_S3_ERRORS.labels(self._broker, "list").inc()
            raise

    def delete(self, key: str) -> None:
        self._counted("delete", lambda: self.inner.delete(key))
