"""`kvmigrate init`: from an empty directory to a config the proxy loads, with the example's
comments, for the user's own URLs; never over an existing file unless --force."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from kvmigrate.cli import main
from kvmigrate.config import load_config
from kvmigrate.config.init import example_text

REPO_EXAMPLE = Path(__file__).resolve().parents[2] / "config.yaml"


def _init(folder: Path, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["init", "--config", str(folder / "config.yaml"), *args])
    return result.exit_code, result.output


def test_the_packaged_example_is_the_repository_config() -> None:
    """One place for the comments: after editing config.yaml, run
    `cp config.yaml kvmigrate/config/example.yaml`."""
    assert example_text() == REPO_EXAMPLE.read_text(encoding="utf-8")


def test_a_new_directory_is_told_to_run_init(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main, ["report", "--config", str(tmp_path / "config.yaml")], catch_exceptions=False
    )
    assert result.exit_code == 1
    assert result.output == (
        f'Error: {tmp_path}/config.yaml: file not found: run "kvmigrate init" to write one, '
        "or pass --config\n"
    )


def test_init_writes_the_example_with_the_given_endpoints(tmp_path: Path) -> None:
    code, out = _init(
        tmp_path,
        "--hosted-url", "https://api.openai.com/v1",
        "--vllm-url", "http://vllm.internal:8000/v1",
        "--model", "gpt-4.1",
        "--vllm-model", "Qwen/Qwen3-32B",
        "--port", "4100",
    )  # fmt: skip
    assert code == 0, out
    config = load_config(tmp_path / "config.yaml", env={})
    assert config.server.port == 4100
    assert config.backends["hosted"].api_bases == ("https://api.openai.com/v1",)
    assert config.backends["vllm"].api_bases == ("http://vllm.internal:8000/v1",)
    [route] = [m for m in config.models if m.model_name == "gpt-4.1"]
    assert (route.served["hosted"], route.served["vllm"]) == ("gpt-4.1", "Qwen/Qwen3-32B")
    written = (tmp_path / "config.yaml").read_text(encoding="utf-8").splitlines()
    example = REPO_EXAMPLE.read_text(encoding="utf-8").splitlines()
    # Two header lines, then the example line for line; the changed ones keep their comments.
    assert len(written) == len(example) + 2
    changed = [w for w, e in zip(written[2:], example, strict=True) if w != e]
    assert changed == [
        "  port: 4100",
        "    api_base: http://vllm.internal:8000/v1 # or a list of replica URLs",
        "  - model_name: gpt-4.1           # what clients send",
        "    hosted: gpt-4.1               # what each backend serves",
        "    vllm: Qwen/Qwen3-32B",
    ]
    assert out.splitlines()[0] == (
        f"wrote {tmp_path}/config.yaml: gpt-4.1 from https://api.openai.com/v1 (primary), "
        "Qwen/Qwen3-32B at http://vllm.internal:8000/v1 (candidate), in shadow mode"
    )


def test_emulated_points_at_the_emulators_and_says_how_to_start_them(tmp_path: Path) -> None:
    code, out = _init(tmp_path, "--emulated")
    assert code == 0, out
    config = load_config(tmp_path / "config.yaml", env={})
    assert config.backends["hosted"].api_bases == ("http://127.0.0.1:8001/v1",)
    assert config.backends["vllm"].api_bases == ("http://127.0.0.1:8000/v1",)
    assert "  kvmigrate emulate --profile hosted --port 8001 &" in out.splitlines()
    assert "  kvmigrate emulate --profile vllm --port 8000 &" in out.splitlines()


def test_a_model_name_yaml_would_misread_is_written_quoted(tmp_path: Path) -> None:
    code, out = _init(tmp_path, "--model", "team: bot #1")
    assert code == 0, out
    config = load_config(tmp_path / "config.yaml", env={})
    assert "team: bot #1" in [m.model_name for m in config.models]


def test_an_existing_file_is_kept_unless_forced(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("mine\n")
    code, out = _init(tmp_path, "--emulated")
    assert code == 1
    assert out == f"Error: {tmp_path}/config.yaml exists: pass --force to overwrite it\n"
    assert (tmp_path / "config.yaml").read_text() == "mine\n"
    code, out = _init(tmp_path, "--emulated", "--force")
    assert code == 0, out
    load_config(tmp_path / "config.yaml", env={})


@pytest.mark.parametrize("option", ["--hosted-url", "--vllm-url", "--model", "--vllm-model"])
def test_emulated_refuses_an_endpoint_of_its_own(tmp_path: Path, option: str) -> None:
    value = "http://127.0.0.1:9/v1" if option.endswith("url") else "m"
    code, out = _init(tmp_path, "--emulated", option, value)
    assert code == 2
    assert f"Error: --emulated sets the URLs and models; drop {option}" in out
    assert not (tmp_path / "config.yaml").exists()


def test_a_url_that_is_not_one_is_refused_before_writing(tmp_path: Path) -> None:
    code, out = _init(tmp_path, "--vllm-url", "vllm:8000")
    assert code == 2
    assert "is not an http(s) URL" in out
    assert not (tmp_path / "config.yaml").exists()
