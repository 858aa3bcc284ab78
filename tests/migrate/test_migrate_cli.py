"""`kvmigrate rewrite` as a user runs it: exit codes, --json, --revert, config, --proxy-key."""

from __future__ import annotations

import json
from pathlib import Path

from migrate_support import PROXY, copy_corpus, invoke, run_cli, snapshot

EXIT_NOTHING, EXIT_ERROR, EXIT_CHANGES = 0, 1, 2


def test_help_documents_exit_codes(tmp_path: Path) -> None:
    proc = invoke("--help", cwd=tmp_path)
    assert proc.exit_code == 0
    assert "Exit codes:" in proc.stdout
    assert "changes are proposed" in proc.stdout


def test_dry_run_apply_rerun_revert_exit_codes(tmp_path: Path) -> None:
    tree = copy_corpus(tmp_path / "tree", cases=["openai-sync", "dotenv", "azure"])
    original = snapshot(tree)
    dry = run_cli(str(tree), "--proxy-url", PROXY, cwd=tmp_path)
    assert dry.returncode == EXIT_CHANGES, dry.stderr
    assert f'+    base_url="{PROXY}",' in dry.stdout
    assert "Flagged, not rewritten" in dry.stdout
    assert "Dry run" in dry.stdout
    assert snapshot(tree) == original
    applied = run_cli(str(tree), "--proxy-url", PROXY, "--apply", cwd=tmp_path)
    assert applied.returncode == EXIT_NOTHING, applied.stdout + applied.stderr
    assert "--revert" in applied.stdout
    again = invoke(str(tree), "--proxy-url", PROXY, cwd=tmp_path)
    assert again.exit_code == EXIT_NOTHING
    assert "Nothing to rewrite." in again.stdout
    reverted = invoke(str(tree), "--revert", cwd=tmp_path)
    assert reverted.exit_code == EXIT_NOTHING, reverted.stderr
    assert snapshot(tree) == original
    none_left = invoke(str(tree), "--revert", cwd=tmp_path)
    assert none_left.exit_code == EXIT_ERROR
    assert "no backup left" in none_left.stderr


def test_errors_exit_1_and_still_report_changes(tmp_path: Path) -> None:
    tree = copy_corpus(tmp_path / "tree", cases=["dotenv"])
    (tree / "broken.py").write_text("def (:\n")
    proc = invoke(str(tree), "--json", cwd=tmp_path)
    assert proc.exit_code == EXIT_ERROR
    report = json.loads(proc.stdout)
    assert report["exit_code"] == EXIT_ERROR
    assert report["summary"]["files_changed"] == 3
    assert [(p["path"], p["reason"]) for p in report["problems"]] == [("broken.py", "parse")]


def test_bad_invocations_exit_1_without_traceback(tmp_path: Path) -> None:
    for args in (
        ["--proxy-url", "ftp://x"],
        ["--proxy-url", "http://a b/v1"],
        ["--apply", "--revert"],
        [str(tmp_path / "missing")],
        ["--nope"],
        ["--revert", "no-such-id"],
    ):
        proc = invoke(*args, cwd=tmp_path)
        assert proc.exit_code == EXIT_ERROR, (args, proc.stdout, proc.stderr)
    real = run_cli("--apply", "--revert", cwd=tmp_path)
    assert real.returncode == EXIT_ERROR
    assert "do not go together" in real.stderr
    assert "Traceback" not in real.stderr


