"""Waiting until a running proxy has finished with what it was given, instead of sleeping:
the demo's wait (kvmigrate.demo.settle), failing the test when it gives up.

A proxy is settled when no shadow or noise copy is in flight and its recorder has written
(or dropped, and counted) one record for every exchange the proxy counted. Both figures are
the proxy's own metrics, so a busy machine only makes the wait longer, never the test wrong.
"""

from __future__ import annotations

import time

from kvmigrate.demo import settle


def wait_settled(url: str, timeout: float = 30.0, answers: int = 0) -> None:
    """Until the proxy at `url` is settled; an AssertionError after a generous `timeout`.

    `answers` (how many the test has read) waits until the proxy has counted them too: it
    counts an answer, and sends its shadow copy, just after the client has the last byte."""
    assert settle.wait_settled(url, timeout, answers), f"the proxy did not settle in {timeout} s"


def counted(url: str, answers: int, timeout: float = 30.0) -> dict[str, float]:
    """The proxy's metric totals once it has counted `answers` answers. The proxy counts an
    answer, and sends its copies in the same step, after the client has the last byte; a
    streamed client stops at `data: [DONE]`, before that byte. So a figure read from these
    totals already includes the copies of every answer counted."""
    deadline = time.monotonic() + timeout
    while (totals := settle.metric_totals(url))["served"] < answers:
        assert time.monotonic() < deadline, f"the proxy did not count {answers} answers"
        time.sleep(0.01)
    return totals
