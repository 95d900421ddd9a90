"""`LocalDirObjectStore`: the object store seam over a local directory (tests, and users without S3).

Layout: the object `a/b/c` is the file `<root>/a/b/c`; its size, SHA-256 and inode are kept in
`<root>/.meta/a/b/c.json`. A put writes a temporary file, fsyncs it and renames it over the key, so a
reader sees the old object or the new one, never a partial one; verification re-reads the metadata
and size as a HEAD would. Keys are `/`-separated, relative, with no empty, `.` or `..` component and
not under `.meta/`.

Thread-safety: every call works on whole files and atomic renames; concurrent puts of one key leave
one of them.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from broker.tiering.objectstore import HASH_CHUNK_BYTES, ObjectInfo, ObjectNotFound
from common.errors import BadRequest, PreconditionFailed, Unavailable

META_DIR = ".meta"
_TMP_PREFIX = ".tmp-"


class LocalDirObjectStore:
    def __init__(self, root: Path) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.root = root
        self._conditional = threading.Lock()  # put_if's check and write

    def describe(self) -> str:
        return f"directory {self.root}"

    def _path(self, key: str) -> Path:
        parts = key.split("/")
        if not key or any(p in ("", ".", "..") or p.startswith(_TMP_PREFIX) for p in parts) or parts[0] == META_DIR:
            raise BadRequest(f"object key {key!r} is not valid for {self.describe()}")
        return self.root.joinpath(*parts)

    def _meta_path(self, key: str) -> Path:
        return self.root.joinpath(META_DIR, *key.split("/")).with_name(key.rsplit("/", 1)[-1] + ".json")

    def _fail(self, op: str, key: str, exc: OSError) -> Unavailable:
        return Unavailable(f"{op} of {key} in {self.describe()} failed: {exc}")

    # -- writes ----------------------------------------------------------------------------------

    def put(self, key: str, data: bytes) -> ObjectInfo:
        return self.put_stream(key, io.BytesIO(data))

    def put_if(self, key: str, data: bytes, etag: str) -> ObjectInfo:
        """A version's etag is its SHA-256 here. Conditional among the writers of this process only
        (one lock): a directory shared by several processes gives no such guarantee."""
        with self._conditional:
            current = self.head(key)
            if (current.sha256 if current is not None else "") != etag or (current is not None and not etag):
                raise PreconditionFailed(
                    f"conditional put of {key} in {self.describe()}: the object changed "
                    f"({'it is not version ' + etag if etag else 'it exists'})"
                )
            return self.put(key, data)

    def put_stream(self, key: str, stream: BinaryIO) -> ObjectInfo:
        path = self._path(key)
        try:
            digest = hashlib.sha256()
            size = 0
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f"{_TMP_PREFIX}{uuid.uuid4().hex}")
            try:
                with tmp.open("wb") as fh:
                    while chunk := stream.read(HASH_CHUNK_BYTES):
                        digest.update(chunk)
                        size += len(chunk)
                        fh.write(chunk)
                    fh.flush()
                    os.fsync(fh.fileno())
                sha = digest.hexdigest()
                os.replace(tmp, path)
                # The sidecar names the file it describes (inode), so a crash between the rename and
                # this write leaves an object without a SHA-256, never with a wrong one.
                self._write_meta(key, size, sha, path.stat().st_ino)
            finally:
                tmp.unlink(missing_ok=True)
        except OSError as exc:
            raise self._fail("put", key, exc) from exc
        info = self.head(key)
        if info is None or info.size != size or info.sha256 != sha:
            raise Unavailable(f"put of {key} in {self.describe()} failed verification: {info}")
        return info

    def _write_meta(self, key: str, size: int, sha: str, inode: int) -> None:
        meta = self._meta_path(key)
        meta.parent.mkdir(parents=True, exist_ok=True)
        tmp = meta.with_name(f"{_TMP_PREFIX}{uuid.uuid4().hex}")
        tmp.write_text(json.dumps({"size": size, "sha256": sha, "inode": inode}))
        os.replace(tmp, meta)

    def delete(self, key: str) -> None:
        path = self._path(key)
        try:
            path.unlink(missing_ok=True)
            self._meta_path(key).unlink(missing_ok=True)
        except OSError as exc:
            raise self._fail("delete", key, exc) from exc

    # -- reads -----------------------------------------------------------------------------------

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        path = self._path(key)
        if start < 0 or (end is not None and end <= start):
            return b""
        try:
            with path.open("rb") as fh:
                fh.seek(start)
                return fh.read() if end is None else fh.read(end - start)
        except FileNotFoundError:
            raise ObjectNotFound(f"no object {key} in {self.describe()}") from None
        except OSError as exc:
            raise self._fail("get", key, exc) from exc

    def head(self, key: str) -> ObjectInfo | None:
        path = self._path(key)
        try:
            st = path.stat()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise self._fail("head", key, exc) from exc
        sha = ""
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            meta = json.loads(self._meta_path(key).read_text())
            if int(meta["size"]) == st.st_size and int(meta["inode"]) == st.st_ino:
                sha = str(meta["sha256"])
        return ObjectInfo(key, st.st_size, sha, sha)

    def list_objects(self, prefix: str) -> Iterator[ObjectInfo]:
        # Walk only the deepest directory the prefix names, then filter by the full prefix.
        base = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        top = self.root.joinpath(*base.split("/")) if base else self.root
        keys: list[str] = []
        for dirpath, dirnames, filenames in os.walk(top):
            rel = Path(dirpath).relative_to(self.root).as_posix()
            if rel == ".":
                dirnames[:] = [d for d in dirnames if d != META_DIR]
                rel = ""
            for name in filenames:
                key = f"{rel}/{name}" if rel else name
                if not name.startswith(_TMP_PREFIX) and key.startswith(prefix):
                    keys.append(key)
        for key in sorted(keys):
            info = self.head(key)
            if info is not None:
                yield ObjectInfo(key, info.size, "", "")
