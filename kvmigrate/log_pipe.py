"""Log records from worker processes to their parent, over a pipe per worker.

A `multiprocessing.Queue` did this before, but its locks are named semaphores, which the
resource tracker must reclaim when their process ends without its exit handlers (killed
at the end of a drain, dead of a crash): every such pool shutdown then warned about leaked
semaphores. A pipe is only file descriptors, which the kernel closes whatever happens.
"""

from __future__ import annotations

import contextlib
import logging
import logging.handlers
import multiprocessing
import threading
from multiprocessing.connection import Connection, wait

_POLL_S = 0.2


class PipeHandler(logging.handlers.QueueHandler):
    """In a worker: each record, made picklable as a QueueHandler makes it, sent to the
    parent. `Handler.handle` holds the handler's lock, so threads take turns on the pipe."""

    def __init__(self, conn: Connection) -> None:
        super().__init__(queue=None)  # type: ignore[arg-type]  # the pipe is the queue
        self._conn = conn

    def enqueue(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(OSError, ValueError):  # the parent is gone: no one to tell
            self._conn.send(record)


class LogRelay:
    """In the parent: a thread reads every worker's pipe and hands each record to this
    process's logger of the same name, so it goes through this process's handlers."""

    def __init__(self) -> None:
        self._readers: list[Connection] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def new_pipe(self) -> Connection:
        """A pipe for one worker: the end it writes to (give it to the worker at its start,
        then close this process's copy, so its end reads as the worker's exit)."""
        reader, writer = multiprocessing.Pipe(duplex=False)
        with self._lock:
            self._readers.append(reader)
        return writer

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="kvmigrate-log-relay")
            self._thread.daemon = True
            self._thread.start()

    def stop(self) -> None:
        """Relay what is already written, then stop reading and close every pipe."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._relay(0.0)
        with self._lock:
            readers, self._readers = self._readers, []
        for reader in readers:
            reader.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._relay(_POLL_S)

    def _relay(self, timeout: float) -> None:
        with self._lock:
            readers = list(self._readers)
        if not readers:
            self._stop.wait(timeout)
            return
        for reader in wait(readers, timeout):
            assert isinstance(reader, Connection)
            while self._relay_one(reader) and reader.poll(0):
                pass

    def _relay_one(self, reader: Connection) -> bool:
        try:
            record = reader.recv()
        except Exception:  # ended (EOF), or cut mid-record by a kill: this pipe is done
            with self._lock:
                if reader in self._readers:
                    self._readers.remove(reader)
            reader.close()
            return False
        if isinstance(record, logging.LogRecord):
            logging.getLogger(record.name).handle(record)
        return True
