"""Waiting until a running proxy has finished with what it was given, instead of sleeping.

A proxy is settled when no shadow or noise copy is in flight and its recorder has written
(or dropped, and counted) one record for every exchange the proxy counted. Both figures are
the proxy's own metrics, so a busy machine only makes the wait longer, never the test wrong.
"""

from __future__ import annotations

import time
import urllib.request


def metric_totals(url: str) -> dict[str, float]:
    """Each metric's samples summed over their labels, from the proxy's /metrics."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    totals: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        name = head.partition("{")[0]
        totals[name] = totals.get(name, 0.0) + float(value)
    return totals


def served_answers(url: str) -> float:
    """The answers the proxy has counted as served (role "serve", any backend)."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    return sum(
        float(line.rpartition(" ")[2])
        for line in text.splitlines()
        if line.startswith("kvmigrate_requests_total{") and 'role="serve"' in line
    )


def is_settled(url: str, answers: int = 0) -> bool:
    m = metric_totals(url)
    exchanges = m.get("kvmigrate_requests_total", 0.0)
    accounted = m.get("kvmigrate_records_written_total", 0.0) + m.get(
        "kvmigrate_records_dropped_total", 0.0
    )
    settled = m.get("kvmigrate_shadow_inflight", 0.0) == 0 and accounted >= exchanges
    return settled and (answers == 0 or served_answers(url) >= answers)


def wait_settled(url: str, timeout: float = 30.0, answers: int = 0) -> None:
    """Until the proxy at `url` is settled; an AssertionError after a generous `timeout`.

    A proxy counts an answer, and sends its shadow copy, just after the client has the
    last byte: a test that has just read an answer can find the proxy "settled" before
    either. `answers` (how many the test has read) closes that gap."""
    deadline = time.monotonic() + timeout
    while not is_settled(url, answers):
        assert time.monotonic() < deadline, f"the proxy did not settle in {timeout} s"
        time.sleep(0.05)
