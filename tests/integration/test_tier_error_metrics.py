"""`ErrorCountingObjectStore` over a real S3-compatible server (moto on loopback): failed calls are
counted by operation while S3 is down; missing objects and successful calls are not errors."""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

import pytest
from prometheus_client import REGISTRY

from broker.tiering.config import TieringConfig
from broker.tiering.errorcount import ErrorCountingObjectStore
from broker.tiering.objectstore import ObjectNotFound
from broker.tiering.stores import s3_store
from common.errors import Unavailable

if TYPE_CHECKING:
    from tests.helpers.s3 import MotoS3Server

pytest_plugins = ["tests.helpers.s3"]


def errors(operation: str) -> float:
    labels = {"broker": "tier-b", "operation": operation}
    return REGISTRY.get_sample_value("sluice_tier_s3_errors_total", labels) or 0.0


def test_failed_calls_are_counted_by_operation(s3_config: TieringConfig, s3_server: MotoS3Server) -> None:
    store = ErrorCountingObjectStore(s3_store(s3_config), "tier-b")
    before = {op: errors(op) for op in ("put", "get", "head", "list", "delete")}
    store.put("a/1", b"data")
    store.put_stream("a/2", io.BytesIO(b"more"))
    assert store.get("a/1") == b"data"
    assert store.head("a/missing") is None
    with pytest.raises(ObjectNotFound):
        store.get("a/missing")
    assert [i.key for i in store.list_objects("a/")] == ["a/1", "a/2"]
    assert {op: errors(op) for op in before} == before  # nothing failed

    with s3_server.outage():
        for call in (lambda: store.put("a/3", b"x"), lambda: store.get("a/1"), lambda: list(store.list_objects("a/")),
                     lambda: store.delete("a/1")):  # fmt: skip
            with pytest.raises(Unavailable):
                call()
    assert {op: errors(op) - before[op] for op in before} == {"put": 1, "get": 1, "head": 0, "list": 1, "delete": 1}
