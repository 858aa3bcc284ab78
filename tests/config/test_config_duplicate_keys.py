"""A key written twice in one YAML mapping is a config error naming its path and both lines.

PyYAML keeps the last of two equal keys and drops the other without a word: a second
`rollout:` block, a second `percent:` or two backends of one name loaded as if the first
had never been written. Merge keys (`<<: *base`) still override as YAML means them.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvmigrate.cli import main
from kvmigrate.config import ConfigError, load_config

BACKENDS = """\
backends:
  hosted: {api_base: "https://api.openai.com/v1"}
  vllm: {api_base: "http://10.0.0.1:8000/v1"}
models:
  - {model_name: gpt-4o-mini, hosted: gpt-4o-mini, vllm: llama}
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def _refusal(path: Path) -> str:
    with pytest.raises(ConfigError) as caught:
        load_config(path, env={})
    return str(caught.value)


@pytest.mark.parametrize(
    ("text", "where"),
    [
        (
            BACKENDS + "rollout:\n  percent: 10\n# the second block\nrollout:\n  percent: 50\n",
            "rollout: duplicate key (lines 6 and 9)",
        ),
        (
            BACKENDS + "rollout:\n  percent: 10\n  mode: shadow\n\n  percent: 50\n",
            "rollout.percent: duplicate key (lines 7 and 10)",
        ),
        (
            BACKENDS.replace("models:", '  vllm: {api_base: "http://10.0.0.2:8000/v1"}\nmodels:'),
            "backends.vllm: duplicate key (lines 3 and 4)",
        ),
        (
            BACKENDS + "  - model_name: second\n    hosted: a\n    vllm: b\n    hosted: c\n",
            "models[1].hosted: duplicate key (lines 7 and 9)",
        ),
        (
            BACKENDS + "server: {port: 4000, host: 0.0.0.0, port: 4001}\n",
            "server.port: duplicate key (line 6, columns 10 and 37)",
        ),
    ],
    ids=["top-level", "nested", "backend-name", "in-a-list", "flow-mapping"],
)
def test_a_key_written_twice_names_its_path_and_both_lines(
    tmp_path: Path, text: str, where: str
) -> None:
    path = _write(tmp_path, text)
    assert _refusal(path) == (
        f"{path}: {where}: a mapping keeps only the last one; remove the other"
    )


@pytest.mark.parametrize(
    ("pair", "spelled"),
    [
        ("yes: 1\n    true: 2", "'yes' and 'true' both load as the key True"),
        ("~: 1\n    null: 2", "'~' and 'null' both load as the key None"),
        ("0x10: 1\n    16: 2", "'0x10' and '16' both load as the key 16"),
    ],
    ids=["yes-true", "tilde-null", "hex-decimal"],
)
def test_two_spellings_of_one_key_are_a_duplicate_named_as_written(
    tmp_path: Path, pair: str, spelled: str
) -> None:
    text = BACKENDS.replace("models:", f"  extra:\n    {pair}\nmodels:")
    message = _refusal(_write(tmp_path, text))
    assert "backends.extra." in message
    assert f"duplicate key (lines 5 and 6): {spelled}" in message


def test_a_number_and_the_string_of_it_are_two_keys(tmp_path: Path) -> None:
    # `1` and `"1"` load as 1 and "1": both kept, so only the later repeat is refused.
    text = BACKENDS.replace("models:", "  extra: {1: a, '1': b}\nmodels:")
    text += "rollout: {percent: 10, percent: 10}\n"
    message = _refusal(_write(tmp_path, text))
    assert "rollout.percent: duplicate key" in message
    assert "extra" not in message


def test_a_key_next_to_a_merge_overrides_it_but_twice_is_refused(tmp_path: Path) -> None:
    merged = BACKENDS.replace(
        '  hosted: {api_base: "https://api.openai.com/v1"}\n'
        '  vllm: {api_base: "http://10.0.0.1:8000/v1"}',
        "  hosted: &hosted {api_base: 'https://api.openai.com/v1', read_timeout: 30}\n"
        "  vllm:\n"
        "    <<: *hosted\n"
        "    api_base: http://10.0.0.1:8000/v1",
    )
    vllm = load_config(_write(tmp_path, merged), env={}).backends["vllm"]
    assert vllm.api_base == "http://10.0.0.1:8000/v1"  # given here: overrides the merge
    assert vllm.read_timeout == 30  # from the merge
    twice = merged.replace(
        "    api_base: http://10.0.0.1:8000/v1",
        "    api_base: http://10.0.0.1:8000/v1\n    api_base: http://10.0.0.2:8000/v1",
    )
    message = _refusal(_write(tmp_path, twice))
    assert "backends.vllm.api_base: duplicate key (lines 5 and 6)" in message


