"""A records database that fails, recovers, and fails again: each outage is logged at
error level (once, not per batch), and the recovery is said too. The second outage used to
be logged at debug level only, so at the default level the proxy dropped records in
silence.

The disk is "full" through RLIMIT_FSIZE in a child process (as in the fault matrix): every
write to a regular file fails with EFBIG; Python ignores SIGXFSZ. The child drives a real
RecordWriter over a real SQLite store, batch by batch on its own thread.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent(
    """
    import logging, resource, sys
    from kvmigrate.recorder.record import Record
    from kvmigrate.recorder.store import open_store
    from kvmigrate.recorder.writer import RecordWriter

    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(levelname)s %(message)s")
    url = sys.argv[1]
    open_store(url).close()  # migrated while the disk has room
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    count = 0

    def record():
        global count
        count += 1
        return Record(request_id=f"r{count}", ts=1.0, route="chat", backend="hosted",
                      role="serve", model="m", served_model="m", conversation="c", turn=1,
                      stream=False, status=200, source="proxy", content="none")

    writer = RecordWriter(lambda: open_store(url), convert=lambda item: item)
    for full in (False, True, True, False, False, True, True, False):
        resource.setrlimit(resource.RLIMIT_FSIZE, (0 if full else soft, hard))
        print("--- disk full" if full else "--- disk has room", flush=True)
        # Enough rows that a batch needs new pages of the WAL file.
        writer.write_records([record() for _ in range(200)])
    writer.stop()
    print("written", writer.stats.written, "errors", writer.stats.write_errors)
    """
)


def test_each_outage_is_logged_once_and_each_recovery_too(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/records.db"
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, url], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[-1] == "written 800 errors 4", done.stdout
    failed = [i for i, line in enumerate(lines) if line.startswith("ERROR recorder: writing")]
    recovered = [i for i, line in enumerate(lines) if line.startswith("INFO recorder: writing")]
    # Two outages of two batches each: one error line per outage, one line per recovery.
    assert len(failed) == 2, done.stdout
    assert len(recovered) == 2, done.stdout
    assert failed[0] < recovered[0] < failed[1] < recovered[1], done.stdout
