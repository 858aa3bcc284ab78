"""The spools of proxy processes that are gone, written to the records store by the next
recorder to start (a process of its own, at the raised priority: this is catching up).

For each such spool (its owner lock free, recorder.spool_dir) it waits for the lanes'
own workers to let go (an orphan exits within a fraction of a second of its proxy's
death), reads each lane from its last ack, writes the records under the dead process's
`source`, and removes the directory. A spool its process did not mark as stopped cleanly
is noted in `unclean_stops`: the answers of its last moments, not yet spooled, are not
counted anywhere else. Stopped part-way (the proxy stopping, or killed), it leaves the
rest, acked as far as it got, to the next start.
"""

from __future__ import annotations

import logging
import os
import shutil
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from kvmigrate.config import safe_url
from kvmigrate.recorder.batches import Batches
from kvmigrate.recorder.crossing import SHARED_COUNTERS, WorkerSpec
from kvmigrate.recorder.spool import SpoolReader
from kvmigrate.recorder.spool_dir import (
    LANE_LOCK,
    STOPPED,
    hold,
    lanes,
    last_touched,
    orphaned_spools,
    spool_meta,
)
from kvmigrate.recorder.worker_main import READ_BYTES, log_to, open_writer

log = logging.getLogger("kvmigrate.recorder")
_WRITTEN = SHARED_COUNTERS.index("written")
_WRITE_ERROR = SHARED_COUNTERS.index("write_error")
# How long a lane's worker, orphaned when its proxy died, may take to let go of the lane.
LANE_WAIT_S = 10.0


def run_replay(
    conn: Connection,
    spec_state: tuple[Any, ...],
    shared: Any,
    logs: Connection,
    log_level: int,
    write_lock: str | None,
    root: str,
    own: str,
) -> None:
    log_to(logs, log_level)
    replayer = _Replayer(conn, WorkerSpec.from_state(spec_state), shared, write_lock)
    for directory, owner in orphaned_spools(Path(root), Path(own)):
        try:
            replayer.replay(directory)
        finally:
            os.close(owner)
        if replayer.told_to_stop():
            return


class _Replayer:
    def __init__(
        self, conn: Connection, spec: WorkerSpec, shared: Any, write_lock: str | None
    ) -> None:
        self.conn = conn
        self.spec = spec
        self.shared = shared
        self.write_lock = write_lock
        self.written = 0  # records, over every spool replayed, as published
        self.write_errors = 0

    def told_to_stop(self) -> bool:
        try:
            return self.conn.poll(0)  # a stop, or the proxy gone
        except (EOFError, OSError):
            return True

    def replay(self, directory: Path) -> None:
        source, db = spool_meta(directory)
        if db and db != safe_url(self.spec.url):
            # A spool_dir shared by proxies of different records databases: not ours.
            return
        source = source or self.spec.source
        before = self.written
        for lane in lanes(directory):
            if not self._replay_lane(lane, source):
                return  # left, acked as far as it got, to the next start
        replayed = self.written - before
        if not (directory / STOPPED).exists():
            self._note_unclean_stop(source, last_touched(directory), replayed)
        shutil.rmtree(directory, ignore_errors=True)
        if replayed:
            log.warning(
                "recorder: wrote %d records from the spool of %s, a proxy process that is gone",
                replayed,
                source,
            )

    def _replay_lane(self, lane: Path, source: str) -> bool:
        """Whether the lane was read to its end (False: left for a later start)."""
        fd = hold(lane / LANE_LOCK, wait_s=LANE_WAIT_S)
        if fd is None:
            log.warning("recorder: the spool lane %s is still held; left for later", lane)
            return False
        reader = SpoolReader(lane)
        writer = open_writer(self.spec, source, self.write_lock)
        batches = Batches(writer, self.spec.settings, self.shared, source)
        try:
            return self._read_lane(reader, batches)
        finally:
            writer.stop()
            reader.close()
            os.close(fd)

    def _read_lane(self, reader: SpoolReader, batches: Batches) -> bool:
        """Batch by batch, each acked once written."""
        written, errors = self.written, self.write_errors
        stats = batches.writer.stats
        while True:
            if not batches.raw:
                frames = reader.read(READ_BYTES, final=True)
                if not frames:
                    return True
                for frame in frames:
                    batches.take_frame(frame)
            batches.convert(lambda: len(batches.records) >= batches.settings.batch_size)
            if batches.flush():
                reader.commit(batches.written_to)
            self.written = written + stats.written
            self.write_errors = errors + stats.dropped.get("write_error", 0)
            self.shared[_WRITTEN] = self.written
            self.shared[_WRITE_ERROR] = self.write_errors
            if self.told_to_stop():
                return False

    def _note_unclean_stop(self, source: str, ts: float, replayed: int) -> None:
        from kvmigrate.recorder.store import open_store

        try:
            with open_store(self.spec.url) as store:
                store.note_unclean_stop(source, ts, replayed)
        except Exception as exc:  # the records are written; only the note is missing
            log.error("recorder: cannot note the unclean stop of %s (%s)", source, exc)
