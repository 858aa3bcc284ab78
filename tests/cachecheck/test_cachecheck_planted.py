"""Every planted cache buster is found, with its class and position; clean agents are clean."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from cachecheck_support import CLEAN, PLANTED, Agent, agent

from kvmigrate.cachecheck import BreakClass, Summary, TokenCounter, check_conversation
from kvmigrate.cachecheck.waste import CostModel


@pytest.mark.parametrize(
    ("name", "spec", "cls", "message", "field", "turns"),
    PLANTED,
    ids=[case[0] for case in PLANTED],
)
def test_planted_buster_is_found_with_its_class_and_position(
    name: str,
    spec: Agent,
    cls: BreakClass,
    message: int | Callable[[int], int] | None,
    field: str,
    turns: list[int],
) -> None:
    checks = check_conversation(agent(name, spec), TokenCounter())
    for check in checks:
        if check.turn not in turns:
            assert check.brk is None, f"turn {check.turn}: false alarm {check.brk}"
            assert check.ratio == 1.0
            continue
        brk = check.brk
        assert brk is not None, f"turn {check.turn}: break not found"
        want = message(check.turn) if callable(message) else message
        where = (brk.cls, brk.location.message, brk.location.field)
        assert where == (cls, want, field), f"turn {check.turn}: {brk}"
        assert check.ratio < 1.0
        assert check.tokens_lost > 0
        assert brk.fix
        assert brk.before
        assert brk.detail


@pytest.mark.parametrize(("name", "spec"), CLEAN, ids=[case[0] for case in CLEAN])
def test_clean_agent_reuses_everything(name: str, spec: Agent) -> None:
    checks = check_conversation(agent(name, spec, turns=6), TokenCounter())
    assert [c.brk for c in checks] == [None] * 6
    assert all(c.ratio == 1.0 for c in checks)
    assert all(c.reused_tokens == c.expected_tokens > 0 for c in checks[1:])


def test_system_timestamp_names_its_label_and_redacts_the_excerpt() -> None:
    checks = check_conversation(agent("ts", PLANTED[0][1]), TokenCounter())
    brk = checks[1].brk
    assert brk is not None
    assert brk.label == "Current time:"
    assert brk.fix.startswith(
        "move `Current time:` from the system prompt to the latest user message; "
    )
    assert "`X-Session-ID`" in brk.fix  # the same prompt also breaks stickiness
    assert "Current time: ####-##-##T##:##:##Z" in brk.before
    assert not any(ch.isdigit() for ch in brk.before + brk.after)
    # Right inside the timestamp: the minutes of `2025-01-06T10:31:07Z` change.
    assert brk.location.offset == len("Current time: 2025-01-06T10:3")


def test_summary_ranks_busters_by_tokens_lost_and_prices_the_waste() -> None:
    summary = Summary(CostModel(prefill_tokens_per_s=10_000, price_per_mtok=2.0))
    for name, spec, *_ in PLANTED:
        summary.add(check_conversation(agent(name, spec), TokenCounter()))
    data = summary.as_dict()
    lost = [b["tokens_lost"] for b in data["busters"]]
    assert lost == sorted(lost, reverse=True)
    waste = data["waste"]
    assert waste["breaks"] > 0
    assert waste["deliberate_breaks"] == 2
    assert waste["ttft_wasted_s"] == pytest.approx(waste["tokens_lost"] / 10_000, abs=1e-3)
    assert waste["cost_wasted"] == pytest.approx(waste["tokens_lost"] * 2.0 / 1e6)
    classes = {b["class"] for b in data["busters"]}
    assert classes == {c.value for c in BreakClass}


def test_tokenizer_is_pluggable() -> None:
    seen: list[str] = []

    def chars(text: str) -> list[str]:
        seen.append(text)
        return list(text)

    checks = check_conversation(agent("ts", PLANTED[0][1]), TokenCounter(chars))
    assert seen
    assert checks[1].reused_tokens == checks[1].reused_chars
