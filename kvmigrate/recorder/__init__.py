"""The recorder: every upstream call as a row, written in batches off the hot path.

The names below load on first use: a command that only reads records (`report`, `plan`)
must not pay for the proxy-side recorder's imports (kvmigrate.lazy.package_exports)."""

from typing import TYPE_CHECKING

from kvmigrate.lazy import package_exports

if TYPE_CHECKING:
    from kvmigrate.recorder.addon import RecorderAddon, build_recorder
    from kvmigrate.recorder.queries import window_stats
    from kvmigrate.recorder.record import Record
    from kvmigrate.recorder.store import RecordStore, StoreError, open_store
    from kvmigrate.recorder.writer import WriterSettings
    from kvmigrate.wire.assemble import assemble

_ADDON = "kvmigrate.recorder.addon"
_STORE = "kvmigrate.recorder.store"
__getattr__ = package_exports(
    __name__,
    {
        "RecorderAddon": _ADDON,
        "build_recorder": _ADDON,
        "window_stats": "kvmigrate.recorder.queries",
        "Record": "kvmigrate.recorder.record",
        "RecordStore": _STORE,
        "StoreError": _STORE,
        "open_store": _STORE,
        "WriterSettings": "kvmigrate.recorder.writer",
        "assemble": "kvmigrate.wire.assemble",
    },
)

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
