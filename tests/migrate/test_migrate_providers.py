"""Azure endpoints and providers the proxy does not serve are flagged, never rewritten."""

from __future__ import annotations

import pytest

from kvmigrate.migrate.env_rewriter import scan_env
from kvmigrate.migrate.findings import Action
from kvmigrate.migrate.js_rewriter import scan_js
from kvmigrate.migrate.python_rewriter import scan_python
from kvmigrate.migrate.values import RewriteOptions
from kvmigrate.migrate.yaml_rewriter import scan_yaml

P = "http://p:4000/v1"
OPTS = RewriteOptions(P)
AZ = "https://mycorp.openai.azure.com/"


def _actions(scan: object, text: str) -> tuple[int, list[str]]:
    result = scan(text, "f", OPTS)  # type: ignore[operator]
    return len(result.edits), [f.action.value for f in result.findings]


@pytest.mark.parametrize(
    ("scan", "text"),
    [
        (scan_env, f"OPENAI_API_TYPE=azure\nOPENAI_API_BASE={AZ}\n"),
        (scan_env, "OPENAI_BASE_URL=https://x.cognitiveservices.azure.com/\n"),
        (scan_python, f'import openai\nopenai.api_type = "azure"\nopenai.api_base = "{AZ}"\n'),
        (scan_python, f'import dspy\nlm = dspy.LM("azure/gpt4-deploy", api_base="{AZ}")\n'),
        (scan_python, f'from crewai import LLM\nc = LLM(model="azure/d", base_url="{AZ}")\n'),
        (scan_python, f'import litellm\nlitellm.completion("azure/d", [], api_base="{AZ}")\n'),
        (scan_python, f'from openai import OpenAI\nc = OpenAI(base_url="{AZ}")\n'),
        (
            scan_yaml,
            "services:\n  a:\n    environment:\n      OPENAI_BASE_URL: https://r.services.ai.azure.com\n",
        ),
        (scan_js, f'import OpenAI from "openai";\nnew OpenAI({{ baseURL: "{AZ}" }});\n'),
    ],
)
def test_azure_endpoints_are_flagged_not_rewritten(scan: object, text: str) -> None:
    edits, actions = _actions(scan, text)
    assert edits == 0
    assert actions == ["flagged"]


@pytest.mark.parametrize(
    "text",
    [
        'import litellm\nlitellm.completion(model="ollama/llama3", api_base="http://localhost:11434")\n',
        'import dspy\nlm = dspy.LM("ollama_chat/llama3.2", api_base="http://localhost:11434")\n',
        'import litellm\nlitellm.completion(model="vertex_ai/gemini", api_base="https://g.example")\n',
    ],
)
def test_providers_the_proxy_does_not_serve_are_flagged(text: str) -> None:
    result = scan_python(text, "f", OPTS)
    assert result.edits == []
    [finding] = result.findings
    assert finding.action is Action.FLAGGED
    assert "do not speak the OpenAI or Anthropic API" in (finding.new or "")


def test_litellm_config_flags_unserved_providers_and_keeps_openai_ones() -> None:
    text = (
        "model_list:\n"
        "  - model_name: local\n    litellm_params:\n      model: ollama/llama3\n"
        "      api_base: http://localhost:11434\n"
        "  - model_name: gemini\n    litellm_params:\n      model: vertex_ai/gemini-1.5-pro\n"
        "      api_base: https://us-central1-aiplatform.googleapis.com\n"
        "  - model_name: claude\n    litellm_params:\n      model: anthropic/claude-3-5\n"
        "      api_base: https://api.anthropic.com\n"
        "  - model_name: gpt\n    litellm_params:\n      model: openai/gpt-4o\n"
        "      api_base: https://api.openai.com/v1\n"
    )
    result = scan_yaml(text, "litellm_config.yaml", OPTS)
    assert [f.action.value for f in result.findings] == ["flagged", "flagged", "rewrite", "rewrite"]
    assert sorted(e.new for e in result.edits) == ["http://p:4000", P]


def test_anthropic_models_get_the_proxy_root() -> None:
    text = (
        "import litellm\n"
        'litellm.completion(model="anthropic/claude-3-5", api_base="https://api.anthropic.com")\n'
    )
    [edit] = scan_python(text, "f", OPTS).edits
    assert edit.new == '"http://p:4000"'


def test_openai_prefixed_and_bare_models_still_get_the_proxy() -> None:
    text = (
        "import dspy\nimport litellm\n"
        'lm = dspy.LM("openai/gpt-4o-mini", api_base="https://api.openai.com/v1")\n'
        'litellm.completion("gpt-4o", [], api_base="https://api.openai.com/v1")\n'
    )
    assert [e.new for e in scan_python(text, "f", OPTS).edits] == [f'"{P}"', f'"{P}"']
