"""A rewritten file stays the same file to its users: its owner, and the names it has."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from migrate_support import PROXY

from kvmigrate.migrate import RewriteOptions, apply_plan, build_plan, revert

DOTENV = "OPENAI_BASE_URL=https://api.openai.com/v1\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can give a file to another user")
def test_run_as_root_a_rewritten_file_keeps_its_owner(tmp_path: Path) -> None:
    env = tmp_path / ".env"
    env.write_text(DOTENV)
    os.chown(env, 1234, 2345)
    plan = build_plan(tmp_path, RewriteOptions(PROXY))
    assert [change.path for change in plan.changes] == [".env"]
    result = apply_plan(plan, allow_dirty=True)
    assert PROXY in env.read_text()
    assert (env.stat().st_uid, env.stat().st_gid) == (1234, 2345)
    assert result.backup_id is not None
    revert(tmp_path, result.backup_id)
    assert env.read_text() == DOTENV
    assert (env.stat().st_uid, env.stat().st_gid) == (1234, 2345)


def test_a_file_with_several_names_is_skipped_not_split(tmp_path: Path) -> None:
    """Renamed over, one name would get the new URL and the others keep the old one."""
    env = tmp_path / ".env"
    env.write_text(DOTENV)
    os.link(env, tmp_path / "prod.env")
    plan = build_plan(tmp_path, RewriteOptions(PROXY))
    assert plan.changes == []
    skipped = {(p.path, p.reason) for p in plan.problems}
    assert skipped == {(".env", "hardlink"), ("prod.env", "hardlink")}
    assert "2 names share this file" in plan.problems[0].detail
