"""Turn a termination signal into an exception, so `with` blocks that own child processes
(a vLLM server, a proxy, an emulator) stop them on the way out.

Python unwinds on SIGINT (KeyboardInterrupt) but dies on SIGTERM or SIGHUP without running
a single `finally`: a benchmark killed by a timeout, a CI runner or a closed terminal left
its vLLM (three processes, gigabytes of memory) running. Inside `exit_on_signals()` those
signals raise SystemExit(128 + signal), the exit status a shell gives a process it killed.

>>> with exit_on_signals(), VllmServer(model) as server:
...     run(server)  # SIGTERM here stops the server's process group, then exits 143
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


def _raise(signum: int, frame: FrameType | None) -> None:
    # Once unwinding, a second signal must not interrupt the cleanup it is waiting for.
    for each in SIGNALS:
        signal.signal(each, signal.SIG_IGN)
    raise SystemExit(128 + signum)


@contextmanager
def exit_on_signals() -> Iterator[None]:
    """Within the block, SIGTERM, SIGHUP and SIGINT raise SystemExit; the previous handlers
    come back after it. Only in the main thread, where Python runs signal handlers."""
    previous = {each: signal.signal(each, _raise) for each in SIGNALS}
    try:
        yield
    finally:
        for each, handler in previous.items():
            signal.signal(each, handler)
