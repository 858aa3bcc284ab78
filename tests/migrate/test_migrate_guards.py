"""Inputs that used to crash, hang or corrupt a file: each gives a clear, per-file answer."""

from __future__ import annotations

from pathlib import Path

import pytest
from migrate_support import PROXY, run_cli

from kvmigrate.migrate import RewriteOptions, build_plan
from kvmigrate.migrate.env_rewriter import scan_env
from kvmigrate.migrate.findings import Action
from kvmigrate.migrate.values import validate_proxy_url
from kvmigrate.migrate.yaml_rewriter import scan_yaml

GOOD = 'from openai import OpenAI\nc = OpenAI(base_url="https://api.openai.com/v1")\n'


def test_deeply_nested_python_is_one_error_not_a_lost_report(tmp_path: Path) -> None:
    (tmp_path / "good.py").write_text(GOOD)
    (tmp_path / "deep.py").write_text("x = " + "[" * 2000 + "]" * 2000 + "\n")
    elif_chain = "".join(f"    elif x == {i}:\n        return {i}\n" for i in range(1, 1000))
    (tmp_path / "elif.py").write_text(f"def f(x):\n    if x == 0:\n        return 0\n{elif_chain}")
    proc = run_cli(str(tmp_path), "--proxy-url", PROXY, "--json", cwd=tmp_path)  # a segfault
    assert proc.returncode == 1, proc.stderr  # would kill a test run in-process
    assert '"path": "good.py"' in proc.stdout
    assert "brackets nested 2000 deep" in proc.stdout
    assert "nested too deeply to parse safely" in proc.stdout
    assert "RecursionError" not in proc.stdout


def test_a_yaml_alias_bomb_is_refused_quickly(tmp_path: Path) -> None:
    lines = ["a0: &a0 [x, y, z, w, v, u, t, s, r, q]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]
    (tmp_path / "values.yaml").write_text("\n".join(lines) + "\n")
    (tmp_path / ".env").write_text("OPENAI_BASE_URL=https://api.openai.com/v1\n")
    proc = run_cli(str(tmp_path), "--proxy-url", PROXY, cwd=tmp_path)  # 60 s timeout
    assert proc.returncode == 1
    assert "YAML aliases expand to more than" in proc.stdout
    assert "+OPENAI_BASE_URL=" + PROXY in proc.stdout


def test_shared_small_aliases_and_merges_still_rewrite() -> None:
    text = "b: &b [1, 2]\nc: [*b, *b]\nd: &m {OPENAI_BASE_URL: https://api.openai.com/v1}\ne: {<<: *m}\n"
    result = scan_yaml(text, "values.yaml", RewriteOptions(PROXY))
    assert [e.new for e in set(result.edits)] == [PROXY]


@pytest.mark.parametrize("url", ["http://proxy:abc/v1", "http://proxy:99999/v1", "http://p:0/v1"])
def test_proxy_url_with_an_invalid_port_is_refused(url: str) -> None:
    with pytest.raises(ValueError, match="invalid port"):
        validate_proxy_url(url)


def test_a_bare_dollar_variable_inside_a_url_needs_a_human() -> None:
    text = "OPENAI_BASE_URL=https://${LLM_HOST}/v1\nOPENAI_API_BASE=https://$LLM_HOST/v1\n"
    result = scan_env(text, ".env", RewriteOptions(PROXY))
    assert result.edits == []
    assert [f.action for f in result.findings] == [Action.NEEDS_HUMAN] * 2
    compose = "services:\n  app:\n    environment:\n      OPENAI_BASE_URL: https://$LLM_HOST/v1\n"
    assert scan_yaml(compose, "compose.yaml", RewriteOptions(PROXY)).edits == []


def test_lines_inside_a_multiline_dotenv_value_are_data() -> None:
    text = (
        'PRIVATE_KEY="-----BEGIN KEY-----\nOPENAI_BASE_URL=https://example.internal/v1\n'
        '-----END KEY-----"\nOPENAI_API_BASE=https://api.openai.com/v1\n'
    )
    result = scan_env(text, ".env", RewriteOptions(PROXY))
    [edit] = result.edits
    assert text[edit.start : edit.end] == "https://api.openai.com/v1"
    assert [f.line for f in result.findings] == [4]


def test_an_anchor_feeding_openai_and_anthropic_is_explained(tmp_path: Path) -> None:
    (tmp_path / "values.yaml").write_text(
        "env:\n  OPENAI_BASE_URL: &u https://gateway.example.com/v1\n  ANTHROPIC_BASE_URL: *u\n"
    )
    [problem] = build_plan(tmp_path, RewriteOptions(PROXY)).errors
    assert "overlapping edits" not in problem.detail
    assert "shared (a YAML anchor and alias)" in problem.detail
    assert "OPENAI_BASE_URL" in problem.detail
    assert "ANTHROPIC_BASE_URL" in problem.detail
