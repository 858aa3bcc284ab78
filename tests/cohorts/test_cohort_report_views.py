"""`kvmigrate report` over three cohorts recorded through a real proxy: the fleet first, then
every section per cohort (text, JSON, HTML with a cohort selector driven in Chromium), and
a model's three candidates compared with each other on the requests all three were sent.

vllm and vllm-fp8 answer alike (one answer family, no sampling noise), as two set-ups of
the same model should; vllm-q4 answers in its own way, as a broken quantisation might."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from browser_page import open_page
from recording_bed import recorded_config

from kvmigrate.emulator import EmulatorSettings

CONFIG = """
backends:
  hosted: {{api_base: "{hosted}/v1"}}
  vllm: {{api_base: "{vllm}/v1"}}
  vllm-fp8: {{api_base: "{vllm-fp8}/v1"}}
  vllm-q4: {{api_base: "{vllm-q4}/v1"}}
models:
  - {{model_name: gpt-4o-mini, hosted: gpt-4o-mini, vllm: meta-llama/Llama-3.1-8B-Instruct}}
  - model_name: o3-mini
    hosted: gpt-4o-mini
    vllm: meta-llama/Llama-3.1-8B-Instruct
    vllm-fp8: meta-llama/Llama-3.1-8B-Instruct
    vllm-q4: meta-llama/Llama-3.1-8B-Instruct
    candidates: [vllm, vllm-fp8, vllm-q4]
cohorts:
  - {{name: billing-bot, model: gpt-4o-mini, match: {{header: {{X-Agent: billing-bot}}}}}}
