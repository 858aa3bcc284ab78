"""`kvmigrate plan` given hostile files and numbers: a one-line error and a usage or failure
exit code, never a traceback, never a plan computed from nonsense."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from kvmigrate.cli import main


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    path = tmp_path / "requests.jsonl"
    history = [{"role": "user", "content": "hi"}]
    lines = [
        {"messages": history, "user": "u"},
        {"messages": [*history, {"role": "assistant", "content": "x"},
                      {"role": "user", "content": "y"}], "user": "u"},
    ]  # fmt: skip
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def plan(dataset: Path, *args: str) -> Result:
    return CliRunner().invoke(main, ["plan", "--dataset", str(dataset), "--replicas", "1", *args])


def _clean_exit(result: Result, code: int) -> None:
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert result.exit_code == code, result.output


@pytest.mark.parametrize(
    "text",
    ["[1, 2]", "null", "5", '{"overhead_s": Infinity}', '{"overhead_s": 1e308}',
     '{"prefill_token_s": NaN}', '{"overhead_s": true}', "[" * 5000 + "]" * 5000,
     '{"overhead_s": -0.001}',
     '{"overhead_s": 0, "prefill_token_s": 0, "cached_token_s": 0, "decode_seq_s": 0, '
     '"request_s": 0, "attention_s": 0}',
     '{"prefill_token_s": 0}', '{"overhead_s": 0, "decode_seq_s": 0}'],
    ids=["list", "null", "number", "infinity", "huge", "nan", "bool", "deep", "negative",
         "all zero", "free prefill", "free decode"],
)  # fmt: skip
def test_a_cost_model_of_the_wrong_shape_or_range_is_refused(
    dataset: Path, tmp_path: Path, text: str
) -> None:
    cost = tmp_path / "cost.json"
    cost.write_text(text)
    result = plan(dataset, "--cost-model", str(cost))
    _clean_exit(result, 1)
    assert str(cost) in result.output
    assert "Fleet sizes" not in result.output


@pytest.mark.parametrize("option", ["--input-price", "--cached-input-price", "--output-price"])
@pytest.mark.parametrize("value", ["nan", "inf", "-1"])
def test_hosted_prices_must_be_finite_and_not_negative(
    dataset: Path, option: str, value: str
) -> None:
    result = plan(dataset, option, value)
    _clean_exit(result, 2)
    assert option in result.output


@pytest.mark.parametrize("option", ["--html", "--save-cost-model"])
def test_an_output_file_in_a_missing_folder_is_refused_before_the_simulation(
    dataset: Path, tmp_path: Path, option: str
) -> None:
    result = plan(dataset, option, str(tmp_path / "missing" / "out"))
    _clean_exit(result, 2)
    assert "does not exist" in result.output
    assert "simulated" not in result.output


@pytest.mark.parametrize("url", ["http://[::1", "htp:/bad", "http://host:99999/v1", "localhost"])
def test_a_malformed_calibration_url_is_a_usage_error(dataset: Path, url: str) -> None:
    result = plan(dataset, "--calibrate", url)
    _clean_exit(result, 2)
    assert "--calibrate" in result.output


def test_a_conversation_larger_than_the_kv_cache_is_refused_and_said(tmp_path: Path) -> None:
    """The issue's case: a 50K-token conversation on an A10G (41,952 cached tokens) showed
    a 99% hit on turn 2. vLLM cannot hold it: both turns are refused, and the plan says so."""
    path = tmp_path / "big.jsonl"
    big = [{"role": "user", "content": "x" * 200_000}, {"role": "assistant", "content": "ok"},
           {"role": "user", "content": "more"}]  # fmt: skip
    path.write_text(json.dumps({"messages": big}) + "\n")
    result = plan(path, "--gpu", "a10g")
    _clean_exit(result, 1)  # nothing ran: no fleet meets the SLO
    assert (
        "WARNING: 2 of 2 requests (100.0%) need more KV cache than one replica holds "
        "(41,952 tokens)" in result.output
    )
    data = json.loads(plan(path, "--gpu", "a10g", "--json").output)
    assert data["sizes"][0]["refused"] == 2
    assert data["sizes"][0]["ttft_p95_s"] is None
    assert data["sizes"][0]["turns"] == []


def test_an_absurd_max_tokens_is_a_named_error(tmp_path: Path) -> None:
    path = tmp_path / "cap.jsonl"
    line = {"body": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1e11}}
    path.write_text(json.dumps(line) + "\n")
    result = plan(path)
    _clean_exit(result, 1)
    assert f"{path}:1: body.max_tokens must be a whole number from 1 to 1,000,000" in result.output