def test_json_report_schema(tmp_path: Path) -> None:
    tree = copy_corpus(tmp_path / "tree", cases=["openai-sync", "runtime-url", "helm"])
    proc = invoke(str(tree), "--proxy-url", PROXY, "--json", cwd=tmp_path)
    assert proc.exit_code == EXIT_CHANGES
    report = json.loads(proc.stdout)
    assert set(report) == {
        "version", "mode", "root", "proxy_url", "summary", "changes", "findings", "problems",
        "notes", "backup_id", "error", "exit_code",
    }  # fmt: skip
    assert (report["version"], report["mode"], report["exit_code"]) == (1, "dry-run", 2)
    assert report["summary"] == {
        "files_scanned": 5,
        "files_changed": 2,
        "edits": 3,
        "findings": {"rewrite": 3, "needs_human": 3, "flagged": 0, "env_switch": 1},
        "errors": 0,
        "skipped": 1,
    }
    change = report["changes"][0]
    assert set(change) == {"path", "edits", "diff"}
    assert change["diff"].startswith("--- a/")
    for finding in report["findings"]:
        assert set(finding) == {
            "path",
            "line",
            "kind",
            "framework",
            "action",
            "message",
            "old",
            "new",
        }
        assert isinstance(finding["line"], int)
        assert finding["line"] > 0
    assert report["problems"] == [
        {
            "path": "helm/chart/templates/",
            "severity": "skipped",
            "reason": "helm-templates",
            "detail": "",
        }
    ]
    applied = json.loads(
        invoke(str(tree), "--proxy-url", PROXY, "--json", "--apply", cwd=tmp_path).stdout
    )
    assert applied["mode"] == "apply"
    assert applied["exit_code"] == 0
    assert applied["backup_id"]
    reverted = json.loads(
        invoke(str(tree), "--json", "--revert", applied["backup_id"], cwd=tmp_path).stdout
    )
    assert reverted == {
        "version": 1, "mode": "revert", "backup_id": applied["backup_id"], "exit_code": 0, "error": None,
        "restored": ["helm/chart/values.yaml", "openai-sync/app/chat.py"], "unchanged": [],
    }  # fmt: skip


def test_proxy_url_comes_from_the_config_server_section(tmp_path: Path) -> None:
    tree = copy_corpus(tmp_path / "tree", cases=["dotenv"])
    (tmp_path / "config.yaml").write_text(
        "server:\n  host: 0.0.0.0\n  port: 4100\n  master_key: os.environ/KVMIGRATE_TEST_UNSET_KEY\n"
        "backends:\n  hosted:\n    api_base: https://api.openai.com/v1\n"
        "  vllm:\n    api_base: http://127.0.0.1:8000/v1\n"
        "models:\n  - model_name: m\n    hosted: m\n    vllm: m\n"
    )
    proc = invoke(str(tree), "--json", cwd=tmp_path)  # ./config.yaml, secrets need not be set
    assert json.loads(proc.stdout)["proxy_url"] == "http://127.0.0.1:4100/v1"
    bad = invoke(str(tree), "--config", str(tmp_path / "nope.yaml"), cwd=tmp_path)
    assert bad.exit_code == EXIT_ERROR
    assert "nope.yaml" in bad.stderr
    default = invoke(str(tree), "--json", cwd=tree)  # no config anywhere: the default URL
    assert json.loads(default.stdout)["proxy_url"] == "http://127.0.0.1:4000/v1"


def test_key_is_rewritten_only_when_asked_and_never_printed(tmp_path: Path) -> None:
    tree = copy_corpus(tmp_path / "tree", cases=["dotenv", "k8s"])
    plain = invoke(str(tree), "--proxy-url", PROXY, cwd=tmp_path)
    assert "OPENAI_API_KEY=********" in plain.stdout  # diff context masks keys too
    assert "sk-local-dev-key" not in plain.stdout
    assert "-> the proxy key" not in plain.stdout
    keyed = invoke(
        str(tree), "--proxy-url", PROXY, "--proxy-key", "sk-proxy-1", "--apply", cwd=tmp_path
    )
    assert keyed.exit_code == EXIT_NOTHING, keyed.stderr
    env = (tree / "dotenv/.env").read_text()
    assert "OPENAI_API_KEY=sk-proxy-1\n" in env
    assert "sk-local-dev-key" not in keyed.stdout
    dry = invoke(str(tree), "--proxy-url", PROXY, "--proxy-key", "sk-proxy-2", cwd=tmp_path)
    assert "sk-proxy-1" not in dry.stdout
    assert "********" in dry.stdout
    assert "valueFrom" in dry.stdout  # the k8s secret reference needs a human
