"""How many exchanges each proxy process answered, per minute: what the report holds the
records against, so that an answer without a record is counted, not silently missing.

The proxy's feeder thread counts what it takes from the response path's queue (and what
that queue had to drop), by the minute each exchange started and its role, and spools the
running totals for the minutes that changed (a `TALLY` frame, recorder.spool); the lane's
worker writes them to the `answered` table with its next batch, keeping the larger count,
so a total written twice, or replayed after a crash, counts once. Not counted: the
answers a crashed process had not spooled yet (the last feed interval before a kill -9);
the replay of its spool notes the crash in `unclean_stops` instead.
"""

from __future__ import annotations

BUCKET_S = 60.0
# Minutes kept in memory: an exchange that started longer ago than this (a very long
# stream) counts into a fresh total for its minute, which the larger stored one hides.
KEEP_S = 24 * 3600.0


def bucket_of(ts: float) -> float:
    return ts - ts % BUCKET_S


class AnsweredTally:
    """Running totals per (minute, role); one thread (the feeder) counts and reads."""

    def __init__(self) -> None:
        self._totals: dict[tuple[float, str], int] = {}
        self._changed: set[tuple[float, str]] = set()
        self._pruned = 0.0

    def count(self, ts: float, role: str) -> None:
        key = (ts - ts % BUCKET_S, role)  # a Role is the str it stands for
        self._totals[key] = self._totals.get(key, 0) + 1
        self._changed.add(key)

    def changes(self, now: float) -> list[tuple[float, str, int]]:
        """The totals counted since the last call, as (minute, role, total)."""
        rows = [(bucket, str(role), self._totals[bucket, role]) for bucket, role in self._changed]
        self._changed.clear()
        if now - self._pruned >= BUCKET_S:
            self._pruned = now
            for key in [k for k in self._totals if k[0] < now - KEEP_S]:
                del self._totals[key]
        return rows
