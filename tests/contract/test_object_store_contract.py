"""The object store contract (broker/tiering/objectstore.py), run against every implementation.

- `s3`: `S3ObjectStore` against a real moto S3 server on loopback (tests/helpers/s3.py), with a small
  multipart threshold so large objects take the multipart path.
- `local`: `LocalDirObjectStore` in a tmp dir.

The same test bodies run for both; the last tests are about S3 outages only.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from broker.tiering.config import MIB, TieringConfig
from broker.tiering.localstore import LocalDirObjectStore
from broker.tiering.objectstore import ObjectNotFound, ObjectStore
from broker.tiering.stores import s3_store
from common.errors import PreconditionFailed, Unavailable

if TYPE_CHECKING:  # imported by pytest as a plugin (below), so its asserts are rewritten
    from tests.helpers.s3 import MotoS3Server

pytest_plugins = ["tests.helpers.s3"]

OUTAGE_BOUND_S = 5.0  # far above the expected milliseconds; only catches a hang


@pytest.fixture(params=["s3", "local"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ObjectStore]:
    if request.param == "local":
        yield LocalDirObjectStore(tmp_path / "objects")
        return
    config: TieringConfig = request.getfixturevalue("s3_config")
    yield s3_store(dataclasses.replace(config, multipart_threshold_bytes=5 * MIB, multipart_part_bytes=5 * MIB))


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_put_get_head_round_trip(store: ObjectStore) -> None:
    data = bytes(range(256)) * 40
    info = store.put("a/b/seg-1.parquet", data)
    assert (info.key, info.size, info.sha256) == ("a/b/seg-1.parquet", len(data), sha(data))
    assert store.get("a/b/seg-1.parquet") == data
    head = store.head("a/b/seg-1.parquet")
    assert head is not None and (head.size, head.sha256) == (len(data), sha(data))
    assert store.head("a/b/missing") is None


def test_ranged_gets(store: ObjectStore) -> None:
    data = bytes(range(200))
    store.put("r/obj", data)
    assert store.get("r/obj", 10, 20) == data[10:20]
    assert store.get("r/obj", 190) == data[190:]
    assert store.get("r/obj", 150, 10_000) == data[150:]  # clipped to the object
    assert store.get("r/obj", 200) == b"" and store.get("r/obj", 500, 600) == b""
    assert store.get("r/obj", 20, 20) == b""


def test_empty_object(store: ObjectStore) -> None:
    info = store.put("e/empty", b"")
    assert info.size == 0 and info.sha256 == sha(b"")
    assert store.get("e/empty") == b""


def test_put_replaces_and_delete_is_idempotent(store: ObjectStore) -> None:
    store.put("k/x", b"one")
    store.put("k/x", b"second")
    assert store.get("k/x") == b"second"
    head = store.head("k/x")
    assert head is not None and head.sha256 == sha(b"second")
    store.delete("k/x")
    store.delete("k/x")
    assert store.head("k/x") is None
    with pytest.raises(ObjectNotFound, match="k/x"):
        store.get("k/x")


def test_conditional_puts_replace_only_the_version_named(store: ObjectStore) -> None:
    first = store.put_if("c/manifest.json", b"one", "")  # create only
    assert store.get("c/manifest.json") == b"one" and first.etag
    head = store.head("c/manifest.json")
    assert head is not None and head.etag == first.etag
    with pytest.raises(PreconditionFailed, match=r"c/manifest\.json"):
        store.put_if("c/manifest.json", b"clobber", "")  # it exists
    second = store.put_if("c/manifest.json", b"two", first.etag)
    assert store.get("c/manifest.json") == b"two" and second.etag != first.etag
    with pytest.raises(PreconditionFailed):
        store.put_if("c/manifest.json", b"stale", first.etag)  # a writer that missed "two"
    assert store.get("c/manifest.json") == b"two"
    store.delete("c/manifest.json")
    with pytest.raises(PreconditionFailed):
        store.put_if("c/manifest.json", b"gone", second.etag)
    assert store.head("c/manifest.json") is None


def test_list_by_prefix_in_key_order(store: ObjectStore) -> None:
    for key in ("t/b/2", "t/a/1", "t/a/0", "t/ab", "u/a/0", "t2/x"):
        store.put(key, key.encode())
    assert [i.key for i in store.list_objects("t/a")] == ["t/a/0", "t/a/1", "t/ab"]
    assert [i.key for i in store.list_objects("t/")] == ["t/a/0", "t/a/1", "t/ab", "t/b/2"]
    assert [(i.key, i.size) for i in store.list_objects("t2/")] == [("t2/x", 4)]
    assert list(store.list_objects("none/")) == []


def test_large_objects_and_streams(store: ObjectStore) -> None:
    big = (bytes(range(251)) * (6 * MIB // 251 + 1))[: 6 * MIB + 17]  # above the multipart threshold
    info = store.put("big/one", big)
    assert (info.size, info.sha256) == (len(big), sha(big))
    assert store.get("big/one", 5 * MIB - 3, 5 * MIB + 3) == big[5 * MIB - 3 : 5 * MIB + 3]
    stream = io.BytesIO(b"HEADER" + big)
    stream.seek(6)  # a stream is uploaded from its current position
    info = store.put_stream("big/two", stream)
    assert info.sha256 == sha(big) and store.get("big/two", len(big) - 10) == big[-10:]


def test_s3_outage_is_unavailable_naming_the_object(s3_server: MotoS3Server, s3_config: TieringConfig) -> None:
    store = s3_store(s3_config)
    store.put("o/k", b"data")
    with s3_server.outage():
        for call in (lambda: store.get("o/k"), lambda: store.put("o/k2", b"x"), lambda: store.head("o/k"),
                     lambda: list(store.list_objects("o/")), lambda: store.delete("o/k")):  # fmt: skip
            began = time.monotonic()
            with pytest.raises(Unavailable, match=f"s3://{s3_config.bucket}/o/.*{s3_server.endpoint_url}") as err:
                call()
            assert err.value.retriable
            assert time.monotonic() - began < OUTAGE_BOUND_S
    assert store.get("o/k") == b"data"  # the server is back with its state
