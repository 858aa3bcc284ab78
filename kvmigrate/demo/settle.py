"""Waiting until a running proxy has finished with what it was sent, instead of sleeping.

The proxy is settled when no shadow or noise copy is in flight and its recorder has written,
or dropped and counted, one record per upstream exchange: both are the proxy's own metrics.
The recorder runs at the lowest CPU priority, so on a busy machine it can be seconds behind
the traffic; a report or a gate read before then sees conversations without their turns.
The demo waits here before its report; the tests wait here too (tests/settling.py).
"""

from __future__ import annotations

import time
import urllib.request

SETTLE_TIMEOUT_S = 60.0  # only a stuck recorder takes this long; the demo then goes on
SERVED = "kvmigrate_requests_total{"


def metric_totals(url: str) -> dict[str, float]:
    """Each metric's samples summed over their labels, from the proxy's /metrics; and, as
    `served`, the answers counted with role "serve" (any backend)."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    totals: dict[str, float] = {"served": 0.0}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        name = head.partition("{")[0]
        totals[name] = totals.get(name, 0.0) + float(value)
        if head.startswith(SERVED) and 'role="serve"' in head:
            totals["served"] += float(value)
    return totals


def is_settled(url: str, answers: int = 0) -> bool:
    """`answers`: how many answers the caller has read. The proxy counts an answer, and
    sends its copies, just after the client has its last byte, so a caller that has just
    read one can find the proxy "settled" before either."""
    m = metric_totals(url)
    exchanges = m.get("kvmigrate_requests_total", 0.0)
    accounted = m.get("kvmigrate_records_written_total", 0.0) + m.get(
        "kvmigrate_records_dropped_total", 0.0
    )
    settled = m.get("kvmigrate_shadow_inflight", 0.0) == 0 and accounted >= exchanges
    return settled and m["served"] >= answers


def wait_settled(url: str, timeout: float = SETTLE_TIMEOUT_S, answers: int = 0) -> bool:
    """Until the proxy at `url` is settled, or `timeout`; whether it settled."""
    deadline = time.monotonic() + timeout
    while not is_settled(url, answers):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
