"""The recorded conversations of a report's window, for the cache-buster section, read a
bounded batch at a time.

The section checks what `recorded_requests` exports, read as `cachecheck.parse_lines` reads
it. Read that way the whole window is in memory at once: every request body, its history
resent each turn. Here, two passes:

1. `Window.read` reads no bodies, only each record's conversation and its place in the
   window's order (ts, request_id). A record without a conversation id is the exception:
   `parse_lines` groups it by its body (its `user`, else its first user message), so its
   body is read, a batch at a time, and dropped.
2. `Window.conversations` reads whole conversations, a batch of records at a time (one
   longer conversation alone), looked up by their timestamps through the `ts` index (the
   records table has no index on conversation: m005 dropped it to keep inserts cheap), and
   yields each with the place of its first readable request, where `parse_lines` lists it.

Bodies held at once are bounded by the batch (`batch_rows`, or one longer conversation),
not by the window. What the first pass keeps is 16 bytes a record (its position and
timestamp), and a request id for a record without a conversation id.

A conversation's history is inflated once per batch rather than once per page of the
window it has a turn in, and is never dumped to JSON and parsed back.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvmigrate.cachecheck import Conversation
from kvmigrate.cachecheck.checker import CHECKED_ROUTES
from kvmigrate.cachecheck.dataset import Item, line_item, ordered_turns
from kvmigrate.recorder.export import request_line
from kvmigrate.recorder.history import inflate_rows
from kvmigrate.recorder.store import RecordStore

_PAGE = 5_000
_CHUNK = 500  # values per IN (...), under SQLite's variable limit
_ROUTES = tuple(sorted(CHECKED_ROUTES))
# The records `recorded_requests` exports for the checked routes.
_WINDOW = (
    "ts >= ? AND ts < ? AND role = 'serve' AND request_json IS NOT NULL "
    f"AND route IN ({', '.join('?' for _ in _ROUTES)})"
)
_LINE = "request_id, route, model, conversation, turn, backend, request_json, request_messages"
_KEYLESS = "(conversation IS NULL OR conversation = '')"
# The first pass: a line's columns, the body only where it names the conversation.
_INDEX = (
    "request_id, route, model, conversation, turn, backend, "
    f"CASE WHEN {_KEYLESS} THEN request_json END, "
    f"CASE WHEN {_KEYLESS} THEN request_messages END, ts"
)
_WHERE = "records"  # what a DatasetError would name; a line built here raises none


@dataclass(slots=True)
class _Group:
    """One conversation of one cohort as the first pass found it: the window positions and
    timestamps of its records found by their conversation column, and the positions and
    request ids of those grouped by their body."""

    first: int
    keyed: array[int] = field(default_factory=lambda: array("q"))
    stamps: array[float] = field(default_factory=lambda: array("d"))
    keyless: list[tuple[int, str]] = field(default_factory=list)

    @property
    def size(self) -> int:
        return len(self.keyed) + len(self.keyless)


@dataclass(slots=True)
class Window:
    store: RecordStore
    since: float
    until: float
    cohort_of: Mapping[str, str]
    batch_rows: int  # records whose bodies are held at once (more only for one conversation)
    groups: dict[str, dict[str, _Group]] = field(default_factory=dict)  # cohort -> key -> group
    # Cohorts with a request whose body could be read: those parse_lines would be given.
    found: set[str] = field(default_factory=set)

    @classmethod
    def read(
        cls,
        store: RecordStore,
        since: float,
        until: float,
        cohort_of: Mapping[str, str],
        batch_rows: int,
    ) -> Window:
        """The first pass (see the module docstring)."""
        window = cls(store, since, until, cohort_of, batch_rows)
        keyless: list[tuple[int, str, tuple[Any, ...]]] = []
        for position, row in enumerate(_window_rows(store, since, until)):
            cohort = cohort_of.get(str(row[0]), "")
            if isinstance(row[3], str) and row[3]:
                group = window._group(cohort, row[3], position)
                group.keyed.append(position)
                group.stamps.append(row[8])
                continue
            keyless.append((position, cohort, row))
            if len(keyless) >= batch_rows:
                window._group_keyless(keyless)
                keyless = []
        window._group_keyless(keyless)
        return window

    def conversations(self, cohort: str) -> Iterator[tuple[int, int, Conversation]]:
        """The cohort's conversations as (first position of its group, position of its first
        readable request, conversation), in the order of the first. A group whose first
        records cannot be read is listed later by `parse_lines`: the caller reorders."""
        groups = sorted(self.groups.get(cohort, {}).items(), key=lambda kv: kv[1].first)
        batch: list[tuple[str, _Group]] = []
        size = 0
        for key, group in groups:
            if batch and size + group.size > self.batch_rows:
                yield from self._batch(cohort, batch)
                batch, size = [], 0
            batch.append((key, group))
            size += group.size
        yield from self._batch(cohort, batch)

    def _group(self, cohort: str, key: str, position: int) -> _Group:
        groups = self.groups.setdefault(cohort, {})
        group = groups.get(key)
        if group is None:
            group = groups[key] = _Group(position)
        # Keyless records are grouped a page late, after keyed ones that follow them.
        group.first = min(group.first, position)
        return group

    def _group_keyless(self, rows: Sequence[tuple[int, str, tuple[Any, ...]]]) -> None:
        bodies = inflate_rows(self.store, [(row[6], row[7]) for _, _, row in rows])
        for (position, cohort, row), body in zip(rows, bodies, strict=True):
            if body is None:
                continue
            self.found.add(cohort)
            item = line_item(request_line(row, body), _WHERE)
            if item is not None:
                self._group(cohort, item.conversation, position).keyless.append((position, row[0]))

    def _batch(
        self, cohort: str, batch: Sequence[tuple[str, _Group]]
    ) -> Iterator[tuple[int, int, Conversation]]:
        placed = self._rows(cohort, batch)
        # One inflation for the batch: a history shared by its turns is read and parsed once.
        bodies = iter(inflate_rows(self.store, [(r[6], r[7]) for rows in placed for _, r in rows]))
        for (_, group), rows in zip(batch, placed, strict=True):
            items: list[Item] = []
            start = group.first
            for position, row in rows:
                body = next(bodies)
                if body is None:
                    continue
                self.found.add(cohort)
                item = line_item(request_line(row, body), _WHERE)
                if item is not None:
                    if not items:
                        start = position
                    items.append(item)
            if items:
                yield group.first, start, Conversation(items[0].conversation, ordered_turns(items))

    def _rows(
        self, cohort: str, batch: Sequence[tuple[str, _Group]]
    ) -> list[list[tuple[int, tuple[Any, ...]]]]:
        """Each group's records with their window positions, in window order."""
        by_key: dict[str, list[tuple[Any, ...]]] = {key: [] for key, g in batch if g.keyed}
        stamps = sorted({ts for _, group in batch for ts in group.stamps})
        for row in self._query("ts", stamps):
            # Another conversation's record at the same instant is not this batch's.
            rows = by_key.get(row[3]) if isinstance(row[3], str) else None
            if rows is not None and self.cohort_of.get(str(row[0]), "") == cohort:
                rows.append(row)
        by_id = {row[0]: row for row in self._query("request_id", _keyless_ids(batch))}
        placed = []
        for key, group in batch:
            # zip, not strict: a record pruned since the first pass is simply missing. One
            # written since is not looked up, unless at an instant already listed.
            rows = list(zip(group.keyed, by_key.get(key, ()), strict=False))
            rows += [(p, by_id[i]) for p, i in group.keyless if i in by_id]
            rows.sort(key=lambda pr: pr[0])
            placed.append(rows)
        return placed

    def _query(self, column: str, values: Sequence[Any]) -> Iterator[tuple[Any, ...]]:
        """The window's records whose `column` is one of `values`, through that column's
        index. Sorted `values` give the timestamps' records in window order."""
        for start in range(0, len(values), _CHUNK):
            chunk = values[start : start + _CHUNK]
            sql = (
                f"SELECT {_LINE} FROM records WHERE {_WINDOW} "
                f"AND {column} IN ({', '.join('?' for _ in chunk)}) ORDER BY ts, request_id"
            )
            yield from self.store.query(sql, (self.since, self.until, *_ROUTES, *chunk))


def _window_rows(store: RecordStore, since: float, until: float) -> Iterator[tuple[Any, ...]]:
    """The first pass's columns of the window's records, in window order, a page at a time
    (keyed on the sort key, as recorded_requests pages)."""
    params = (since, until, *_ROUTES)
    select = f"SELECT {_INDEX} FROM records WHERE {_WINDOW} "
    after = select + "AND (ts > ? OR (ts = ? AND request_id > ?)) ORDER BY ts, request_id LIMIT ?"
    page = store.query(select + "ORDER BY ts, request_id LIMIT ?", (*params, _PAGE))
    while page:
        yield from page
        if len(page) < _PAGE:
            return
        last = page[-1]
        page = store.query(after, (*params, last[8], last[8], last[0], _PAGE))


def _keyless_ids(batch: Sequence[tuple[str, _Group]]) -> list[str]:
    return [request_id for _, group in batch for _, request_id in group.keyless]
