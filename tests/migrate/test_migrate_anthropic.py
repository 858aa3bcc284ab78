"""`kvmigrate rewrite` for Anthropic clients: ANTHROPIC_BASE_URL and the SDKs' base URL are
the proxy's root, because Anthropic's SDKs append `/v1/messages` themselves; OPENAI_BASE_URL
keeps its `/v1`. A root already set is left alone, a `/v1` set by hand is fixed."""

from __future__ import annotations

from pathlib import Path

import pytest
from migrate_support import PROXY, copy_corpus, invoke, run_cli, snapshot

from kvmigrate.migrate import RewriteOptions, build_plan
from kvmigrate.migrate.env_rewriter import scan_env
from kvmigrate.migrate.js_rewriter import scan_js
from kvmigrate.migrate.python_rewriter import scan_python
from kvmigrate.migrate.text import splice
from kvmigrate.migrate.yaml_rewriter import scan_yaml

OPTS = RewriteOptions("http://p:4000/v1")
ROOT = "http://p:4000"


@pytest.mark.parametrize(
    ("proxy", "root"),
    [
        ("http://p:4000/v1", "http://p:4000"),
        ("http://p:4000/v1/", "http://p:4000"),
        ("https://gw.example.com/llm/v1", "https://gw.example.com/llm"),
        ("http://p:4000", "http://p:4000"),  # no /v1 to take off
    ],
)
def test_the_anthropic_url_is_the_proxy_url_without_v1(proxy: str, root: str) -> None:
    options = RewriteOptions(proxy)
    assert options.anthropic_url == root
    assert options.url_for("ANTHROPIC_BASE_URL") == root
    assert options.url_for("OPENAI_BASE_URL") == proxy


def _rewritten(scan: object, text: str, options: RewriteOptions = OPTS) -> str:
    return splice(text, scan(text, "f", options).edits)  # type: ignore[operator]


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("ANTHROPIC_BASE_URL=https://api.anthropic.com\n", f"ANTHROPIC_BASE_URL={ROOT}\n"),
        ("export ANTHROPIC_BASE_URL='https://api.anthropic.com'  # hosted\n",
         f"export ANTHROPIC_BASE_URL='{ROOT}'  # hosted\n"),
        # Set to the OpenAI-style URL by hand: the SDK would call /v1/v1/messages.
        ("ANTHROPIC_BASE_URL=http://p:4000/v1\n", f"ANTHROPIC_BASE_URL={ROOT}\n"),
        (f"ANTHROPIC_BASE_URL={ROOT}/\n", f"ANTHROPIC_BASE_URL={ROOT}/\n"),  # already the proxy
        ("OPENAI_BASE_URL=https://api.openai.com/v1\n", "OPENAI_BASE_URL=http://p:4000/v1\n"),
    ],
)  # fmt: skip
def test_env_files(line: str, expected: str) -> None:
    assert _rewritten(scan_env, line) == expected


def test_anthropic_keys_follow_proxy_key_and_are_masked_otherwise() -> None:
    text = "ANTHROPIC_API_KEY=sk-ant-api03-secret\nANTHROPIC_AUTH_TOKEN=tok-secret-1\n"
    assert _rewritten(scan_env, text) == text
    assert scan_env(text, "f", OPTS).secrets == {"sk-ant-api03-secret", "tok-secret-1"}
    keyed = RewriteOptions("http://p:4000/v1", proxy_key="sk-proxy")
    assert _rewritten(scan_env, text, keyed) == (
        "ANTHROPIC_API_KEY=sk-proxy\nANTHROPIC_AUTH_TOKEN=sk-proxy\n"
    )


def test_yaml_sets_anthropic_to_the_root_and_openai_to_v1_in_one_file() -> None:
    text = (
        "services:\n  agent:\n    environment:\n"
        "      ANTHROPIC_BASE_URL: https://api.anthropic.com\n"
        "      OPENAI_BASE_URL: https://api.openai.com/v1\n"
        "  worker:\n    environment:\n      - ANTHROPIC_BASE_URL=http://p:4000/v1\n"
    )
    assert _rewritten(scan_yaml, text) == (
        "services:\n  agent:\n    environment:\n"
        f"      ANTHROPIC_BASE_URL: {ROOT}\n"
        "      OPENAI_BASE_URL: http://p:4000/v1\n"
        f"  worker:\n    environment:\n      - ANTHROPIC_BASE_URL={ROOT}\n"
    )


