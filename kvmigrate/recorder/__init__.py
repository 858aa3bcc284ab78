"""The recorder: every upstream call as a row, written in batches off the hot path."""

from kvmigrate.recorder.addon import RecorderAddon, build_recorder
from kvmigrate.recorder.queries import window_stats
from kvmigrate.recorder.record import Record
from kvmigrate.recorder.store import RecordStore, StoreError, open_store
from kvmigrate.recorder.writer import WriterSettings
from kvmigrate.wire.assemble import assemble

__all__ = [
    "Record",
    "RecordStore",
    "RecorderAddon",
    "StoreError",
    "WriterSettings",
    "assemble",
    "build_recorder",
    "open_store",
    "window_stats",
]
