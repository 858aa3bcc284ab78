"""Every file that can hold prompts or keys is private whatever the umask: the records
database (whole prompts with `content: full`) and the rollout store (the HMAC key of
conversation keys), their -wal and -shm files and the folders made for them, reports and
`--export-requests` files."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvmigrate.cli import main
from kvmigrate.recorder.store import open_store as open_records
from kvmigrate.rollout.state import RolloutState
from kvmigrate.rollout.store import open_store as open_rollout


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture(autouse=True)
def _usual_umask() -> Iterator[None]:
    old = os.umask(0o022)  # what most systems give: files 0644, folders 0755
    try:
        yield
    finally:
        os.umask(old)


def test_the_records_database_and_its_folder_are_private(tmp_path: Path) -> None:
    db = tmp_path / ".kvmigrate" / "records.db"
    with open_records(f"sqlite:///{db}"):  # open: its -wal and -shm exist
        files = [db, Path(f"{db}-wal"), Path(f"{db}-shm")]
        assert {p.name: mode(p) for p in files} == {p.name: 0o600 for p in files}
    assert mode(db.parent) == 0o700


def test_the_rollout_store_and_its_folder_are_private(tmp_path: Path) -> None:
    db = tmp_path / "state" / "deeper" / "state.db"
    store = open_rollout(f"sqlite:///{db}", RolloutState())
    try:
        store.read()
        files = [db, *db.parent.glob("state.db-*")]
        assert len(files) == 3  # the database, its -wal and -shm
        assert {p.name: mode(p) for p in files} == {p.name: 0o600 for p in files}
    finally:
        store.close()
    assert mode(db.parent) == mode(db.parent.parent) == 0o700


def test_an_existing_folder_keeps_its_mode(tmp_path: Path) -> None:
    """A folder the operator made (/var/lib/...) may be shared on purpose."""
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    with open_records(f"sqlite:///{shared}/records.db"):
        pass
    assert mode(shared) == 0o755
    assert mode(shared / "records.db") == 0o600


def test_report_and_exported_requests_are_private(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(
        "backends: {hosted: {api_base: 'http://127.0.0.1:9/v1'}, "
        "vllm: {api_base: 'http://127.0.0.1:9/v1'}}\n"
        "models: [{model_name: m, hosted: m, vllm: m}]\n"
        f"record: {{db: 'sqlite:///{tmp_path}/records.db', content: full}}\n"
        f"rollout: {{state: 'sqlite:///{tmp_path}/state.db'}}\n"
    )
    out, export = tmp_path / "report.md", tmp_path / "requests.jsonl"
    result = CliRunner().invoke(
        main,
        ["report", "--config", str(config), "--format", "md", "--out", str(out),
         "--export-requests", str(export)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert (mode(out), mode(export)) == (0o600, 0o600)
    assert out.read_text().startswith("# ")


def test_an_export_to_a_missing_folder_is_one_line(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(
        "backends: {hosted: {api_base: 'http://127.0.0.1:9/v1'}, "
        "vllm: {api_base: 'http://127.0.0.1:9/v1'}}\n"
        "models: [{model_name: m, hosted: m, vllm: m}]\n"
        f"record: {{db: 'sqlite:///{tmp_path}/records.db'}}\n"
        f"rollout: {{state: 'sqlite:///{tmp_path}/state.db'}}\n"
    )
    missing = tmp_path / "nope" / "requests.jsonl"
    result = CliRunner().invoke(
        main, ["report", "--config", str(config), "--export-requests", str(missing)]
    )
    assert result.exit_code == 1
    assert f"cannot write {missing}: No such file or directory" in result.output
