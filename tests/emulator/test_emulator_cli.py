"""`kvmigrate emulate` maps its flags onto `EmulatorSettings` and calls the library."""

from __future__ import annotations

import importlib

import pytest
from click.testing import CliRunner

from kvmigrate.cli import main
from kvmigrate.emulator import EmulatorSettings, LatencySettings

# The package re-exports the command under the module's name, so fetch the module itself.
emulate_module = importlib.import_module("kvmigrate.cli.emulate")


def test_flags_map_onto_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    captured: list[tuple[EmulatorSettings, str, int]] = []
    monkeypatch.setattr(emulate_module, "serve", lambda s, h, p: captured.append((s, h, p)))
    result = CliRunner().invoke(
        main,
        [
            "emulate", "--profile", "vllm", "--port", "9123", "--name", "candidate",
            "--model", "a", "--model", "b", "--time-scale", "0", "--prefill-rate", "1000",
            "--engine-concurrency", "2", "--no-prompt-tokens-details", "--error-rate", "0.25",
            "--slow-first-byte", "1.5", "--api-key", "k", "--block-size", "32",
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    settings, host, port = captured[0]
    assert (host, port) == ("127.0.0.1", 9123)
    assert settings.profile == "vllm"
    assert settings.instance_name == "candidate"
    assert settings.served_models == ("a", "b")
    assert settings.time_scale == 0
    assert settings.api_key == "k"
    assert settings.block_size == 32
    assert settings.prompt_tokens_details is False
    assert settings.faults.error_rate == 0.25
    assert settings.faults.slow_first_byte_s == 1.5
    latency = settings.latency_settings
    assert latency.prefill_tokens_per_s == 1000
    assert latency.engine_concurrency == 2
    assert latency.decode_tokens_per_s == LatencySettings.vllm().decode_tokens_per_s


def test_hosted_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    captured: list[EmulatorSettings] = []
    monkeypatch.setattr(emulate_module, "serve", lambda s, h, p: captured.append(s))
    result = CliRunner().invoke(main, ["emulate", "--profile", "hosted"])
    assert result.exit_code == 0, result.output
    settings = captured[0]
    assert settings.served_models == ("gpt-4o-mini", "text-embedding-3-small")
    assert settings.latency_settings == LatencySettings.hosted()
    assert settings.context_limit == 128_000


def test_help_documents_faults_and_rejects_bad_profile() -> None:
    runner = CliRunner()
    help_text = runner.invoke(main, ["emulate", "--help"]).output
    assert "x-emulator-fault" in help_text
    assert "--time-scale" in help_text
    assert runner.invoke(main, ["emulate", "--profile", "openai"]).exit_code == 2
