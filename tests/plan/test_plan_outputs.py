"""What the plan's text, JSON and HTML say beyond the sweep: each turn's TTFT p95 against
the SLO, N+1 for the fleet to buy, the utilisation's three figures by name, and the
recording window. Expectations are computed here from the cost model's terms."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

import pytest

from kvmigrate.plan.cost_model import CostModel
from kvmigrate.plan.html import render_html
from kvmigrate.plan.render import plan_json, render_text
from kvmigrate.plan.simulate import Fleet
from kvmigrate.plan.sweep import Costs, Plan, sweep
from kvmigrate.plan.workload import Request, Workload

PROMPTS = (1_000, 9_000, 20_000)  # turns 1, 2, 3 of one conversation
BUDGET = 8_192  # tokens per step: a prompt prefills in ceil(P / 8,192) steps
START = datetime(2026, 11, 30, 7, 33, 20, tzinfo=UTC).timestamp()


def _ttft(prompt: int) -> float:
    """Alone on a replica without prefix caching: 5 ms of HTTP, then its prefill steps,
    each 5 ms plus its tokens at 1/32,500 s (CostModel's defaults)."""
    return 0.005 + math.ceil(prompt / BUDGET) * 0.005 + prompt / 32_500


def _workload(window: tuple[float, float] | None = (START, START + 3_600.0)) -> Workload:
    """Turns 100 s apart, so none waits for another."""
    requests = tuple(
        Request("c", turn, 100.0 * (turn - 1), prompt, 4, chain=turn)
        for turn, prompt in enumerate(PROMPTS, 1)
    )
    return Workload(requests, "test", basis_s=3_600.0, window=window)


def _plan(slo_s: float | None, sizes: list[int], headroom: float = 0.25) -> Plan:
    fleet = Fleet(kv_blocks=10_000, cost=CostModel(), prefix_caching=False)
    return sweep(_workload(), fleet, sizes, slo_s, Costs(1, 3.5, None), headroom=headroom)


def test_an_slo_between_two_turns_fails_exactly_the_later_turns() -> None:
    slo = (_ttft(PROMPTS[0]) + _ttft(PROMPTS[1])) / 2  # between turn 1's p95 and turn 2's
    data = plan_json(_plan(slo, [1, 2]))
    turns = data["turn_slo"]["turns"]
    assert [t["ttft_p95_s"] for t in turns] == pytest.approx([_ttft(p) for p in PROMPTS])
    assert [t["meets_slo"] for t in turns] == [True, False, False]
    assert data["turn_slo"]["failing"] == ["2", "3"]
    assert data["turn_slo"]["replicas"] == 2  # no fleet met it: the largest is shown
    for size in data["sizes"]:
        assert [t["meets_slo"] for t in size["turns"]] == [True, False, False]


def test_the_turn_table_marks_each_turn_in_text_and_html() -> None:
    plan = _plan((_ttft(PROMPTS[1]) + _ttft(PROMPTS[2])) / 2, [1])  # only turn 3 fails
    text = render_text(plan)
    rows = text[text.index("TTFT by turn") :].splitlines()[4:7]
    assert [row.split()[0] for row in rows] == ["1", "2", "3"]
    assert [" yes " in row for row in rows] == [True, True, False]
    assert " no " in rows[2]
    html = render_html(plan)
    assert "<th>meets SLO</th>" in html.split("TTFT by turn")[1]


def test_no_slo_no_turn_status() -> None:
    data = plan_json(_plan(None, [1]))
    assert data["turn_slo"] is None
    assert data["n_plus_one"] is None
    assert all(t["meets_slo"] is None for t in data["sizes"][0]["turns"])


@pytest.mark.parametrize(
    ("sizes", "headroom", "expected"),
    [
        # SLO fleet 1, buy ceil(1.25) = 2: one lost leaves 1, simulated, which meets it
        ([1, 2, 3], 0.25, {"fleet": 2, "left": 1, "simulated": True, "holds": True}),
        # no headroom: buy 1, and losing it leaves nothing
        ([1, 2, 3], 0.0, {"fleet": 1, "left": 0, "simulated": False, "holds": False}),
        # buy 3, one lost leaves 2, not in the sweep but above the SLO's fleet of 1
        ([1, 8], 2.0, {"fleet": 3, "left": 2, "simulated": False, "holds": True}),
    ],
)
def test_n_plus_one(sizes: list[int], headroom: float, expected: dict[str, Any]) -> None:
    plan = _plan(1.0, sizes, headroom)  # every turn meets 1 s at any size
    spare = plan_json(plan)["n_plus_one"]
    assert {k: spare[k] for k in ("fleet", "left", "holds")} == {
        k: expected[k] for k in ("fleet", "left", "holds")
    }
    if expected["simulated"]:
        assert spare["ttft_p95_s"] == pytest.approx(plan.sizes[0].ttft_p95_s)
    else:
        assert spare["ttft_p95_s"] is None
    line = next(x for x in render_text(plan).splitlines() if x.startswith("N+1"))
    assert ("N+1 holds" in line) is expected["holds"]
    assert f"{expected['fleet']} replica(s) less one is {expected['left']}" in line


def test_the_chosen_fleet_names_its_utilisation_figures() -> None:
    data = plan_json(_plan(1.0, [1, 2]))
    chosen, one = data["chosen"], data["sizes"][0]
    for key in ("compute", "kv_held", "any_step_running", "utilisation"):
        assert chosen[key] == one[key]
    assert chosen["utilisation"] == max(one["compute"], one["kv_held"])
    assert chosen["binding"] == ("kv_cache" if one["kv_held"] >= one["compute"] else "compute")
    assert "active" not in one  # the old name for "any step running"


def test_the_recording_window_in_every_view() -> None:
    plan = _plan(1.0, [1])
    window = plan_json(plan)["workload"]["window"]
    assert window == {
        "first_ts": START,
        "last_ts": START + 3_600.0,
        "first": "2026-11-30 07:33:20 UTC",
        "last": "2026-11-30 08:33:20 UTC",
        "duration_s": 3_600.0,
    }
    line = "Recording window: 2026-11-30 07:33:20 UTC to 2026-11-30 08:33:20 UTC (60 min)"
    assert line in render_text(plan)
    assert line in render_html(plan)