def test_two_merge_keys_in_one_mapping_are_refused_with_the_list_form(tmp_path: Path) -> None:
    text = (
        "a: &a {percent: 10}\nb: &b {percent: 20}\n" + BACKENDS + "rollout:\n  <<: *a\n  <<: *b\n"
    )
    message = _refusal(_write(tmp_path, text))
    assert "rollout.<<: duplicate key (lines 9 and 10)" in message
    assert "`<<: [*a, *b]`" in message


def test_a_duplicate_under_many_aliases_is_found_at_once(tmp_path: Path) -> None:
    # Every alias of `a0` leads to the same two keys (9^4 paths, as many as the alias bound
    # lets a file have): named once, where they are written.
    text = "a0: &a0 {x: 1, x: 2}\n" + "".join(
        f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 5)
    )
    path = _write(tmp_path, text)
    started = time.perf_counter()
    message = _refusal(path)
    assert time.perf_counter() - started < 5
    assert message.startswith(f"{path}: a0.x: duplicate key (line 1, columns 10 and 16)")


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("2024-13-45", "line 6, column 17: cannot read '2024-13-45' as a date"),
        ("9" * 5000, "line 6, column 17: cannot read '9999999999"),
        ("!!timestamp soon", "line 6, column 17: cannot read 'soon' as a date"),
        ("!!bool maybe", "line 6, column 17: cannot read 'maybe' as a boolean"),
    ],
    ids=["bad-date", "5000-digits", "timestamp-tag", "bool-tag"],
)
def test_a_scalar_yaml_cannot_build_is_a_config_error(
    tmp_path: Path, value: str, problem: str
) -> None:
    path = _write(tmp_path, BACKENDS + f"rollout: {{note: {value}}}\n")
    assert f"{path}: not valid YAML: {problem}" in _refusal(path)
    result = CliRunner().invoke(main, ["config", "check", "--config", str(path)])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert result.exit_code == 1
    assert problem in result.output


def test_config_check_refuses_the_duplicate_before_listing_secrets(tmp_path: Path) -> None:
    # The dropped copy held the only reference to KVM_TEST_DUP_DROPPED.
    text = BACKENDS.replace(
        '  vllm: {api_base: "http://10.0.0.1:8000/v1"}',
        "  vllm: {api_base: 'http://10.0.0.1:8000/v1', api_key: os.environ/KVM_TEST_DUP_DROPPED}\n"
        "  vllm: {api_base: 'http://10.0.0.1:8000/v1', api_key: os.environ/KVM_TEST_DUP_KEPT}",
    )
    path = _write(tmp_path, text)
    unset: dict[str, str | None] = {"KVM_TEST_DUP_DROPPED": None, "KVM_TEST_DUP_KEPT": None}
    result = CliRunner().invoke(main, ["config", "check", "--config", str(path)], env=unset)
    assert result.exit_code == 1, result.output
    assert f"{path}: backends.vllm: duplicate key (lines 3 and 4)" in result.output
    assert "KVM_TEST_DUP" not in result.output


def test_duplicates_are_refused_without_libyaml(tmp_path: Path) -> None:
    # The pure-Python parser is the one PyYAML has where libyaml is not built in.
    path = _write(tmp_path, BACKENDS + "rollout: {percent: 10}\nrollout: {percent: 20}\n")
    code = (
        "import yaml\n"
        "del yaml.CSafeLoader\n"
        "from kvmigrate.config import ConfigError, load_config\n"
        "try:\n"
        f"    load_config({str(path)!r}, env={{}})\n"
        "except ConfigError as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert f"{path}: rollout: duplicate key (lines 6 and 7)" in done.stdout
