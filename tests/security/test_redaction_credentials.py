"""`mask_credentials`: the values a line of code or config assigns to a credential are
masked, and the rest of the line stays readable (it is shown to review an edit)."""

from __future__ import annotations

import time

import pytest

from kvmigrate.masked_lines import mask_credentials
from kvmigrate.named_secrets import is_secret_name


@pytest.mark.parametrize(
    ("line", "masked"),
    [
        ("AZURE_OPENAI_API_KEY=abc123", "AZURE_OPENAI_API_KEY=********"),
        (" OPENAI_API_KEY_2=xyz", " OPENAI_API_KEY_2=********"),
        ("export DB_PASS='x y z'", "export DB_PASS='********'"),
        ('client = OpenAI(api_key="abc")', 'client = OpenAI(api_key="********")'),
        ('const c = {apiKey: "abc"}', 'const c = {apiKey: "********"}'),
        ('env["MY_TOKEN"] = "tok"', 'env["MY_TOKEN"] = "********"'),
        ('{"password": "hunter2"}', '{"password": "********"}'),
        ("  secret: 'unterminated", "  secret: '********"),
        ("OPENAI_BASE_URL=https://u:hunter2@gw/v1", "OPENAI_BASE_URL=https://u:********@gw/v1"),
        ("Authorization: Bearer abcdefgh12345678", "Authorization: ********"),
        ("base_url='x' # sk-proj-abcDEF1234567890abcdef", "base_url='x' # ********"),
        # Names the prompt redaction knows too: one rule says which names are secrets.
        ("PGPASSWORD=Zq5SECRETe", "PGPASSWORD=********"),
        ("DB_PASSWORD_1=x1", "DB_PASSWORD_1=********"),
        ("GITHUB_PAT=abc", "GITHUB_PAT=********"),
        ("-OPENAI_ORG_SECRET=abc", "-OPENAI_ORG_SECRET=********"),  # a diff's removed line
        (
            "  - {name: OPENAI_ORG_SECRET, value: Zq15SECRETo}",
            "  - {name: OPENAI_ORG_SECRET, value: ********}",
        ),
        (
            '- {"name": "DB_PASSWORD", "value": "a b"}',
            '- {"name": "DB_PASSWORD", "value": "********"}',
        ),
        ("- {value: Zq16 x, name: MY_TOKEN}", "- {value: ********, name: MY_TOKEN}"),
        ("postgres://admin:pw@db/app", "postgres://admin:********@db/app"),
    ],
)
def test_credential_values_are_masked(line: str, masked: str) -> None:
    assert mask_credentials(line) == masked


@pytest.mark.parametrize(
    "line",
    [
        "max_tokens: 100",
        "api_key_env: OPENAI_API_KEY",
        'client = OpenAI(api_key=os.environ["OPENAI_API_KEY"])',
        "api_key: os.environ/AZURE_API_KEY",
        "OPENAI_API_KEY: ${{ secrets.OPENAI_API_KEY }}",
        "OPENAI_API_KEY=${OPENAI_API_KEY}",
        "apiKey: process.env.OPENAI_API_KEY",
        "if token == 'abc':",
        "OPENAI_BASE_URL=https://api.openai.com/v1",
        '"password": "",',
        "- {name: OPENAI_BASE_URL, value: https://api.openai.com/v1}",
        "- {name: OPENAI_API_KEY, value: ${OPENAI_API_KEY}}",
        "sort_key: name",
        "https://api.openai.com:443/v1",
    ],
)
def test_references_and_other_values_stay_readable(line: str) -> None:
    assert mask_credentials(line) == line


def test_a_kubernetes_env_list_value_on_the_next_line() -> None:
    text = (
        " - name: AZURE_OPENAI_API_KEY\n   value: plainsecret\n"
        " - name: OPENAI_BASE_URL\n   value: https://api.openai.com/v1"
    )
    assert mask_credentials(text) == text.replace("plainsecret", "********")


def test_a_private_key_block_keeps_its_armour_and_line_count() -> None:
    text = (
        "+key: |\n+  -----BEGIN RSA PRIVATE KEY-----\n+  MIIEpAIBAAKCAQEA1234\n"
        "+  -----END RSA PRIVATE KEY-----\n+after: 1"
    )
    assert mask_credentials(text) == text.replace("MIIEpAIBAAKCAQEA1234", "********")


def test_a_yaml_block_below_a_credential_is_masked_line_by_line() -> None:
    text = (
        " config:\n+  password: |\n+    Zq1SECRETa\n+\n+    Zq1SECRETb\n+  user: bob\n"
        " notes: |\n   kept as it is"
    )
    assert mask_credentials(text) == (
        " config:\n+  password: |\n+    ********\n+\n+    ********\n+  user: bob\n"
        " notes: |\n   kept as it is"
    )


_HOSTILE_LINES = {
    "block indicators": "password: | " * 80_000,
    "url user parts": "a://b:" * 160_000,
    "unclosed quotes": "password: „x“ " * 80_000,
    "flow entries": "{name: A_KEY, value: x} " * 40_000,
    "values": "value: a " * 110_000,
    "block lines": "+password: |\n" + "+  x\n" * 250_000,
}


@pytest.mark.parametrize("text", _HOSTILE_LINES.values(), ids=_HOSTILE_LINES.keys())
def test_a_megabyte_of_hostile_lines_is_masked_in_linear_time(text: str) -> None:
    started = time.perf_counter()
    mask_credentials(text)
    assert time.perf_counter() - started < 10


@pytest.mark.parametrize(
    ("name", "credential"),
    [("OPENAI_API_KEY", True), ("apiKey", True), ("db.password", True), ("GITHUB_PAT", True),
     ("ANTHROPIC_AUTH_TOKEN", True), ("PGPASSWORD", True), ("OPENAI_ORG_SECRET", True),
     ("key_file", False), ("max_tokens", False), ("", False)],
)  # fmt: skip
def test_credential_names(name: str, credential: bool) -> None:
    assert is_secret_name(name) is credential
