"""`mask_credentials`: the values a line of code or config assigns to a credential are
masked, and the rest of the line stays readable (it is shown to review an edit)."""

from __future__ import annotations

import pytest

from kvmigrate.redaction import is_credential_name, mask_credentials


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


@pytest.mark.parametrize(
    ("name", "credential"),
    [("OPENAI_API_KEY", True), ("apiKey", True), ("db.password", True), ("GITHUB_PAT", True),
     ("ANTHROPIC_AUTH_TOKEN", True), ("key_file", False), ("max_tokens", False), ("", False)],
)  # fmt: skip
def test_credential_names(name: str, credential: bool) -> None:
    assert is_credential_name(name) is credential
