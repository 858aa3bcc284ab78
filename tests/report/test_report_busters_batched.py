"""The report's cache-buster section reads its window a batch of conversations at a time:
the same summaries, examples and order as `parse_lines` + `check_all` over every recorded
request of the window at once (how it read them before), with a bounded number of request
bodies in memory.

The records are written the way the proxy's recorder writes them (RecordConverter: each
history stored once, redacted), for agents interleaved in time as concurrent agents are:
clean ones, and ones that stamp the time in their system prompt, reorder their tools,
edit their history; Anthropic Messages traffic; records without a conversation id
(grouped by their body's `user`, which redaction makes one `[USER]` for all, or by their
first user message); a conversation whose
first record lost its history in a failed write (so it is listed by its second), one whose
first record is not a chat request, one whose turns were recorded out of order, one split
over two cohorts, and records that share a timestamp."""

from __future__ import annotations

import gc
from collections import defaultdict
from collections.abc import Iterator, Mapping
from typing import Any

import orjson
import pytest

from kvmigrate.cachecheck import CostModel, DatasetError, Summary, analyze, check_all, parse_lines
from kvmigrate.cachecheck.checker import CHECKED_ROUTES
from kvmigrate.exchange import Exchange, Role
from kvmigrate.recorder import open_store
from kvmigrate.recorder.convert import RecordConverter
from kvmigrate.recorder.export import recorded_requests
from kvmigrate.recorder.record import Record
from kvmigrate.recorder.store import RecordStore
from kvmigrate.report import busters
from kvmigrate.report.busters import cache_busters

MODEL = "agent-model"
SYSTEM = "You are a careful coding agent. Read the repository, plan, then act. " * 6
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"The {name} tool.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
    for name in ("read_file", "run_tests", "write_file")
]
KINDS = (
    "lost-first",  # edits its history, and its first record's history is gone
    "clean",
    "stamped",
    "tools",
    "edited",
    "user-keyed",
    "anchored",
    "messages",
    "not-chat-first",
    "out-of-order",
    "stamped",
    "clean",
)
SINCE, UNTIL = 0.0, 10_000.0


def _body(kind: str, c: int, turn: int, history: list[dict[str, Any]]) -> dict[str, Any]:
    system = SYSTEM
    if kind in ("stamped", "messages"):
        # A different time in each conversation: each has its own example of the break.
        system = (
            f"Current time: 2025-01-{6 + c % 20:02d}T10:{turn:02d}:{(7 * c) % 60:02d}Z\n{SYSTEM}"
        )
    tools = [*TOOLS[1:], TOOLS[0]] if kind == "tools" and turn >= 3 else TOOLS
    messages = [dict(m) for m in history]
    if kind in ("edited", "lost-first") and turn >= 3:
        # Letters, not digits: an example masks digits, and each edit must show its own.
        messages[0]["content"] += f" (edited by {chr(97 + c % 26) * 3})"
    if kind == "lost-first" and turn == 1:
        messages.insert(0, {"role": "user", "content": f"draft note {c}, never sent again"})
    if kind == "messages":
        return {"model": MODEL, "system": system, "max_tokens": 64, "messages": messages}
    body: dict[str, Any] = {"model": MODEL, "messages": [{"role": "system", "content": system}]}
    body["messages"] += messages
    body["tools"] = tools
    if kind == "user-keyed":
        body["user"] = f"user-{c}"
    return body


def _exchange(request_id: str, kind: str, c: int, turn: int, body: dict[str, Any]) -> Exchange:
    route = "messages" if kind == "messages" else "chat/completions"
    keyless = kind in ("user-keyed", "anchored")
    x = Exchange(
        request_id=request_id, route=route, backend="hosted", role=Role.SERVE, model=MODEL,
        served_model=MODEL, conversation="" if keyless else f"conv-{c}", turn=turn,
        stream=False, started=0.0, request_body=orjson.dumps(body), status=200,
        first_byte=0.1, finished=0.2,
    )  # fmt: skip
    x.chunks = [orjson.dumps({"choices": [{"message": {"role": "assistant", "content": "ok"}}]})]
    return x


