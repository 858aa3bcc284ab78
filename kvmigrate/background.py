"""What a worker process of the proxy's (the recorder's, the cache-buster detector's) does
first: step out of the way of the response path."""

from __future__ import annotations

import contextlib
import os
import signal

# The lowest priority: on Linux the SCHED_IDLE policy (any ordinary task that wakes up
# preempts it at once), elsewhere nice 19. When a worker shares a core with a busy proxy (a
# pinned proxy, a pod's CPU limit), it no longer takes the quarter of that core that nice +5
# got, and the proxy runs about as fast as without workers (benchmarks/proxy_overhead.py,
# benchmarks/recorder_loop_lag.py; the figures are in docs/performance-history.md). The
# cost: a saturated core leaves the workers behind, and their bounded queues drop, and
# count, what does not fit. With a core to spare they run at full speed.
BACKGROUND_NICE = 19


def become_background_worker() -> None:
    """Lowest CPU priority, and deaf to SIGINT: a Ctrl-C reaches the whole process group,
    and the proxy decides when its workers stop (after writing what they hold)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with contextlib.suppress(OSError):
        os.nice(BACKGROUND_NICE - os.nice(0))
    with contextlib.suppress(OSError, AttributeError):  # SCHED_IDLE is Linux's
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
