"""CommitLog segment files: naming, lookup by physical offset, positional reads and writes.

Segments live in `<data_dir>/commitlog/` and are named by their starting physical offset
(`00000000000000000000.log`, 20 digits). Physical offsets form one address space: a segment
starts where the previous one ended (the previous segment's base plus its length), so the
position of a record inside its file is `physical_offset - base`.

Only the writer thread appends (to the last, active segment) or rolls; retention deletes from the
front; readers take the current tuple of segments and `pread`. A deleted segment's read
descriptor is closed one retention round later, never while a reader might still hold it.
"""

from __future__ import annotations

import bisect
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

from common.errors import MessageCorrupted, OffsetNotFound

SUFFIX = ".log"


@dataclass(eq=False)
class Segment:
    base: int
    path: Path
    size: int
    read_fd: int = field(default=-1, repr=False)

    @property
    def end(self) -> int:
        return self.base + self.size

    def name(self) -> str:
        return self.path.name


def segment_name(base: int) -> str:
    return f"{base:020d}{SUFFIX}"


class SegmentSet:
    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.dir = directory
        self._lock = threading.Lock()
        found = []
        for p in directory.iterdir():
            if p.suffix == SUFFIX and p.stem.isdigit():
                found.append(Segment(int(p.stem), p, p.stat().st_size))
        found.sort(key=lambda s: s.base)
        self._segments: tuple[Segment, ...] = tuple(found)
        self._bases: list[int] = [s.base for s in found]
        self._retired: list[Segment] = []

    # -- views -----------------------------------------------------------------------------------

    def all(self) -> tuple[Segment, ...]:
        return self._segments

    def bases(self) -> list[int]:
        return list(self._bases)

    @property
    def active(self) -> Segment | None:
        return self._segments[-1] if self._segments else None

    def min_offset(self) -> int:
        return self._segments[0].base if self._segments else 0

    def max_offset(self) -> int:
        return self._segments[-1].end if self._segments else 0

    def find(self, physical_offset: int) -> Segment:
        segs, bases = self._segments, self._bases
        i = bisect.bisect_right(bases, physical_offset) - 1
        if i < 0 or physical_offset >= segs[i].end:
            raise OffsetNotFound(
                f"commitlog position {physical_offset} is not stored on this broker (deleted by retention?)"
            )
        return segs[i]

    # -- reads -----------------------------------------------------------------------------------

    def read(self, physical_offset: int, size: int) -> bytes:
        seg = self.find(physical_offset)
        pos = physical_offset - seg.base
        if pos + size > seg.size:
            raise MessageCorrupted(
                f"record at {physical_offset} ({size} bytes) runs past the end of segment {seg.name()} "
                f"({seg.size} bytes)"
            )
        fd = seg.read_fd
        if fd < 0:
            with self._lock:
                if seg.read_fd < 0:
                    seg.read_fd = os.open(seg.path, os.O_RDONLY)
                fd = seg.read_fd
        data = os.pread(fd, size, pos)
        if len(data) != size:
            raise MessageCorrupted(f"short read at {physical_offset} in {seg.name()}: {len(data)} of {size} bytes")
        return data

    # -- writer side -----------------------------------------------------------------------------

    def create(self, base: int) -> Segment:
        path = self.dir / segment_name(base)
        fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644)
        os.close(fd)
        _fsync_dir(self.dir)
        seg = Segment(base, path, 0)
        with self._lock:
            assert not self._segments or base >= self._segments[-1].end, "segments must not overlap"
            self._segments = (*self._segments, seg)
            self._bases.append(base)
        return seg

    def grew(self, seg: Segment, new_size: int) -> None:
        """Record bytes the writer appended (called after the write succeeded)."""
        assert new_size >= seg.size
        seg.size = new_size

    def truncate(self, seg: Segment, size: int) -> None:
        os.truncate(seg.path, size)
        seg.size = size

    def remove_after(self, seg: Segment) -> list[Segment]:
        """Drop every segment after `seg` (used by recovery when it truncates in the middle)."""
        with self._lock:
            idx = self._segments.index(seg)
            dropped = list(self._segments[idx + 1 :])
            self._segments = self._segments[: idx + 1]
            self._bases = self._bases[: idx + 1]
        for s in dropped:
            s.path.unlink(missing_ok=True)
        _fsync_dir(self.dir)
        return dropped

    def delete_oldest(self) -> Segment:
        """Remove the oldest segment's file; its read descriptor is closed at the next call."""
        with self._lock:
            assert len(self._segments) > 1, "the active segment is never deleted"
            seg = self._segments[0]
            self._segments = self._segments[1:]
            self._bases = self._bases[1:]
            old, self._retired = self._retired, [seg]
        seg.path.unlink(missing_ok=True)
        for s in old:
            _close(s)
        return seg

    def close(self) -> None:
        with self._lock:
            for s in (*self._segments, *self._retired):
                _close(s)


def _close(seg: Segment) -> None:
    if seg.read_fd >= 0:
        os.close(seg.read_fd)
        seg.read_fd = -1


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
