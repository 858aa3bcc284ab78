"""No key value reaches a diff or the JSON report: old keys, hardcoded keys, the proxy key."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from migrate_support import PROXY, invoke, run_cli

OLD_ENV_KEY = "sk-old-key-123456"
K8S_KEY = "sk-k8s-LITERAL-abcdef123"
CODE_KEY = "sk-proj-HARDCODED1234567890"
PROXY_KEY = "sk-NEWPROXYKEY-999"


def _tree(root: Path) -> Path:
    root.mkdir()
    (root / ".env").write_text(
        f"OPENAI_API_KEY={OLD_ENV_KEY}\nOPENAI_BASE_URL=https://api.openai.com/v1\n"
    )
    (root / "deploy.yaml").write_text(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: app\nspec:\n  template:\n"
        "    spec:\n      containers:\n        - name: app\n          env:\n"
        f"            - name: OPENAI_API_KEY\n              value: {K8S_KEY}\n"
        "            - name: OPENAI_BASE_URL\n              value: https://api.openai.com/v1\n"
    )
    (root / "app.py").write_text(
        "from openai import OpenAI\n"
        f'client = OpenAI(api_key="{CODE_KEY}", base_url="https://api.openai.com/v1")\n'
    )
    return root


def test_keys_are_masked_in_every_diff(tmp_path: Path) -> None:
    tree = _tree(tmp_path / "tree")
    out = invoke(str(tree), "--proxy-url", PROXY, cwd=tmp_path).stdout
    assert '+client = OpenAI(api_key="********"' in out  # the diff is still shown
    for key in (OLD_ENV_KEY, K8S_KEY, CODE_KEY):
        assert key not in out


def test_the_proxy_key_is_masked_in_text_and_json(tmp_path: Path) -> None:
    tree = _tree(tmp_path / "tree")
    for extra in ((), ("--json",)):
        out = invoke(str(tree), "--proxy-url", PROXY, "--proxy-key", PROXY_KEY, *extra,
                     cwd=tmp_path).stdout  # fmt: skip
        assert "+OPENAI_API_KEY=********" in out.replace("\\n", "\n")
        for key in (OLD_ENV_KEY, K8S_KEY, CODE_KEY, PROXY_KEY):
            assert key not in out
    report = json.loads(out)
    assert report["summary"]["files_changed"] == 3


AZURE_KEY = "azure0123456789abcdef"
SECOND_KEY = "second-key-value-42"
DB_PASSWORD = "hunter2-db-password"


def test_keys_rewrite_does_not_know_are_masked_in_context_and_errors(tmp_path: Path) -> None:
    """Context lines around a rewrite, and a parser's error quoting the line it failed on,
    hold keys of names no rewriter looks for: masked in text and in --json."""
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / ".env").write_text(
        f"AZURE_OPENAI_API_KEY={AZURE_KEY}\nOPENAI_API_KEY_2={SECOND_KEY}\n"
        "OPENAI_BASE_URL=https://api.openai.com/v1\nDB_URL=postgres://app:"
        f"{DB_PASSWORD}@db/app\n"
    )
    (tree / "broken.yaml").write_text(f"db:\n  password: {DB_PASSWORD}: oops\n")
    for extra in ((), ("--json",)):
        result = invoke(str(tree), "--proxy-url", PROXY, *extra, cwd=tmp_path)
        out = result.stdout + result.stderr
        assert result.exit_code == 1, out  # the broken YAML is an error
        for secret in (AZURE_KEY, SECOND_KEY, DB_PASSWORD):
            assert secret not in out, (extra, out)
        shown = out.replace("\\n", "\n")
        assert "AZURE_OPENAI_API_KEY=********\n" in shown  # the context is still shown
        assert "OPENAI_API_KEY_2=********\n" in shown
        assert "+OPENAI_BASE_URL=http://kvmigrate:4000/v1\n" in shown
        assert "broken.yaml" in out


def test_the_apply_line_never_puts_the_proxy_key_on_a_command_line(tmp_path: Path) -> None:
    """Pasted, `--proxy-key "$KVMIGRATE_PROXY_KEY"` put the key in `ps`: the apply line
    reads it from the environment instead, and says to set it."""
    tree = _tree(tmp_path / "tree")
    dry = invoke(str(tree), "--proxy-url", PROXY, "--proxy-key", PROXY_KEY, cwd=tmp_path)
    [line] = [x for x in dry.stdout.splitlines() if "Apply with: " in x]
    assert line.endswith(" --apply (with KVMIGRATE_PROXY_KEY set to the key)")
    assert "--proxy-key" not in line
    assert PROXY_KEY not in dry.stdout
    command = shlex.split(line.split("Apply with: ", 1)[1].split(" (with", 1)[0])
    applied = run_cli(*command[2:], cwd=tmp_path, env={"KVMIGRATE_PROXY_KEY": PROXY_KEY})
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert f"OPENAI_API_KEY={PROXY_KEY}\n" in (tree / ".env").read_text()


PG_PASSWORD = "Zq5SECRETe"
ORG_SECRET = "Zq15SECRETo"
BLOCK_SECRET = "Zq25SECRETb"


def test_secrets_the_rewriters_do_not_know_are_masked_in_the_diff_context(tmp_path: Path) -> None:
    """A glued name (`PGPASSWORD`), a flow-style Kubernetes env entry and a YAML block
    below a secret's name sit next to a rewritten URL: masked in text and in --json, by
    the name rule the recorder's redaction uses."""
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / ".env").write_text(
        f"PGPASSWORD={PG_PASSWORD}\nOPENAI_BASE_URL=https://api.openai.com/v1\n"
    )
    (tree / "deploy.yaml").write_text(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: app\nspec:\n  template:\n"
        "    spec:\n      containers:\n        - name: app\n          env:\n"
        f"            - {{name: OPENAI_ORG_SECRET, value: {ORG_SECRET}}}\n"
        "            - {name: OPENAI_BASE_URL, value: https://api.openai.com/v1}\n"
        "            - name: DB_PASSWORD\n              value: |\n"
        f"                {BLOCK_SECRET}\n"
    )
    for extra in ((), ("--json",)):
        result = invoke(str(tree), "--proxy-url", PROXY, *extra, cwd=tmp_path)
        out = result.stdout + result.stderr
        for secret in (PG_PASSWORD, ORG_SECRET, BLOCK_SECRET):
            assert secret not in out, (extra, secret)
        shown = out.replace("\\n", "\n")
        assert " PGPASSWORD=********\n" in shown  # the context is still shown
        assert "{name: OPENAI_ORG_SECRET, value: ********}" in shown
        assert "+OPENAI_BASE_URL=http://kvmigrate:4000/v1\n" in shown
