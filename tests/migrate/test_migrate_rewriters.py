"""Each rewriter on small snippets: what it edits, what it only reports, what it leaves alone."""

from __future__ import annotations

import pytest

from kvmigrate.migrate.env_rewriter import scan_env
from kvmigrate.migrate.findings import Action, ParseFailure
from kvmigrate.migrate.js_rewriter import scan_js
from kvmigrate.migrate.python_rewriter import scan_python
from kvmigrate.migrate.text import decode, splice
from kvmigrate.migrate.values import RewriteOptions, proxy_url_for_server, validate_proxy_url
from kvmigrate.migrate.yaml_rewriter import scan_yaml

P = "http://p:4000/v1"
OPTS = RewriteOptions(P)
HOSTED = "https://api.openai.com/v1"


def rewrite(scan: object, text: str) -> tuple[str, list[str]]:
    result = scan(text, "f", OPTS)  # type: ignore[operator]
    return splice(text, result.edits), [f.action.value for f in result.findings]


@pytest.mark.parametrize(
    ("source", "expected", "actions"),
    [
        (
            f"from openai import OpenAI as O\nc = O(base_url=r'{HOSTED}')  # x\n",
            f"from openai import OpenAI as O\nc = O(base_url=r'{P}')  # x\n",
            ["rewrite"],
        ),
        (
            f'import openai\nc = openai.OpenAI(\n    # why\n    base_url = "{HOSTED}" ,\n)\n',
            f'import openai\nc = openai.OpenAI(\n    # why\n    base_url = "{P}" ,\n)\n',
            ["rewrite"],
        ),
        (
            f"from openai import OpenAI\nc = OpenAI(base_url='{P}/')\n",
            f"from openai import OpenAI\nc = OpenAI(base_url='{P}/')\n",
            [],
        ),
        ("from openai import OpenAI\nc = OpenAI(**cfg)\n", None, ["needs_human"]),
        ("from openai import OpenAI\nc = OpenAI(base_url=None)\n", None, ["env_switch"]),
        (f"from openai import OpenAI\nc = OpenAI(base_url=b'{HOSTED}')\n", None, ["needs_human"]),
        (
            f"from openai import OpenAI\nc = OpenAI(base_url='{HOSTED}' '/x')\n",
            None,
            ["needs_human"],
        ),
        (f"c = OpenAI(base_url='{HOSTED}')\n", None, []),  # not imported: not known to be openai
        (f"from mylib import OpenAI\nc = OpenAI(base_url='{HOSTED}')\n", None, []),
        (
            f"import os\nos.environ['OPENAI_BASE_URL'] = '{HOSTED}'\n",
            f"import os\nos.environ['OPENAI_BASE_URL'] = '{P}'\n",
            ["rewrite"],
        ),
        (
            f"from langchain_openai import AzureChatOpenAI\nm = AzureChatOpenAI(azure_endpoint='{HOSTED}')\n",
            None,
            ["flagged"],
        ),
        (
            "import boto3\ns = boto3.Session()\nb = s.client(service_name='bedrock-runtime')\n",
            None,
            ["flagged"],
        ),
        (
            f"from langchain_community.chat_models import ChatOpenAI\nm = ChatOpenAI(openai_api_base='{HOSTED}')\n",
            f"from langchain_community.chat_models import ChatOpenAI\nm = ChatOpenAI(openai_api_base='{P}')\n",
            ["rewrite"],
        ),
    ],
)
def test_python(source: str, expected: str | None, actions: list[str]) -> None:
    new, found = rewrite(scan_python, source)
    assert new == (source if expected is None else expected)
    assert found == actions


def test_python_syntax_error_is_a_parse_failure() -> None:
    with pytest.raises(ParseFailure):
        scan_python("def (:\n", "f", OPTS)


