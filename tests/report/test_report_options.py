"""`kvmigrate report`'s numbers are checked as the other commands' are, and an empty report
says why it checked no cache busters (outside probe D)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvmigrate.cli import main
from kvmigrate.report import Prices, build_report
from kvmigrate.report.tables import cache_busters

CONFIG = """
backends:
  hosted: {{api_base: "http://127.0.0.1:9/v1"}}
  vllm: {{api_base: "http://127.0.0.1:9/v1"}}
models:
  - {{model_name: m, hosted: m, vllm: m}}
record: {{db: "sqlite:///{root}/records.db", content: redacted}}
"""


@pytest.fixture
def config_path(tmp_path: Path) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(CONFIG.format(root=tmp_path))
    return str(path)


@pytest.mark.parametrize(
    "option",
    [
        ["--max-turn", "0"],
        ["--max-turn", "-1"],
        ["--gpu-tokens-per-s", "-5"],
        ["--gpu-tokens-per-s", "0"],
        ["--min-gpus", "-3"],
        ["--input-price", "-1"],
        ["--cached-input-price", "-1"],
        ["--cache-write-price", "-1"],
        ["--output-price", "-1"],
        ["--gpu-hour-price", "-1"],
        ["--input-price", "nan"],
    ],
)
def test_nonsensical_numbers_are_a_usage_error(config_path: str, option: list[str]) -> None:
    result = CliRunner().invoke(main, ["report", "--config", config_path, *option])
    assert result.exit_code == 2, result.output
    assert option[0] in result.output


def test_sensible_numbers_still_make_a_report(config_path: str) -> None:
    """The edge values are taken, and reach the report as given."""
    args = ["--max-turn", "1", "--gpu-tokens-per-s", "0.5", "--min-gpus", "0"]
    result = CliRunner().invoke(
        main,
        ["report", "--config", config_path, *args, "--input-price", "0", "--format", "json"],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["cost"]["prices"] == {
        "input_per_m": 0.0,
        "cached_input_per_m": 1.25,
        "output_per_m": 10.0,
        "gpu_per_hour": 3.5,
        "gpu_tokens_per_s": 0.5,
        "min_gpus": 0,
        "cache_write_per_m": None,
    }
    assert report["records"] == 0
    assert report["notes"] == ["No records in this window: nothing to report yet."]
    text = CliRunner().invoke(main, ["report", "--config", config_path, *args])
    assert text.exit_code == 0, text.output
    assert "No records in this window: nothing to report yet." in text.output


def test_an_empty_report_says_there_were_no_requests_not_that_content_is_none() -> None:
    report = build_report(None, 0.0, 1.0, primary="hosted", candidate="vllm", prices=Prices())
    note = cache_busters(report).note
    assert "record.content: none" not in note
    assert note == "No recorded requests in this window to check."