def _conversation(kind: str, c: int, turns: int) -> Iterator[Exchange]:
    """The agent's exchanges, in the order it sent them."""
    history: list[dict[str, Any]] = []
    for turn in range(1, turns + 1):
        history.append({"role": "user", "content": f"Task {c}, step {turn}: carry on."})
        body = _body(kind, c, turn, history)
        if kind == "not-chat-first" and turn == 1:
            body = {"model": MODEL, "prompt": "a legacy completion, no messages"}
        recorded = turn
        if kind == "out-of-order" and turn in (2, 3):
            recorded = 5 - turn  # turns 2 and 3 recorded in each other's place
        yield _exchange(f"{kind}-{c}-{turn}", kind, c, recorded, body)
        history.append({"role": "assistant", "content": f"Done step {turn} of task {c}."})


def _records(conversations: int) -> list[Record]:
    """The agents' turns interleaved (one turn of each in turn), every third pair of
    records at the same instant, with request ids that do not sort in time order."""
    convert = RecordConverter("redacted", "test")
    agents = [
        _conversation(KINDS[c % len(KINDS)], c, 3 + (c * 5) % 6) for c in range(conversations)
    ]
    records, step = [], 0
    while agents:
        for agent in list(agents):
            x = next(agent, None)
            if x is None:
                agents.remove(agent)
                continue
            x.request_id = f"{(step * 7919) % 10007:05d}-{x.request_id}"
            # Steps 3k and 3k + 1 share an instant: their request ids order them.
            record = convert((x, 100.0 + step - (step % 3 == 1)))
            if "-lost-first-" in x.request_id:
                # A failed write: the message only the first turn sent never landed.
                record.messages = tuple(m for m in record.messages if "draft" not in m.body)
            records.append(record)
            step += 1
    return records


def _cohorts(records: list[Record]) -> dict[str, str]:
    """Two cohorts by conversation; conversation 1 has turns in both."""
    cohort_of = {}
    for r in records:
        c = int(r.request_id.split("-")[-2])
        cohort = "b" if c % 3 == 0 else "a"
        cohort_of[r.request_id] = "b" if c == 1 and r.turn % 2 else cohort
    return cohort_of


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, str]]:
    path = tmp_path_factory.mktemp("busters") / "records.db"
    records = _records(36)
    with open_store(f"sqlite:///{path}") as store:
        store.insert(records)
    return f"sqlite:///{path}", _cohorts(records)


def _whole_window(
    store: RecordStore, cohort_of: Mapping[str, str]
) -> tuple[Summary, dict[str, Summary], int]:
    """The section as it read the window before: every recorded request as an exported
    JSONL line, each cohort's lines parsed and checked at once."""
    found: dict[str, list[str]] = defaultdict(list)
    for line in recorded_requests(store, SINCE, UNTIL, CHECKED_ROUTES):
        found[cohort_of.get(str(line["custom_id"]), "")].append(orjson.dumps(line).decode())
    fleet, own = Summary(CostModel()), {}
    for cohort, lines in sorted(found.items()):
        try:
            data = parse_lines(lines, "records")
        except DatasetError:
            continue
        own[cohort] = Summary(CostModel())
        for _conversation, checks in check_all(data.conversations):
            fleet.add(checks)
            own[cohort].add(checks)
    return fleet, own, len(found)


def _as_dicts(result: tuple[Summary, dict[str, Summary], int]) -> Any:
    fleet, own, cohorts = result
    return fleet.as_dict(), {name: s.as_dict() for name, s in own.items()}, cohorts


