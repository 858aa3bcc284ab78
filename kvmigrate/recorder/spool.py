"""One lane's spool: the exchanges a proxy answered, appended to files before a recorder
worker writes them, so that a crash of the proxy or of the worker loses none of them.

A lane's directory holds segments named by the byte offset they start at (as Kafka names
its log segments), so a position in the lane is one number that never goes back. The
proxy's feeder thread appends frames (`SpoolWriter`); the lane's worker process reads them
(`SpoolReader`), writes their records, then stores how far it got in `ack` and removes the
segments it has passed. Whoever reads a lane after a crash (the next worker, or the next
proxy's replay) starts at `ack`: a frame written to the records store but not yet acked is
read again, and the store skips a request id it already holds.

A frame is a header (kind, length, CRC-32, item count, wall-clock time written) and a
msgpack payload: data read back from disk is never unpickled. A frame cut short by a
process killed in mid-write is shorter than its header says, and ends what is read of its
segment. The CRC is there for a machine's crash, after which a file may hold blocks never
written: it is computed only when the spool is synced (record.durability: fsync), as it
would cost the proxy's process about as much CPU as the rest of the spooling; 0 is none.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import struct
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("kvmigrate.recorder")

HEADER = struct.Struct("<2sHIIId")  # magic, kind, payload length, CRC-32, items, written at
MAGIC = b"KS"
EXCHANGES, TALLY = 1, 2  # frame kinds: packed exchanges; answered counts (recorder.tally)
SEGMENT_BYTES = 8 << 20
_SUFFIX = ".seg"
_ACK = struct.Struct("<QI")  # committed offset, CRC-32 of it
FILE_MODE = 0o600


@dataclass(frozen=True, slots=True)
class Frame:
    kind: int
    items: int
    written_at: float
    payload: bytes
    end: int  # the lane offset just past this frame


def _segment_name(base: int) -> str:
    return f"{base:016d}{_SUFFIX}"


def segments(directory: Path) -> list[int]:
    """The base offsets of the lane's segments, in order."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted(int(n[: -len(_SUFFIX)]) for n in names if n.endswith(_SUFFIX))


class SpoolWriter:
    """Appends frames to a lane (the proxy's feeder thread only). `sync`: fdatasync what was
    appended whenever `sync_now` is called, and the directory when a segment is created."""

    def __init__(self, directory: Path, sync: bool = False, segment_bytes: int = SEGMENT_BYTES):
        self.directory = directory  # a new lane's: each process spools to its own
        self.end = 0
        self._sync = sync
        self._segment_bytes = segment_bytes
        self._fd: int | None = None
        self._base = self.end
        self._dirty = False

    def append(self, kind: int, payload: bytes, items: int) -> int:
        """One frame, in one write; returns the lane's new end. On an error (a full disk)
        the segment is cut back to its last whole frame and the error raised."""
        if self._fd is None or self.end - self._base >= self._segment_bytes:
            self._rotate()
        assert self._fd is not None
        crc = zlib.crc32(payload) if self._sync else 0
        header = HEADER.pack(MAGIC, kind, len(payload), crc, items, time.time())
        try:
            _write_all(self._fd, header, payload)
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, self.end - self._base)
            raise
        self.end += HEADER.size + len(payload)
        self._dirty = True
        return self.end

    def sync_now(self) -> None:
        """Group commit: what was appended since the last call reaches the disk."""
        if self._sync and self._dirty and self._fd is not None:
            _datasync(self._fd)
            self._dirty = False

    def close(self) -> None:
        if self._fd is not None:
            self.sync_now()
            os.close(self._fd)
            self._fd = None

    def _rotate(self) -> None:
        self.close()
        self._base = self.end
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC
        self._fd = os.open(self.directory / _segment_name(self._base), flags, FILE_MODE)
        if self._sync:
            fsync_directory(self.directory)


def _write_all(fd: int, header: bytes, payload: bytes) -> None:
    written = os.writev(fd, [header, payload])
    total = len(header) + len(payload)
    while written < total:  # a short write (a signal, a nearly full disk): the rest
        rest = (header + payload)[written:]
        written += os.write(fd, rest)


# macOS has no fdatasync: fsync does there what it does here.
_datasync = getattr(os, "fdatasync", os.fsync)


def fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class SpoolReader:
    """Reads a lane's frames from its last acked offset (one reader at a time: the lane's
    lock, recorder.spool_dir, says which)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        bases = segments(directory)
        acked = read_ack(directory)
        self.committed = max(acked, bases[0]) if bases else acked
        self.position = self.committed
        self.torn = 0  # frames cut short by a crash, skipped
        self._fd: int | None = None
        self._base = -1
        self._ack_fd: int | None = None

    def read(self, max_bytes: int, final: bool = False) -> list[Frame]:
        """The whole frames from `position`, about `max_bytes` of them. A frame not whole
        yet is left for a later call, unless its segment is finished (a later one exists)
        or `final` (the lane's writer is gone): then a crash cut it short, and it is
        skipped."""
        frames: list[Frame] = []
        size = 0
        bases = segments(self.directory)
        while size < max_bytes:
            base = _containing(bases, self.position)
            if base is None:
                break
            self.position = max(self.position, base)
            frame = self._frame_at(base)
            if frame is None:
                # The writer creates a segment only once it is done with the one before:
                # with a later one listed, a second look at this one is conclusive.
                bases = segments(self.directory)
                later = _after(bases, base)
                if later is None and not final:
                    break  # the end of what is written so far
                frame = self._frame_at(base)
                if frame is None:
                    self._skip_torn(base)
                    if later is None:
                        break
                    self.position = later
                    continue
            frames.append(frame)
            size += len(frame.payload)
            self.position = frame.end
        return frames

    def _frame_at(self, base: int) -> Frame | None:
        if base != self._base or self._fd is None:
            self._close_segment()
            try:
                self._fd = os.open(self.directory / _segment_name(base), os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                return None
            self._base = base
        offset = self.position - base
        head = os.pread(self._fd, HEADER.size, offset)
        if len(head) < HEADER.size:
            return None
        magic, kind, length, crc, items, written_at = HEADER.unpack(head)
        if magic != MAGIC:
            return None
        payload = os.pread(self._fd, length, offset + HEADER.size)
        if len(payload) < length or (crc and zlib.crc32(payload) != crc):
            return None
        return Frame(kind, items, written_at, payload, self.position + HEADER.size + length)

    def _skip_torn(self, base: int) -> None:
        """Past the rest of a segment whose next frame a crash cut short."""
        try:
            size = os.stat(self.directory / _segment_name(base)).st_size
        except FileNotFoundError:
            return
        if self.position - base < size:
            self.torn += 1
            log.warning(
                "recorder: a frame cut short by a crash at offset %d of the spool %s: "
                "the records it held are lost",
                self.position,
                self.directory,
            )
        self.position = base + size

    def commit(self, offset: int) -> None:
        """Everything before `offset` is in the records store (or counted as dropped): say
        so in `ack`, and remove the segments wholly before it."""
        if offset <= self.committed:
            return
        if self._ack_fd is None:
            flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC
            self._ack_fd = os.open(self.directory / "ack", flags, FILE_MODE)
        os.pwrite(self._ack_fd, _ACK.pack(offset, zlib.crc32(offset.to_bytes(8, "little"))), 0)
        self.committed = offset
        bases = segments(self.directory)
        for base, following in itertools.pairwise(bases):
            if following <= offset:
                if base == self._base:
                    self._close_segment()
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.directory / _segment_name(base))

    def backlog_age(self, now: float) -> float:
        """How long the oldest frame not yet committed has waited (0: none). Safe to call
        from another thread than the one reading: it opens its own files."""
        bases = segments(self.directory)
        first = _containing(bases, self.committed)
        for base in bases[bases.index(first) :] if first is not None else ():
            try:
                with open(self.directory / _segment_name(base), "rb") as segment:
                    segment.seek(max(0, self.committed - base))
                    head = segment.read(HEADER.size)
            except FileNotFoundError:
                continue
            if len(head) == HEADER.size and head[:2] == MAGIC:
                return max(0.0, now - float(HEADER.unpack(head)[5]))
        return 0.0

    def close(self) -> None:
        self._close_segment()
        if self._ack_fd is not None:
            os.close(self._ack_fd)
            self._ack_fd = None

    def _close_segment(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            self._base = -1


def read_ack(directory: Path) -> int:
    """The committed offset in `ack`; 0 when there is none, or it does not check out."""
    try:
        data = (directory / "ack").read_bytes()
    except FileNotFoundError:
        return 0
    if len(data) < _ACK.size:
        return 0
    offset, crc = _ACK.unpack(data[: _ACK.size])
    return offset if zlib.crc32(offset.to_bytes(8, "little")) == crc else 0


def _containing(bases: list[int], position: int) -> int | None:
    """The segment `position` lies in: the last one starting at or before it, or the first
    one when every segment starts after it (segments before it are gone)."""
    found = None
    for base in bases:
        if base <= position:
            found = base
        elif found is None:
            return base
        else:
            break
    return found


def _after(bases: list[int], base: int) -> int | None:
    return next((b for b in bases if b > base), None)