rollout: {{mode: shadow, noise_sample: 0, state: "sqlite:///{db}.state"}}
record: {{db: "sqlite:///{db}", content: redacted}}
"""
TURNS = 2
# (model, X-Agent header, conversations): the cohort each lands in is the key.
TRAFFIC = {
    "billing-bot": ("gpt-4o-mini", "billing-bot", 2),
    "gpt-4o-mini": ("gpt-4o-mini", None, 3),
    "o3-mini": ("o3-mini", None, 4),
}
CANDIDATES = ("vllm", "vllm-fp8", "vllm-q4")


def _emulators() -> dict[str, EmulatorSettings]:
    def vllm(name: str, family: str = "") -> EmulatorSettings:
        return EmulatorSettings("vllm", name=name, time_scale=0.02, noise=0.0, answer_family=family)

    return {
        "hosted": EmulatorSettings("hosted", time_scale=0.02),
        "vllm": vllm("vllm", "llama"),
        "vllm-fp8": vllm("vllm-fp8", "llama"),
        "vllm-q4": vllm("vllm-q4", "q4"),
    }


def _drive(client: openai.OpenAI) -> None:
    for cohort, (model, agent, conversations) in TRAFFIC.items():
        for conv in range(conversations):
            headers = {"X-Session-ID": f"{cohort}-{conv}"}
            if agent:
                headers["X-Agent"] = agent
            messages = [
                {"role": "system", "content": "You are a support agent. " * 40},
                {"role": "user", "content": f"Ticket {conv}: the invoice total is wrong"},
            ]
            for _ in range(TURNS):
                stream = client.chat.completions.create(
                    model=model, messages=messages, max_tokens=12, stream=True,
                    stream_options={"include_usage": True}, extra_headers=headers,
                )  # fmt: skip
                text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
                messages += [
                    {"role": "assistant", "content": text},
                    {"role": "user", "content": "and the tax line? " * 5},
                ]


def _expected_records() -> int:
    copies = {"o3-mini": len(CANDIDATES)}
    return sum(n * TURNS * (1 + copies.get(c, 1)) for c, (_, _, n) in TRAFFIC.items())


@pytest.fixture(scope="module")
def recorded() -> Iterator[Path]:
    with recorded_config(
        CONFIG, _drive, _expected_records(), prefix="kvmigrate-cohort-views-",
        emulators=_emulators(),
    ) as path:  # fmt: skip
        yield path


def _report(config: Path, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "kvmigrate", "report", "--config", str(config), *args],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def _backends(view: dict[str, Any]) -> dict[str, tuple[int, int]]:
    return {b["backend"]: (b["serve"], b["shadow"]) for b in view["backends"]}


def test_every_section_per_cohort_under_the_fleet(recorded: Path) -> None:
    data = json.loads(_report(recorded, "--format", "json"))
    assert data["records"] == _expected_records()
    cohorts = {c["cohort"]: c for c in data["cohorts"]}
    assert list(cohorts) == sorted(TRAFFIC)
    requests = {c: n * TURNS for c, (_, _, n) in TRAFFIC.items()}
    assert _backends(cohorts["billing-bot"]) == {"hosted": (4, 0), "vllm": (0, 4)}
    assert _backends(cohorts["gpt-4o-mini"]) == {"hosted": (6, 0), "vllm": (0, 6)}
    assert _backends(cohorts["o3-mini"]) == {"hosted": (8, 0)} | {c: (0, 8) for c in CANDIDATES}
    assert _backends(data)["hosted"] == (sum(requests.values()), 0)
    for name, view in cohorts.items():
        conversations = TRAFFIC[name][2]
        # Each section on the cohort's traffic alone: its turns, its coverage, its cost.
        assert [t["primary_n"] for t in view["ttft_by_turn"]] == [conversations] * TURNS
        assert [t["candidate_n"] for t in view["ttft_by_turn"]] == [conversations] * TURNS
        assert view["coverage"]["primary_requests"] == requests[name]
        assert view["coverage"]["request_ratio"] == 1.0
        assert view["cost"]["monthly_requests"] > 0
        assert view["parity"]["samples"] == requests[name] * (3 if name == "o3-mini" else 1)
        assert view["cache_busters"]["checked"] is True
        assert view["cache_busters"]["conversations"] == conversations
        assert view["identity"]["conversations"] == conversations
    assert data["cache_busters"]["conversations"] == sum(n for _, _, n in TRAFFIC.values())
    costs = [c["cost"]["hosted_monthly_usd"] for c in cohorts.values()]
    assert all(cost > 0 for cost in costs)


def test_candidates_are_compared_with_each_other(recorded: Path) -> None:
    data = json.loads(_report(recorded, "--format", "json"))
    o3 = next(c for c in data["cohorts"] if c["cohort"] == "o3-mini")
    pairs = {(p["a"], p["b"]): p for p in o3["candidate_pairs"]}
    assert list(pairs) == [("vllm", "vllm-fp8"), ("vllm", "vllm-q4"), ("vllm-fp8", "vllm-q4")]
    requests = TRAFFIC["o3-mini"][2] * TURNS
    for pair in pairs.values():
        assert pair["requests"] == pair["compared"] == requests
        assert 0.0 <= pair["agreement_low"] <= pair["agreement"] <= pair["agreement_high"] <= 1
        for side in ("a", "b"):
            assert pair[f"{side}_ttft_p50_ms"] > 0
            assert pair[f"{side}_latency_p50_ms"] >= pair[f"{side}_ttft_p50_ms"]
            assert pair[f"{side}_prompt_tokens"] > 0
        # Turn 2 resends turn 1's prefix: the emulated vLLM caches it.
        assert pair["a_cached_tokens"] > 0
    same = pairs[("vllm", "vllm-fp8")]
    assert (same["agreed"], same["agreement"], same["disagreed"]) == (requests, 1.0, {})
    assert same["agreement_low"] > 0.6  # Wilson's bound for 8 of 8 at 95%
    for other in (pairs[("vllm", "vllm-q4")], pairs[("vllm-fp8", "vllm-q4")]):
        assert other["agreed"] < requests
        assert other["agreement_high"] < 1.0
        assert other["disagreed"]["text"] >= 1
        assert max(other["disagreed"].values()) <= requests - other["agreed"]
    # Only o3-mini has several candidates; the fleet's comparison is its.
    assert data["candidate_pairs"] == o3["candidate_pairs"]
    assert all(c["candidate_pairs"] == [] for c in data["cohorts"] if c["cohort"] != "o3-mini")
    text = _report(recorded)
    section = text.split("Candidates against each other")[1]
    fp8 = next(line for line in section.splitlines() if line.startswith("vllm / vllm-fp8"))
    assert "100.0% [" in fp8
    assert f"of {requests}" in fp8


def test_text_and_md_show_the_fleet_first_then_each_cohort(recorded: Path) -> None:
    text = _report(recorded)
    heads = [text.index(h) for h in ("Headline\n", "By cohort\n")]
    heads += [text.index(f"Cohort {name}\n=") for name in sorted(TRAFFIC)]
    assert heads == sorted(heads)
    billing = text[text.index("Cohort billing-bot\n=") : text.index("Cohort gpt-4o-mini\n=")]
    for section in ("Headline: cohort billing-bot", "TTFT by turn", "Cost projection", "Parity"):
        assert section in billing
    md = _report(recorded, "--format", "md")
    assert "## Cohort o3-mini" in md
    assert "### Candidates against each other" in md


def _shown_headline(page: Any) -> dict[str, list[str]]:
    rows = page.evaluate(
        "Array.from(document.querySelectorAll("
        "'section.view:not([hidden]) table[data-table=\"headline\"] tr')).map("
        "tr => Array.from(tr.cells).map(c => c.textContent))"
    )
    return {row[0]: row[1:3] for row in rows[1:]}


def _choose(page: Any, view: str) -> None:
    page.evaluate(
        f"(() => {{ const s = document.getElementById('cohort-view'); s.value = {view!r};"
        " s.dispatchEvent(new Event('change')); })()"
    )


@pytest.mark.browser
def test_html_cohort_selector_switches_every_section_in_chromium(
    recorded: Path, tmp_path: Path
) -> None:
    page_path = tmp_path / "report.html"
    _report(recorded, "--format", "html", "--out", str(page_path))
    data = json.loads(_report(recorded, "--format", "json"))
    html = page_path.read_text()
    assert "<script src" not in html
    assert "<link" not in html
    with open_page(page_path) as page:
        page.wait_for("document.body && document.body.dataset.ready === '1'")
        assert page.evaluate("document.querySelectorAll('section.view:not([hidden])').length") == 1
        fleet = _shown_headline(page)
        assert fleet["hosted"] == [str(data["backends"][0]["serve"]), "0"]
        for cohort in data["cohorts"]:
            _choose(page, cohort["cohort"])
            assert page.evaluate("document.body.dataset.view") == cohort["cohort"]
            shown = _shown_headline(page)
            assert shown == {b["backend"]: [str(b["serve"]), str(b["shadow"])]
                             for b in cohort["backends"]}  # fmt: skip
            visible = page.evaluate(
                "Array.from(document.querySelectorAll('section.view:not([hidden]) h2'))"
                ".map(h => h.textContent)"
            )
            assert "TTFT by turn (reduction > 0: the candidate is faster)" in visible
            assert ("Candidates against each other" in visible) == (cohort["cohort"] == "o3-mini")
            # The divergences view follows: only this cohort's pairs are left shown.
            pairs = page.evaluate(
                "Array.from(document.querySelectorAll('div.pair:not([hidden])'))"
                ".map(p => p.dataset.cohort)"
            )
            assert set(pairs) <= {cohort["cohort"]}
            assert pairs, "every cohort's candidate answers its hosted primary differently"
        _choose(page, "")
        assert _shown_headline(page) == fleet
    # A linked view (`#view=NAME`) opens on that cohort, its divergences filtered alike.
    with open_page(page_path, "#view=o3-mini") as page:
        page.wait_for("document.body && document.body.dataset.ready === '1'")
        assert page.evaluate("document.body.dataset.view") == "o3-mini"
        o3 = next(c for c in data["cohorts"] if c["cohort"] == "o3-mini")
        assert _shown_headline(page)["vllm-q4"] == ["0", str(_backends(o3)["vllm-q4"][1])]


@pytest.mark.browser
def test_divergences_name_and_filter_the_candidate_that_answered(
    recorded: Path, tmp_path: Path
) -> None:
    page_path = tmp_path / "report.html"
    _report(recorded, "--format", "html", "--out", str(page_path))
    with open_page(page_path, "#candidate=vllm-q4") as page:
        page.wait_for("document.body && document.body.dataset.ready === '1'")
        shown = page.evaluate(
            "Array.from(document.querySelectorAll('div.pair:not([hidden])')).map(p => "
            "[p.dataset.candidate, p.querySelector('.side.candidate h4').textContent])"
        )
        options = page.evaluate(
            "Array.from(document.getElementById('divergence-candidate').options).map(o => o.value)"
        )
    assert options == ["", *CANDIDATES]
    assert shown
    assert {tuple(s) for s in shown} == {("vllm-q4", "candidate (vllm-q4)")}


def test_each_cohort_shows_its_own_rollout_changes(recorded: Path, tmp_path: Path) -> None:
    """A change to one cohort, made with `kvmigrate rollout`, is in that cohort's timeline
    and the fleet's, not in the others'."""
    config = tmp_path / "config.yaml"
    state = f"sqlite:///{tmp_path / 'state.db'}"
    config.write_text(re.sub(r'state: "[^"]*"', f'state: "{state}"', recorded.read_text()))
    done = subprocess.run(
        [sys.executable, "-m", "kvmigrate", "rollout", "--model", "o3-mini", "--percent", "10",
         "--force", "--config", str(config)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    data = json.loads(_report(config, "--format", "json"))
    timelines = {c["cohort"]: c["timeline"] for c in data["cohorts"]}
    assert [(e["cohort"], e["percent"]) for e in timelines["o3-mini"]] == [("o3-mini", 10.0)]
    assert timelines["billing-bot"] == timelines["gpt-4o-mini"] == []
    assert [e["cohort"] for e in data["timeline"]] == ["o3-mini"]