@pytest.mark.parametrize("batch_rows", [1, 7, 40, 100_000])
@pytest.mark.parametrize("cohorts", [False, True])
def test_batched_reading_gives_the_whole_window_result(
    recorded: tuple[str, dict[str, str]],
    monkeypatch: pytest.MonkeyPatch,
    batch_rows: int,
    cohorts: bool,
) -> None:
    url, cohort_of = recorded
    cohort_of = cohort_of if cohorts else {}
    monkeypatch.setattr(busters, "BATCH_ROWS", batch_rows)
    with open_store(url) as store:
        expected = _whole_window(store, cohort_of)
        got = busters.buster_summaries(store, SINCE, UNTIL, cohort_of)
        sections = cache_busters(store, SINCE, UNTIL, cohort_of)
    assert _as_dicts(got) == _as_dicts(expected)
    fleet, own, _ = expected
    section = busters._section
    assert sections == (section(fleet), {n: section(s) for n, s in own.items()} if cohorts else {})


def test_the_dataset_holds_every_case(recorded: tuple[str, dict[str, str]]) -> None:
    """Guards the test above: what it compares covers the cases the module docstring lists."""
    url, cohort_of = recorded
    with open_store(url) as store:
        fleet, own, cohorts = _whole_window(store, cohort_of)
        lines = list(recorded_requests(store, SINCE, UNTIL, CHECKED_ROUTES))
    assert cohorts == 2
    assert set(own) == {"a", "b"}
    classes = {b.cls.value for b in fleet.busters.values()}
    assert {"timestamp", "tools_reordered", "edited_message"} <= classes, classes
    # 36 agents; the `user`-keyed ones are one group, and conversation 1 counts in both cohorts.
    assert fleet.conversations == 36 - 2 + 1
    # The timestamp buster was met in several conversations, each with its own example: the
    # one shown depends on the order conversations are checked in.
    stamped = max(fleet.busters.values(), key=lambda b: len(b.conversations))
    assert len(stamped.conversations) >= 5
    # Conversation 0's first record is unreadable, so it is checked after those whose first
    # turn came before its second, and its edit ("aaa") is not the example shown.
    (edited,) = [b for b in fleet.busters.values() if b.cls.value == "edited_message"]
    assert len(edited.conversations) >= 4
    assert "aaa" not in edited.example.after
    ids = [line["custom_id"] for line in lines]
    assert not any(i.endswith("-lost-first-0-1") for i in ids)  # its history is gone
    assert sum(line["metadata"]["conversation"] == "" for line in lines) > 10
    assert any(line["url"] == "/v1/messages" for line in lines)


def _live_bodies() -> int:
    """Request bodies alive now, wherever they are held."""
    return sum(
        1
        for o in gc.get_objects()
        if type(o) is dict and o.get("model") == MODEL and isinstance(o.get("messages"), list)
    )


@pytest.mark.slow
def test_request_bodies_held_at_once_are_bounded_by_the_batch(
    recorded: tuple[str, dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Counted at every request the check renders. Before, the section held every body of
    the window at once (150-odd here)."""
    url, _ = recorded
    render = analyze.render_request  # type: ignore[attr-defined]
    calls, seen = 0, []

    def counting(body: Any, *args: Any) -> Any:
        nonlocal calls
        if calls % 5 == 0:  # a heap walk per request would be slow; every fifth suffices
            seen.append(_live_bodies())
        calls += 1
        return render(body, *args)

    batch = 12  # more than the longest conversation (8 turns)
    monkeypatch.setattr(busters, "BATCH_ROWS", batch, raising=False)  # absent before
    monkeypatch.setattr(analyze, "render_request", counting)
    with open_store(url) as store:
        total = len(list(recorded_requests(store, SINCE, UNTIL, CHECKED_ROUTES)))
        gc.collect()
        cache_busters(store, SINCE, UNTIL)
    peak = max(seen)
    assert total > 10 * batch
    assert 0 < peak <= batch, f"{peak} request bodies held at once, of {total}"
