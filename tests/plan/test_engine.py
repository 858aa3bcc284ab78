"""The cost model and one replica's scheduler, step by step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvmigrate.plan.cost_model import CostModel, Probe, attention_pairs, fit
from kvmigrate.plan.prefix_cache import PrefixCache
from kvmigrate.plan.scheduler import Engine, EngineSettings, Job
from kvmigrate.plan.workload import Request

# Round figures, so each step's duration is exact arithmetic.
COST = CostModel(
    overhead_s=0.01, prefill_token_s=0.001, cached_token_s=0.0001, decode_seq_s=0.002, request_s=0
)


@pytest.mark.parametrize(
    ("prefill", "cached", "decoding", "expected"),
    [
        (0, 0, 0, 0.01),
        (100, 0, 0, 0.11),
        (100, 1000, 0, 0.21),
        (0, 0, 5, 0.02),
        (10, 0, 5, 0.03),
    ],
)
def test_step_time_is_overhead_plus_each_kind_of_work(
    prefill: int, cached: int, decoding: int, expected: float
) -> None:
    assert COST.step_s(prefill, cached, decoding) == pytest.approx(expected)


def test_the_default_cost_model_reproduces_the_h200_figures() -> None:
    """Issue 22's figures for an 8B model on one H200: 10,150 cold tokens in 327 ms (two
    chunks of the 8,192-token budget); 700 new tokens on 9,450 cached, 50 ms."""
    c = CostModel()
    cold = c.step_s(8192, 0, 0) + c.step_s(10_150 - 8192, 0, 0) + c.request_s
    warm = c.step_s(700, 9450, 0) + c.request_s
    assert cold == pytest.approx(0.327, abs=0.005)
    assert warm == pytest.approx(0.050, abs=0.005)


def test_fit_recovers_the_parameters_that_produced_the_probes() -> None:
    truth = CostModel(
        overhead_s=0.02, prefill_token_s=0.0005, cached_token_s=0.00002, decode_seq_s=0.003,
        request_s=0.01, attention_s=1e-7,
    )  # fmt: skip
    shapes = [(256, 0), (1024, 0), (4096, 0), (300, 256), (1100, 1024), (4200, 4096)]
    probes = [
        Probe(
            p, c,
            truth.step_s(p - c, c, 0, attention_pairs(c, p - c)) + truth.request_s,
            itl_s=truth.step_s(0, 0, 1),
        )
        for p, c in shapes
    ]  # fmt: skip
    fitted = fit(probes, label="test", batch_itl=(4, truth.step_s(0, 0, 4)))
    assert fitted.overhead_s == pytest.approx(0.02, rel=1e-6)
    assert fitted.decode_seq_s == pytest.approx(0.003, rel=1e-6)
    assert fitted.request_s == pytest.approx(0.01, rel=1e-6)
    assert fitted.prefill_token_s == pytest.approx(0.0005, rel=1e-6)
    assert fitted.cached_token_s == pytest.approx(0.00002, rel=1e-6)
    assert fitted.attention_s == pytest.approx(1e-7, rel=1e-6)


def test_attention_pairs_grow_with_the_context_a_chunk_attends() -> None:
    assert attention_pairs(0, 100) == 100 * 50
    assert attention_pairs(1000, 100) == 100 * 1050
    # Two chunks of a prompt attend exactly what the prompt in one chunk does.
    assert attention_pairs(0, 60) + attention_pairs(60, 40) == attention_pairs(0, 100)


def test_fit_never_returns_a_negative_cost() -> None:
    # Cached prompts measured no faster than cold ones of the same new-token count.
    probes = [Probe(100, 0, 0.1), Probe(1100, 1000, 0.1), Probe(2000, 0, 1.0), Probe(500, 0, 0.3)]
    fitted = fit(probes, "noisy", batch_itl=(4, 0.001))  # a batch faster than one alone
    values = fitted.to_json()
    del values["source"]
    assert min(v for v in values.values() if isinstance(v, float)) >= 0


def test_fit_needs_cold_and_cached_probes_of_several_lengths() -> None:
    with pytest.raises(ValueError, match="four distinct shapes"):
        fit([Probe(100, 0, 0.1), Probe(200, 96, 0.05), Probe(100, 0, 0.12)], "few")


def test_a_saved_cost_model_loads_back_and_bad_keys_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "cost.json"
    path.write_text(json.dumps(COST.to_json()))
    assert CostModel.load(path) == COST
    with pytest.raises(ValueError, match="unknown"):
        CostModel.from_json({"prefill_tokens_per_s": 1})
    with pytest.raises(ValueError, match="from 0 to"):
        CostModel.from_json({"overhead_s": -1})


def engine(budget: int = 100, blocks: int = 1000, max_seqs: int = 256) -> Engine:
    return Engine(PrefixCache(blocks, 16), COST, EngineSettings(budget, max_seqs, 16))


def job(conversation: str, prompt: int, output: int, chain: int = 1) -> Job:
    return Job(Request(conversation, 1, 0.0, prompt, output, chain), 0.0)


def test_a_long_prompt_is_prefilled_in_chunks_of_the_token_budget() -> None:
    e = engine(budget=100)
    j = job("a", 250, 1)
    e.waiting.append(j)
    now = 0.0
    ends = []
    while (end := e.start(now)) is not None:
        e.finish(end)
        ends.append(end)
        now = end
    assert ends == pytest.approx([0.11, 0.22, 0.28])  # 100, 100, 50 tokens
    assert j.first_token_at == pytest.approx(0.28) == j.finished_at


def test_decoding_shares_steps_and_a_new_prompt_takes_the_budget_left() -> None:
    e = engine(budget=100)
    first, second = job("a", 10, 3, chain=1), job("b", 150, 2, chain=2)
    e.waiting.append(first)
    end = e.start(0.0)
    assert end == pytest.approx(0.02)  # 10 prompt tokens
    e.finish(end)
    e.waiting.append(second)
    # One decoder takes one token of the budget: 99 of the second prompt this step.
    end = e.start(end)
    assert e.step is not None
    assert e.step.chunks == [(second, 99)]
    assert end == pytest.approx(0.02 + 0.01 + 0.099 + 0.002)


def test_a_stretch_of_decode_steps_runs_at_once_and_an_arrival_cuts_it() -> None:
    e = engine()
    e.waiting.append(job("a", 10, 101))
    e.finish(e.start(0.0) or 0.0)  # prefill: 0.02 s
    end = e.start(0.02)
    assert e.step is not None
    assert e.step.repeat == 100
    assert end == pytest.approx(0.02 + 100 * 0.012)
    cut = e.cut(0.02 + 2.5 * 0.012)  # during the third step
    assert cut == pytest.approx(0.02 + 3 * 0.012)
    assert e.finish(cut) == []
    assert e.decoded == 3


def test_a_prompt_that_does_not_fit_waits_for_blocks_to_free() -> None:
    e = engine(budget=1000, blocks=10)
    big, other = job("a", 100, 2, chain=1), job("b", 100, 2, chain=2)  # 7 blocks each
    e.waiting.extend([big, other])
    end = e.start(0.0)
    assert e.step is not None
    assert [j for j, _ in e.step.chunks] == [big]
    while other.remaining == -1 and end is not None:
        e.finish(end)
        end = e.start(end)
    assert other.admitted_at == pytest.approx(big.finished_at)
