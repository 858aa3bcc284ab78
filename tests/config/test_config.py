"""Config loading: the example file, secrets, and every refusal names its key path."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kvmigrate.config import ConfigError, Secret, load_config, parse_config

ROOT = Path(__file__).resolve().parents[2]

MINIMAL = """
backends:
  hosted: {api_base: "https://api.openai.com/v1/"}
  vllm: {api_base: ["http://10.0.0.1:8000/v1", "http://10.0.0.2:8000/v1"]}
models:
  - {model_name: gpt-4o-mini, hosted: gpt-4o-mini, vllm: llama}
"""


@pytest.mark.parametrize(
    "entry",
    [
        "{model_name: only-vllm, vllm: m}",  # a model on the candidate alone
        "{model_name: two-setups, vllm: m, other: m, candidates: [vllm, other]}",
        "{model_name: on-both, hosted: m, vllm: m, other: m}",
    ],
)
def test_a_model_the_primary_does_not_serve_may_be_on_its_candidates(entry: str) -> None:
    text = MINIMAL.replace("  hosted:", "  other: {api_base: 'http://c'}\n  hosted:")
    config = parse_config(text + f"  - {entry}\n", env={})
    assert len(config.models) == 2


def test_example_config_loads() -> None:
    config = load_config(ROOT / "config.yaml", env={})
    assert config.server.port == 4000
    assert config.rollout.mode == "shadow"
    assert config.rollout.steps == (10.0, 50.0, 100.0)
    assert config.route("gpt-4o-mini") is not None
    assert config.primary.name == "hosted"
    assert config.candidate.api_base == "http://127.0.0.1:8000/v1"


def test_defaults_and_normalisation() -> None:
    config = parse_config(MINIMAL, env={})
    assert config.primary.api_base == "https://api.openai.com/v1"  # trailing slash dropped
    assert config.candidate.api_bases == ("http://10.0.0.1:8000/v1", "http://10.0.0.2:8000/v1")
    route = config.route("gpt-4o-mini")
    assert route is not None
    assert route.served_name("vllm") == "llama"
    assert config.route("unknown") is None
    assert config.record.content == "redacted"


def test_secrets_come_from_env_and_never_print() -> None:
    text = MINIMAL + "server: {master_key: os.environ/MK}\n"
    config = parse_config(text, env={"MK": "sk-very-secret"})
    key = config.server.master_key
    assert isinstance(key, Secret)
    assert key.reveal() == "sk-very-secret"
    assert key.matches("sk-very-secret")
    assert not key.matches("sk-very-secreT")
    assert "sk-very-secret" not in repr(config)
    assert "sk-very-secret" not in str(key)


@pytest.mark.parametrize(
    ("extra", "path", "reason"),
    [
        ("rollout: {percent: 150}", "rollout.percent", "at most 100"),
        ("rollout: {percent: -1}", "rollout.percent", "at least 0"),
        ("rollout: {percent: ten}", "rollout.percent", "expected a number"),
        ("rollout: {mode: canary}", "rollout.mode", "must be one of shadow, split"),
        ("rollout: {shadow_sampel: 0.5}", "rollout.shadow_sampel", "did you mean 'shadow_sample'"),
        ("rollout: {shadow_sample: 2}", "rollout.shadow_sample", "at most 1"),
        ("rollout: {steps: [50, 10]}", "rollout.steps[1]", "must increase"),
        ("rollout: {steps: [0, 10]}", "rollout.steps[0]", "(0, 100]"),
        ("rollout: {primary: nope}", "rollout.primary", "must be one of hosted, vllm"),
        ("rollout: {candidate: hosted}", "rollout.candidate", "must differ"),
        ("rollout: {state: 'mysql://x'}", "rollout.state", "sqlite://"),
        ("record: {content: all}", "record.content", "none, redacted, full"),
        ("record: {db: 'redis://x'}", "record.db", "postgresql://"),
        ("server: {port: 70000}", "server.port", "at most 65535"),
        ("server: {port: true}", "server.port", "whole number"),
        ("server: {master_key: os.environ/UNSET_VAR}", "server.master_key", "UNSET_VAR is not set"),
        ("server: {master_key: ''}", "server.master_key", "is empty"),
        ("server: [1, 2]", "server", "expected a mapping"),
        ("extra_section: {}", "extra_section", "unknown key"),
    ],
)
def test_bad_values_are_refused_with_path(extra: str, path: str, reason: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(MINIMAL + extra + "\n", source="cfg.yaml", env={})
    assert caught.value.path == path
    assert reason in caught.value.reason
    assert str(caught.value).startswith(f"cfg.yaml: {path}: ")


@pytest.mark.parametrize(
    ("text", "path", "reason"),
    [
        ("backends: {}\n", "backends", "at least one backend"),
        ("backends: {hosted: {}}\n", "backends.hosted.api_base", "is required"),
        ("backends: {hosted: {api_base: 'ftp://x'}}\n", "backends.hosted.api_base", "http"),
        ("backends: {hosted: {api_base: []}}\n", "backends.hosted.api_base", "empty"),
        (
            "backends: {hosted: {api_base: 'http://a', candidate_headers: ['x a']}}\n",
            "backends.hosted.candidate_headers[0]",
            "not an HTTP header name",
        ),
        (
            "backends: {hosted: {api_base: 'http://a', candidate_headers: x-a}}\n",
            "backends.hosted.candidate_headers",
            "expected a list",
        ),
        (
            "backends: {hosted: {api_base: 'http://a', apikey: x}}\n",
            "backends.hosted.apikey",
            "did you mean 'api_key'",
        ),
        (
            MINIMAL + "  - {model_name: gpt-4o-mini, hosted: x}\n",
            "models[1].model_name",
            "duplicate",
        ),
        (
            MINIMAL.replace("vllm: llama", "vlm: llama"),
            "models[0].vlm",
            "not a backend name",
        ),
        (
            "backends: {hosted: {api_base: 'http://a'}, vllm: {api_base: 'http://b'}}\nmodels: {}\n",
            "models",
            "expected a list",
        ),
        (
            # Not on the primary: the candidate alone answers it, so `other` never would.
            MINIMAL.replace("  hosted:", "  other: {api_base: 'http://c'}\n  hosted:")
            + "  - {model_name: second, other: m, vllm: m}\n",
            "models[1].other",
            "neither the rollout's primary ('hosted') nor a candidate",
        ),
        (
            MINIMAL.replace("  hosted:", "  other: {api_base: 'http://c'}\n  hosted:")
            + "  - {model_name: second, other: m}\n",
            "models[1].other",
            "answered by its candidate alone",
        ),
    ],
)
def test_structural_errors(text: str, path: str, reason: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(text, env={})
    assert caught.value.path == path
    assert reason in caught.value.reason


@pytest.mark.parametrize(
    "name",
    [
        "X-Goog-Api-Key",
        "X-Amz-Security-Token",
        "Ocp-Apim-Subscription-Key",
        "Cookie",
        "Authorization",
        "X-Api-Key",
        "Proxy-Authorization",
        "Api-Key",
        "OpenAI-Organization",
        "X-Auth-Token",
        "X-Session-Token",
        "X-Client-Secret",
        "X-Signature",
    ],
)
def test_candidate_headers_refuse_a_name_that_may_carry_a_credential(name: str) -> None:
    text = f"backends: {{hosted: {{api_base: 'http://a', candidate_headers: [x-ok, {name}]}}}}\n"
    with pytest.raises(ConfigError) as caught:
        parse_config(text, env={})
    assert caught.value.path == "backends.hosted.candidate_headers[1]"
    assert caught.value.reason == (
        f"{name!r} may carry a credential (its name says so), and a candidate never gets a "
        "client's credentials; give the backend its own `api_key`"
    )


def test_candidate_headers_keep_the_ids_and_test_bed_headers() -> None:
    names = "[X-Session-ID, x-emulator-fault, X-Split, x-end-after, X-Request-Id, x-keyboard]"
    text = MINIMAL.replace('8000/v1"]}', f'8000/v1"], candidate_headers: {names}}}')
    config = parse_config(text, env={})
    assert config.backends["vllm"].candidate_headers == (
        "x-session-id", "x-emulator-fault", "x-split", "x-end-after", "x-request-id", "x-keyboard"
    )  # fmt: skip


@pytest.mark.parametrize("anchor", ["", "&a "])
def test_yaml_nested_too_deeply_is_a_config_error_not_a_recursion_error(
    tmp_path: Path, anchor: str
) -> None:
    deep = tmp_path / "deep.yaml"
    deep.write_text(f"server: {anchor}" + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(ConfigError, match="nested too deeply"):
        load_config(deep, env={})


def test_yaml_syntax_error_names_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("server:\n  port: [4000\n")
    with pytest.raises(ConfigError) as caught:
        load_config(bad, env={})
    assert "not valid YAML" in caught.value.reason
    assert "line" in caught.value.reason


def test_missing_file() -> None:
    with pytest.raises(ConfigError, match="file not found"):
        load_config("/nonexistent/kvmigrate.yaml", env={})


def test_cli_reports_config_typo_without_traceback(tmp_path: Path) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(textwrap.dedent(MINIMAL) + "rollout: {percnt: 10}\n")
    proc = subprocess.run(
        [sys.executable, "-m", "kvmigrate", "config", "check", "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert "rollout.percnt: unknown key (did you mean 'percent'?)" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_secret_compared_with_undecodable_header_bytes_is_a_mismatch() -> None:
    """aiohttp hands over header bytes that are not UTF-8 as lone surrogates (issue 21)."""
    from kvmigrate.config import Secret

    secret = Secret("café")
    assert not secret.matches("caf\udce9")
    assert secret.matches("café")


def test_config_check_names_every_missing_secret_and_tells_empty_from_unset(
    tmp_path: Path,
) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        "server: {master_key: os.environ/KVM_T_MASTER, admin_key: os.environ/KVM_T_ADMIN}\n"
        "backends:\n"
        "  hosted: {api_base: 'https://api.openai.com/v1', api_key: os.environ/KVM_T_OPENAI}\n"
        "  vllm: {api_base: 'http://127.0.0.1:8000/v1', api_key: os.environ/KVM_T_VLLM}\n"
        "models: [{model_name: m, hosted: m, vllm: m}]\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVM_T_")}
    env["KVM_T_ADMIN"] = "admin-key"
    env["KVM_T_VLLM"] = ""
    proc = subprocess.run(
        [sys.executable, "-m", "kvmigrate", "config", "check", "--config", str(cfg)],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert proc.returncode == 1
    assert "server.master_key: environment variable KVM_T_MASTER is not set" in proc.stderr
    assert "backends.hosted.api_key: environment variable KVM_T_OPENAI is not set" in proc.stderr
    assert "backends.vllm.api_key: environment variable KVM_T_VLLM is set but empty" in proc.stderr
    assert "KVM_T_ADMIN" not in proc.stderr
    assert "Traceback" not in proc.stderr
