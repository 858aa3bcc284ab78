"""The corpus under tests/migrate/corpus: one small project per framework and file kind,
each with `expected/`, the files as `kvmigrate rewrite --proxy-url http://kvmigrate:4000/v1`
must leave them. `diff -r corpus/<case>/project corpus/<case>/expected` shows what changes."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest
from migrate_support import CASES, CORPUS, PROXY, copy_corpus, snapshot, temp_files

from kvmigrate.migrate import Action, RewriteOptions, apply_plan, build_plan, revert

OPTIONS = RewriteOptions(PROXY)

# What each case must report, beyond its diff: (action, count) per case.
EXPECTED_FINDINGS: dict[str, dict[str, int]] = {
    # Anthropic's SDKs take the proxy's root (they append /v1/messages); the Vercel AI SDK's
    # createAnthropic and every OpenAI client take it with /v1.
    "anthropic-deploy": {"rewrite": 7},
    "anthropic-js": {"rewrite": 3, "env_switch": 1, "flagged": 1},
    "anthropic-python": {"rewrite": 5, "env_switch": 2, "flagged": 1},
    "autogen": {"rewrite": 2, "flagged": 1},
    "azure": {"flagged": 1},
    "bedrock": {"flagged": 1},
    "compose-list": {"rewrite": 2},
    "compose-map": {"rewrite": 2, "needs_human": 1},
    "crewai": {"rewrite": 1},
    "dotenv": {"rewrite": 4},
    "dspy": {"rewrite": 1},
    "gh-actions": {"rewrite": 2, "needs_human": 1},
    "helm": {"rewrite": 2},
    "instructor": {"rewrite": 1, "env_switch": 1},
    "js-openai": {"rewrite": 1, "needs_human": 1, "env_switch": 1},
    "k8s": {"rewrite": 2, "needs_human": 1},
    "langchain": {"rewrite": 2},
    "langchain-js": {"rewrite": 1},
    "litellm": {"rewrite": 2, "flagged": 1},
    "litellm-config": {"rewrite": 1, "flagged": 1, "needs_human": 1},
    "llamaindex": {"rewrite": 2},
    "no-url": {"env_switch": 1},
    "openai-async": {"rewrite": 1},
    "openai-module": {"rewrite": 2},
    "openai-sync": {"rewrite": 1},
    "runtime-url": {"needs_human": 3, "env_switch": 1},
    "vercel-ai": {"rewrite": 1},
}


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return copy_corpus(tmp_path / "tree")


def expected_tree() -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for case in CASES:
        for rel, data in snapshot(CORPUS / case / "expected").items():
            out[f"{case}/{rel}"] = data
    return out


def test_corpus_covers_every_case() -> None:
    assert sorted(EXPECTED_FINDINGS) == CASES
    for case in CASES:
        assert (
            snapshot(CORPUS / case / "project").keys()
            == snapshot(CORPUS / case / "expected").keys()
        )


def test_plan_matches_expected_and_reports_each_case(tree: Path) -> None:
    plan = build_plan(tree, OPTIONS)
    assert plan.errors == []
    assert [p.path for p in plan.problems] == ["helm/chart/templates/"]
    before, expected = snapshot(tree), expected_tree()
    changed = {c.path: c.new for c in plan.changes}
    for rel, data in before.items():
        assert changed.get(rel, data) == expected[rel], rel
    counts: dict[str, Counter[str]] = {case: Counter() for case in CASES}
    for finding in plan.findings:
        counts[finding.path.split("/")[0]][finding.action.value] += 1
    assert {case: dict(c) for case, c in counts.items()} == EXPECTED_FINDINGS


def test_apply_gives_expected_then_revert_gives_original_bytes(tree: Path) -> None:
    original = snapshot(tree)
    result = apply_plan(build_plan(tree, OPTIONS), allow_dirty=True)
    assert result.backup_id is not None
    assert snapshot(tree) == expected_tree()
    reverted = revert(tree)
    assert reverted.backup_id == result.backup_id
    assert snapshot(tree) == original
    assert temp_files(tree) == []


def test_second_run_proposes_and_changes_nothing(tree: Path) -> None:
    apply_plan(build_plan(tree, OPTIONS), allow_dirty=True)
    after_first = snapshot(tree)
    second = build_plan(tree, OPTIONS)
    assert second.changes == []
    assert not any(f.action is Action.REWRITE for f in second.findings)
    assert apply_plan(second, allow_dirty=True).backup_id is None
    assert snapshot(tree) == after_first


def test_files_not_meant_to_change_are_never_rewritten(tree: Path) -> None:
    expected, original = expected_tree(), snapshot(tree)
    untouched = [rel for rel, data in original.items() if expected[rel] == data]
    assert len(untouched) >= 10
    inodes = {rel: os.stat(tree / rel).st_ino for rel in untouched}
    mtimes = {rel: os.stat(tree / rel).st_mtime_ns for rel in untouched}
    apply_plan(build_plan(tree, OPTIONS), allow_dirty=True)
    for rel in untouched:
        st = os.stat(tree / rel)
        assert (st.st_ino, st.st_mtime_ns) == (inodes[rel], mtimes[rel]), rel
        assert (tree / rel).read_bytes() == original[rel]


def test_apply_keeps_mode_bom_and_crlf(tree: Path) -> None:
    script = tree / "openai-sync/app/chat.py"
    script.chmod(0o750)
    apply_plan(build_plan(tree, OPTIONS), allow_dirty=True)
    assert script.stat().st_mode & 0o7777 == 0o750
    prod = (tree / "dotenv/.env.production").read_bytes()
    assert prod.startswith(b"\xef\xbb\xbfOPENAI_BASE_URL=" + PROXY.encode() + b"\r\n")
    agent = (tree / "openai-async/agent.py").read_bytes()
    assert agent.count(b"\r\n") == agent.count(b"\n")
