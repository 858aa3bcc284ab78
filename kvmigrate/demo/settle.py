"""Waiting until the demo's proxy has recorded what it was sent, instead of sleeping.

The proxy is settled when no shadow or noise copy is in flight and its recorder has written,
or dropped and counted, one record per upstream exchange: both are the proxy's own metrics.
The recorder runs at the lowest CPU priority, so on a busy machine it can be seconds behind
the traffic; a report or a gate read before then sees conversations without their turns.
"""

from __future__ import annotations

import time
import urllib.request

SETTLE_TIMEOUT_S = 60.0  # only a stuck recorder takes this long; the demo then goes on


def metric_totals(url: str) -> dict[str, float]:
    """Each metric's samples summed over their labels, from the proxy's /metrics."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    totals: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            head, _, value = line.rpartition(" ")
            name = head.partition("{")[0]
            totals[name] = totals.get(name, 0.0) + float(value)
    return totals


def is_settled(url: str) -> bool:
    m = metric_totals(url)
    exchanges = m.get("kvmigrate_requests_total", 0.0)
    accounted = m.get("kvmigrate_records_written_total", 0.0) + m.get(
        "kvmigrate_records_dropped_total", 0.0
    )
    return m.get("kvmigrate_shadow_inflight", 0.0) == 0 and accounted >= exchanges


def wait_settled(url: str, timeout: float = SETTLE_TIMEOUT_S) -> bool:
    """Until the proxy at `url` is settled, or `timeout`; whether it settled."""
    deadline = time.monotonic() + timeout
    while not is_settled(url):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