@pytest.mark.parametrize(
    ("source", "expected", "actions"),
    [
        (
            f'import OpenAI from "openai";\nnew OpenAI({{ "baseURL": \'{HOSTED}\' }});\n',
            f'import OpenAI from "openai";\nnew OpenAI({{ "baseURL": \'{P}\' }});\n',
            ["rewrite"],
        ),
        (
            f"const {{ OpenAI: Client }} = require('openai');\nnew Client({{baseURL: `{HOSTED}`}})\n",
            f"const {{ OpenAI: Client }} = require('openai');\nnew Client({{baseURL: `{P}`}})\n",
            ["rewrite"],
        ),
        ("import OpenAI from 'openai';\nnew OpenAI({ baseURL })\n", None, ["needs_human"]),
        ("import OpenAI from 'openai';\nnew OpenAI({ ...opts })\n", None, ["needs_human"]),
        (
            "import OpenAI from 'openai';\nnew OpenAI({ baseURL: import.meta.env.VITE_URL })\n",
            None,
            ["env_switch"],
        ),
        (
            f"import {{ AzureOpenAI }} from 'openai';\nnew AzureOpenAI({{ baseURL: '{HOSTED}' }})\n",
            None,
            ["flagged"],
        ),
        (
            f"// new OpenAI({{ baseURL: '{HOSTED}' }})\nconst s = \"new OpenAI({{ baseURL: '{HOSTED}' }})\";\n",
            None,
            [],
        ),
        (
            f"import {{ ChatOpenAI }} from '@langchain/openai';\nnew ChatOpenAI({{ baseURL: '{HOSTED}', configuration: {{}} }})\n",
            None,
            ["env_switch"],
        ),
        (
            f"import OpenAI from 'openai';\nconst x = a / b; new OpenAI({{ other: {{ baseURL: '{HOSTED}' }} }})\n",
            None,
            ["env_switch"],
        ),
    ],
)
def test_js(source: str, expected: str | None, actions: list[str]) -> None:
    new, found = rewrite(scan_js, source)
    assert new == (source if expected is None else expected)
    assert found == actions


@pytest.mark.parametrize(
    ("source", "expected", "actions"),
    [
        (f"OPENAI_BASE_URL='{HOSTED}' # c\r\n", f"OPENAI_BASE_URL='{P}' # c\r\n", ["rewrite"]),
        (
            f"  export OPENAI_API_BASE = {HOSTED}\n",
            f"  export OPENAI_API_BASE = {P}\n",
            ["rewrite"],
        ),
        ("OPENAI_BASE_URL=${PROXY_URL}\n", None, ["needs_human"]),
        ('OPENAI_BASE_URL="unterminated\n', None, ["needs_human"]),
        ("OPENAI_BASE_URL=not-a-url\n", None, ["needs_human"]),
        (f"# OPENAI_BASE_URL={HOSTED}\nMY_OPENAI_BASE_URL={HOSTED}\n", None, []),
        ("OPENAI_API_KEY=sk-1\n", None, []),  # keys only with a proxy key
    ],
)
def test_env(source: str, expected: str | None, actions: list[str]) -> None:
    new, found = rewrite(scan_env, source)
    assert new == (source if expected is None else expected)
    assert found == actions


@pytest.mark.parametrize(
    ("source", "expected", "actions"),
    [
        (
            f"env: {{OPENAI_BASE_URL: {HOSTED}, B: 1}}  # c\n",
            f"env: {{OPENAI_BASE_URL: {P}, B: 1}}  # c\n",
            ["rewrite"],
        ),
        (
            f"env:\n  - 'OPENAI_API_BASE={HOSTED}'\n",
            f"env:\n  - 'OPENAI_API_BASE={P}'\n",
            ["rewrite"],
        ),
        (
            f"a: &x\n  OPENAI_BASE_URL: !!str {HOSTED}\nb:\n  <<: *x\n",
            f"a: &x\n  OPENAI_BASE_URL: !!str {P}\nb:\n  <<: *x\n",
            ["rewrite"],
        ),
        (f"OPENAI_BASE_URL: |\n  {HOSTED}\n", None, ["needs_human"]),
        ("environment:\n  OPENAI_BASE_URL:\n", None, ["env_switch"]),
        (f"services: {{}}\nother_url: {HOSTED}\n", None, []),
    ],
)
def test_yaml(source: str, expected: str | None, actions: list[str]) -> None:
    new, found = rewrite(scan_yaml, source)
    assert new == (source if expected is None else expected)
    assert found == actions


