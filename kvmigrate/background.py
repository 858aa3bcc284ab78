"""What a worker process of the proxy's (the recorder's, the cache-buster detector's) does
first: step out of the way of the response path."""

from __future__ import annotations

import contextlib
import os
import signal

# The lowest priority. When a worker shares a core with a busy proxy (a pinned proxy, a
# pod's CPU limit), the scheduler gives it about 1.5% of that core instead of the 25% that
# nice +5 got: measured with benchmarks/proxy_overhead.py, the proxy pinned to one core with
# its workers, streamed c=64 went from 75 ms added at p50 and 791 req/s to 34 ms and
# 1,588 req/s, level with the proxy without them. The cost: a saturated core leaves the
# workers behind, and their bounded queues drop, and count, what does not fit. With a core
# to spare they run at full speed.
BACKGROUND_NICE = 19


def become_background_worker() -> None:
    """Lowest CPU priority, and deaf to SIGINT: a Ctrl-C reaches the whole process group,
    and the proxy decides when its workers stop (after writing what they hold)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with contextlib.suppress(OSError):
        os.nice(BACKGROUND_NICE - os.nice(0))
