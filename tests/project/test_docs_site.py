"""The documentation site builds with `mkdocs build --strict`: a page missing from the nav, a
link to a page or an anchor that is not there, or a bad config fails the test (mkdocs.yml
turns every link check into a warning, and --strict makes a warning an error). CI runs the
same build (.ci/run). Never with --quiet: it drops the warnings before strict mode counts
them, and a broken link passes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _build(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )


def test_docs_site_builds_strictly(tmp_path: Path) -> None:
    proc = _build(ROOT, tmp_path / "site")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "site" / "index.html").exists()
    # deploy/README.md is included in the deployment page, not linked
    assert "Deploying kvmigrate" in (tmp_path / "site" / "deployment" / "index.html").read_text()


def test_a_broken_link_or_anchor_fails_the_build(tmp_path: Path) -> None:
    shutil.copy(ROOT / "mkdocs.yml", tmp_path)
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    (tmp_path / "deploy").mkdir()
    shutil.copy(ROOT / "deploy" / "README.md", tmp_path / "deploy")
    page = tmp_path / "docs" / "by-hand.md"
    page.write_text(page.read_text() + "\n[a page](nowhere.md), [an anchor](gates.md#nowhere)\n")
    proc = _build(tmp_path, tmp_path / "site")
    assert proc.returncode != 0
    assert "'nowhere.md'" in proc.stderr
    assert "'#nowhere'" in proc.stderr


def test_every_docs_page_is_in_the_nav() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    missing = [p.name for p in sorted((ROOT / "docs").glob("*.md")) if f" {p.name}" not in nav]
    assert not missing, f"pages the site does not list: {missing}"