def test_yaml_keys_need_the_flag_and_keep_strings_strings() -> None:
    text = "env:\n  - name: OPENAI_API_KEY\n    value: sk-old\n"
    assert scan_yaml(text, "f", OPTS).edits == []
    result = scan_yaml(text, "f", RewriteOptions(P, "12345"))
    assert splice(text, result.edits) == 'env:\n  - name: OPENAI_API_KEY\n    value: "12345"\n'


def test_values() -> None:
    assert proxy_url_for_server("0.0.0.0", 4000) == "http://127.0.0.1:4000/v1"
    assert proxy_url_for_server("::", 4001) == "http://[::1]:4001/v1"
    assert proxy_url_for_server("proxy.internal", 80) == "http://proxy.internal:80/v1"
    for bad in ("ftp://x/v1", "http:///v1", "http://a'b/v1", "http://x/$y"):
        with pytest.raises(ValueError, match="proxy URL"):
            validate_proxy_url(bad)
    assert decode(b"\xef\xbb\xbfa\r\n").encode("b\r\n") == b"\xef\xbb\xbfb\r\n"


def test_findings_carry_file_line_and_framework() -> None:
    text = f"import litellm\n\nr = litellm.completion(model='gpt-4o', api_base='{HOSTED}')\n"
    [finding] = scan_python(text, "svc/app.py", OPTS).findings
    assert (finding.path, finding.line, finding.kind, finding.framework) == (
        "svc/app.py",
        3,
        "python",
        "litellm",
    )
    assert (finding.action, finding.old, finding.new) == (Action.REWRITE, HOSTED, P)


AZURE_URL = "https://team.openai.azure.com/openai"


@pytest.mark.parametrize(
    ("source", "proposed"),
    [
        (
            "import { AzureOpenAI } from 'openai';\n"
            "const c = new AzureOpenAI({ endpoint: process.env.AZURE_ENDPOINT });\n",
            "Azure OpenAI clients ignore OPENAI_BASE_URL and build deployment URLs: replace with "
            "new OpenAI({ baseURL: <proxy> }) and map the deployment to a model in the kvmigrate "
            "config",
        ),
        (
            f"import OpenAI from 'openai';\nconst c = new OpenAI({{ baseURL: '{AZURE_URL}' }});\n",
            "Azure OpenAI clients ignore OPENAI_BASE_URL and build deployment URLs: replace with "
            "new OpenAI({ baseURL: <proxy> }) and map the deployment to a model in the kvmigrate "
            "config",
        ),
        (
            "import { createAzure } from '@ai-sdk/azure';\n"
            "const azure = createAzure({ resourceName: 'team' });\n",
            "Azure OpenAI clients ignore OPENAI_BASE_URL and build deployment URLs: replace with "
            'createOpenAI({ baseURL: <proxy> }) from "@ai-sdk/openai" and map the deployment to '
            "a model in the kvmigrate config",
        ),
        (
            "import { AzureChatOpenAI } from '@langchain/openai';\n"
            "const llm = new AzureChatOpenAI({ azureOpenAIApiDeploymentName: 'd' });\n",
            "Azure OpenAI clients ignore OPENAI_BASE_URL and build deployment URLs: replace with "
            "new ChatOpenAI({ configuration: { baseURL: <proxy> } }) and map the deployment to a "
            "model in the kvmigrate config",
        ),
    ],
)
def test_a_js_client_the_proxy_cannot_move_gets_a_js_replacement(
    source: str, proposed: str
) -> None:
    """The proposed change is written in the file's own language: `OpenAI(base_url=...)`
    in a .ts file read as a typo."""
    for path in ("web/chat.ts", "web/chat.js"):
        [finding] = scan_js(source, path, OPTS).findings
        assert (finding.action, finding.new) == (Action.FLAGGED, proposed)
        assert "base_url=" not in finding.new
