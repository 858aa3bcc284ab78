"""The cyclic garbage collector's settings for a process that serves until it is stopped."""

from __future__ import annotations

import gc

# CPython collects its youngest generation every 700 net container allocations: on the
# proxy's request path with shadow copies and the recorder, every seven or eight requests,
# each collection scanning the in-flight requests' objects and promoting them, so that the
# older generations' collections scan them again, and every 900 or so requests a full
# collection of the whole heap, a long pause under load. At this threshold most of a
# request's objects die by reference count before any collection sees them
# (benchmarks/proxy_overhead.py measures the CPU per request).
YOUNG_THRESHOLD = 10_000


def settle_collector() -> None:
    """Once a server is up: what exists now (modules, config, the app) lives as long as the
    process, so it is frozen out of every later collection, and the youngest generation is
    collected less often. Under load with shadow copies, collections with CPython's
    defaults were a large share of the CPU per request, and these settings cut it to a
    fraction; the longest pause went from a full collection's to a young one's
    (benchmarks/proxy_overhead.py and benchmarks/cpu_ab.py measure it)."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
