"""What a worker process of the proxy's (the recorder's, the cache-buster detector's) does
first: step out of the way of the response path."""

from __future__ import annotations

import contextlib
import os
import signal

# The lowest priority: on Linux the SCHED_IDLE policy (any ordinary task that wakes up
# preempts it at once), elsewhere nice 19. When a worker shares a core with a busy proxy (a
# pinned proxy, a pod's CPU limit), it no longer takes the quarter of that core that nice +5
# got: with benchmarks/proxy_overhead.py (the proxy pinned to one core with its workers)
# streamed c=64 went from 75 ms added at p50 and 791 req/s to 34 ms and 1,588 req/s, level
# with the proxy without them; benchmarks/recorder_loop_lag.py at 8,000 records/s on two
# workers went from 4.5 ms of p99 event-loop lateness (nice 19 alone) to 2.7 ms (no
# recorder: 1.1 ms). The cost: a saturated core leaves the workers behind, and their
# bounded queues drop, and count, what does not fit. With a core to spare they run at full
# speed.
BACKGROUND_NICE = 19


def become_background_worker() -> None:
    """Lowest CPU priority, and deaf to SIGINT: a Ctrl-C reaches the whole process group,
    and the proxy decides when its workers stop (after writing what they hold)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with contextlib.suppress(OSError):
        os.nice(BACKGROUND_NICE - os.nice(0))
    with contextlib.suppress(OSError, AttributeError):  # SCHED_IDLE is Linux's
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