@pytest.mark.parametrize(
    ("source", "expected", "actions"),
    [
        (
            "from anthropic import Anthropic\nc = Anthropic(base_url='https://api.anthropic.com')\n",
            f"from anthropic import Anthropic\nc = Anthropic(base_url='{ROOT}')\n",
            ["rewrite"],
        ),
        (
            "import anthropic as a\nc = a.AsyncAnthropic(base_url=\"http://p:4000/v1\")\n",
            f"import anthropic as a\nc = a.AsyncAnthropic(base_url=\"{ROOT}\")\n",
            ["rewrite"],
        ),
        (f"from anthropic import Anthropic\nc = Anthropic(base_url='{ROOT}')\n", None, []),
        ("from anthropic import Anthropic\nc = Anthropic()\n", None, ["env_switch"]),
        ("from anthropic import AnthropicVertex\nc = AnthropicVertex(region='x')\n", None,
         ["flagged"]),
        ("from anthropic import AsyncAnthropicBedrock\nc = AsyncAnthropicBedrock()\n", None,
         ["flagged"]),
    ],
)  # fmt: skip
def test_python_clients(source: str, expected: str | None, actions: list[str]) -> None:
    result = scan_python(source, "f", OPTS)
    assert splice(source, result.edits) == (expected or source)
    assert [f.action.value for f in result.findings] == actions


def test_a_python_client_without_a_url_names_its_variable_and_host() -> None:
    (finding,) = scan_python(
        "from anthropic import Anthropic\nc = Anthropic()\n", "f", OPTS
    ).findings
    assert "ANTHROPIC_BASE_URL is the switch" in finding.message
    assert "api.anthropic.com" in finding.message
    source = "import os, anthropic\nc = anthropic.Anthropic(base_url=os.getenv('GW'))\n"
    (finding,) = scan_python(source, "f", OPTS).findings
    assert f"set GW={ROOT} where it runs" in finding.message


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ('import Anthropic from "@anthropic-ai/sdk";\nnew Anthropic({ baseURL: "https://api.anthropic.com" });\n',
         f'import Anthropic from "@anthropic-ai/sdk";\nnew Anthropic({{ baseURL: "{ROOT}" }});\n'),
        ('const { Anthropic } = require("@anthropic-ai/sdk");\nnew Anthropic({ baseURL: "http://p:4000/v1" });\n',
         f'const {{ Anthropic }} = require("@anthropic-ai/sdk");\nnew Anthropic({{ baseURL: "{ROOT}" }});\n'),
        ("import { createAnthropic } from '@ai-sdk/anthropic';\ncreateAnthropic({ baseURL: 'https://api.anthropic.com/v1' });\n",
         "import { createAnthropic } from '@ai-sdk/anthropic';\ncreateAnthropic({ baseURL: 'http://p:4000/v1' });\n"),
    ],
)  # fmt: skip
def test_js_clients(source: str, expected: str) -> None:
    assert _rewritten(scan_js, source) == expected


def test_js_clients_reading_the_environment_are_told_their_own_url() -> None:
    source = (
        'import Anthropic from "@anthropic-ai/sdk";\n'
        "const a = new Anthropic({ baseURL: process.env.GATEWAY_URL });\n"
        "const b = new Anthropic();\n"
    )
    messages = [f.message for f in scan_js(source, "f", OPTS).findings]
    assert messages == [
        f"baseURL reads GATEWAY_URL; set GATEWAY_URL={ROOT} where it runs",
        "Anthropic() sets no baseURL, so ANTHROPIC_BASE_URL is the switch",
    ]


def test_the_plan_advises_the_root_for_clients_without_a_url(tmp_path: Path) -> None:
    (tmp_path / "agent.py").write_text("import anthropic\nclient = anthropic.Anthropic()\n")
    (tmp_path / "docker-compose.yml").write_text("services:\n  agent:\n    image: x\n")
    notes = build_plan(tmp_path, RewriteOptions(PROXY)).notes
    assert any("follow ANTHROPIC_BASE_URL: no file here sets it" in n for n in notes)
    assert any(
        "Set ANTHROPIC_BASE_URL=http://kvmigrate:4000 (no /v1" in n and "docker-compose.yml" in n
        for n in notes
    )
    assert not any("OPENAI_BASE_URL" in n for n in notes)


def test_cli_dry_run_apply_and_revert_on_anthropic_projects(tmp_path: Path) -> None:
    tree = copy_corpus(tmp_path / "tree", cases=["anthropic-deploy", "anthropic-python"])
    original = snapshot(tree)
    dry = run_cli(str(tree), "--proxy-url", PROXY, cwd=tmp_path)
    assert dry.returncode == 2, dry.stderr
    assert "+ANTHROPIC_BASE_URL=http://kvmigrate:4000\n" in dry.stdout
    assert '+OPENAI_BASE_URL="http://kvmigrate:4000/v1"' in dry.stdout
    assert "(Anthropic clients: http://kvmigrate:4000)" in dry.stdout
    assert "sk-ant-api03" not in dry.stdout  # the key in the diff's context is masked
    assert snapshot(tree) == original
    applied = run_cli(str(tree), "--proxy-url", PROXY, "--apply", cwd=tmp_path)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    env = (tree / "anthropic-deploy/.env").read_text()
    assert "ANTHROPIC_BASE_URL=http://kvmigrate:4000\n" in env
    again = invoke(str(tree), "--proxy-url", PROXY, cwd=tmp_path)
    assert "Nothing to rewrite." in again.stdout
    assert invoke(str(tree), "--revert", cwd=tmp_path).exit_code == 0
    assert snapshot(tree) == original
