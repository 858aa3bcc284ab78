"""`kvmigrate parity` end to end: a hosted-profile primary and a vLLM-profile candidate,
both emulated, wired through a config file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from parity_support import HOSTED_MODEL, chat_requests, emulator, write_config, write_dataset

from kvmigrate.cli import main
from kvmigrate.emulator import FaultRates

REQUESTS = 24


def run_parity(config: Path, dataset: Path, *extra: str) -> Result:
    args = ["parity", "--config", str(config), "--dataset", str(dataset),
            "--repeats", "2", "--min-noise-samples", "10", "--concurrency", "4", *extra]  # fmt: skip
    return CliRunner().invoke(main, args, catch_exceptions=False)


def report_of(result: Result) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(result.stdout)
    return data


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    return write_dataset(tmp_path / "requests.jsonl", chat_requests(REQUESTS), batch=True)


def test_a_healthy_candidate_passes(tmp_path: Path, dataset: Path) -> None:
    with emulator("hosted") as hosted, emulator("vllm") as vllm:
        config = write_config(tmp_path / "config.yaml", hosted.url, vllm.url)
        result = run_parity(config, dataset, "--min-score", "0.5", "--json")
    assert result.exit_code == 0, result.output
    report = report_of(result)
    assert report["verdict"] == "passed"
    assert report["status"] == "conclusive"
    assert report["requests"] == REQUESTS
    assert report["candidate_pairs"] == REQUESTS
    assert report["noise_pairs"] == 2 * REQUESTS
    names = {c["name"] for c in report["comparators"]}
    assert {"text", "tool_calls", "structured", "finish_reason", "api_shape"} <= names
    assert report["errors"] == {"primary": {}, "candidate": {}}


def test_a_regressed_candidate_fails_the_threshold(tmp_path: Path, dataset: Path) -> None:
    """A candidate whose answers are much shorter: a deterministic regression."""
    with (
        emulator("hosted") as hosted,
        emulator("vllm", min_output_tokens=4, max_output_tokens_default=5) as vllm,
    ):
        config = write_config(tmp_path / "config.yaml", hosted.url, vllm.url)
        result = run_parity(config, dataset, "--min-score", "0.9")
    assert result.exit_code == 1, result.output
    assert "FAILED" in result.stdout
    assert "length" in result.stdout
    assert "worst examples (redacted)" in result.stdout
    assert "requests" in result.stderr  # the progress bar


def test_without_noise_samples_the_verdict_is_inconclusive(tmp_path: Path, dataset: Path) -> None:
    with emulator("hosted") as hosted, emulator("vllm") as vllm:
        config = write_config(tmp_path / "config.yaml", hosted.url, vllm.url)
        result = run_parity(config, dataset, "--repeats", "0", "--min-score", "0.5", "--json")
    assert result.exit_code == 3, result.output
    report = report_of(result)
    assert report["verdict"] == "inconclusive"
    assert report["parity"] is None
    # Without a threshold the same run only reports.
    with emulator("hosted") as hosted, emulator("vllm") as vllm:
        config = write_config(tmp_path / "config.yaml", hosted.url, vllm.url)
        assert run_parity(config, dataset, "--repeats", "0").exit_code == 0


def test_candidate_faults_are_counted_not_fatal(tmp_path: Path, dataset: Path) -> None:
    faults = FaultRates(error_rate=0.25, disconnect_rate=0.15)
    with emulator("hosted") as hosted, emulator("vllm", faults=faults, fault_seed=7) as vllm:
        config = write_config(tmp_path / "config.yaml", hosted.url, vllm.url)
        result = run_parity(config, dataset, "--json")
    assert result.exit_code == 0, result.output
    report = report_of(result)
    errors = report["errors"]["candidate"]
    assert errors.get("http_500", 0) > 0
    assert sum(errors.values()) < REQUESTS
    assert report["requests"] == REQUESTS
    shape = next(c for c in report["comparators"] if c["name"] == "api_shape")
    assert shape["candidate"]["disagree"] >= errors["http_500"]


def test_keys_go_only_where_they_belong(
    tmp_path: Path, dataset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PARITY_HOSTED_KEY", "sk-hosted-secret-0123456789")
    monkeypatch.setenv("PARITY_VLLM_KEY", "vllm-key")
    hosted_seen: list[str] = []
    vllm_seen: list[str] = []
    with (
        emulator("hosted", hosted_seen, api_key="sk-hosted-secret-0123456789") as hosted,
        emulator("vllm", vllm_seen, api_key="vllm-key") as vllm,
    ):
        config = write_config(tmp_path / "config.yaml", hosted.url, vllm.url,
                              hosted_key="os.environ/PARITY_HOSTED_KEY",
                              vllm_key="os.environ/PARITY_VLLM_KEY")  # fmt: skip
        result = run_parity(config, dataset, "--json")
    assert result.exit_code == 0, result.output
    assert report_of(result)["errors"] == {"primary": {}, "candidate": {}}
    assert set(hosted_seen) == {"Bearer sk-hosted-secret-0123456789"}
    assert set(vllm_seen) == {"Bearer vllm-key"}


def test_a_primary_without_a_key_uses_the_environment_and_the_candidate_gets_none(
    tmp_path: Path, dataset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env-0123456789")
    vllm_seen: list[str] = []
    with (
        emulator("hosted", api_key="sk-from-env-0123456789") as hosted,
        emulator("vllm", vllm_seen) as vllm,
    ):
        config = write_config(tmp_path / "config.yaml", hosted.url, vllm.url)
        result = run_parity(config, dataset, "--json")
    assert result.exit_code == 0, result.output
    assert report_of(result)["errors"] == {"primary": {}, "candidate": {}}
    assert set(vllm_seen) == {""}


def test_plain_bodies_unknown_models_and_bad_lines(tmp_path: Path) -> None:
    bodies = [*chat_requests(3), {**chat_requests(1)[0], "model": "not-configured"}]
    plain = write_dataset(tmp_path / "plain.jsonl", bodies)
    with emulator("hosted") as hosted, emulator("vllm") as vllm:
        config = write_config(tmp_path / "config.yaml", hosted.url, vllm.url)
        result = run_parity(config, plain, "--json")
        assert result.exit_code == 0, result.output
        report = report_of(result)
        assert report["requests"] == 4
        assert report["skipped"] == 1
        assert "not-configured" in next(iter(report["skip_reasons"]))
        broken = tmp_path / "broken.jsonl"
        broken.write_text(json.dumps({"model": HOSTED_MODEL, "messages": []}) + "\n{oops\n")
        bad = run_parity(config, broken)
    assert bad.exit_code == 2
    assert "broken.jsonl:2" in bad.output


def _details(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_details_name_the_requests_that_diverged_and_baseline_reports_what_changed(
    tmp_path: Path, dataset: Path
) -> None:
    with (
        emulator("hosted") as hosted,
        emulator("vllm") as healthy,
        emulator("vllm", min_output_tokens=4, max_output_tokens_default=5) as short,
    ):
        good_config = write_config(tmp_path / "good.yaml", hosted.url, healthy.url)
        bad_config = write_config(tmp_path / "bad.yaml", hosted.url, short.url)
        good = run_parity(good_config, dataset, "--json", "--details", str(tmp_path / "good.jsonl"))
        (tmp_path / "good.json").write_text(good.stdout)
        bad = run_parity(
            bad_config, dataset, "--json", "--details", str(tmp_path / "bad.jsonl"),
            "--baseline", str(tmp_path / "good.json"),
        )  # fmt: skip
        fixed = run_parity(
            good_config, dataset, "--baseline", str(tmp_path / "bad.jsonl"),
            "--details", str(tmp_path / "again.jsonl"),
        )  # fmt: skip

    good_lines, bad_lines = _details(tmp_path / "good.jsonl"), _details(tmp_path / "bad.jsonl")
    assert len(good_lines) == len(bad_lines) == REQUESTS
    # One line per request, side by side: both answers, the verdict and what it rests on.
    for line in bad_lines:
        assert {"id", "verdict", "diverged_on", "within_noise", "comparators"} <= line.keys()
        assert line["primary"]
        assert line["candidate"]
    bad_ids = {line["id"] for line in bad_lines if line["verdict"] == "diverged"}
    good_ids = {line["id"] for line in good_lines if line["verdict"] == "diverged"}
    new = [line for line in bad_lines if line["id"] in bad_ids - good_ids]
    assert new  # the short text answers diverge, each naming what it diverged on
    assert all(line["diverged_on"] for line in new)
    assert any("length" in line["diverged_on"] for line in new)
    # The same verdicts go into the --json report, for the next run's --baseline.
    verdicts = {r["id"]: r["verdict"] for r in report_of(good)["per_request"]}
    assert verdicts == {line["id"]: line["verdict"] for line in good_lines}

    assert bad.exit_code == 1, bad.output  # new divergences fail CI against the baseline
    changes = report_of(bad)["changes"]
    assert set(changes["new_divergences"]) == bad_ids - good_ids
    assert set(changes["still_diverged"]) == bad_ids & good_ids
    # Fixed: diverged against the baseline, agrees now (this run's own verdicts decide,
    # since a healthy candidate may diverge on another request by chance).
    again = {line["id"]: line["verdict"] for line in _details(tmp_path / "again.jsonl")}
    now_fixed = {i for i in bad_ids if again[i] in ("agree", "within_noise")}
    assert now_fixed
    assert f"fixed            {len(now_fixed):>4}" in fixed.output
    newly = {i for i, v in again.items() if v == "diverged" and i not in bad_ids}
    assert fixed.exit_code == (1 if newly else 0), fixed.output


def test_a_baseline_that_is_no_parity_report_is_refused(tmp_path: Path, dataset: Path) -> None:
    junk = tmp_path / "junk.json"
    junk.write_text('{"something": "else"}')
    with emulator("hosted") as hosted, emulator("vllm") as vllm:
        config = write_config(tmp_path / "config.yaml", hosted.url, vllm.url)
        result = CliRunner().invoke(
            main, ["parity", "--config", str(config), "--dataset", str(dataset),
                   "--baseline", str(junk)],
        )  # fmt: skip
    assert result.exit_code == 2
    assert "per_request" in result.output
