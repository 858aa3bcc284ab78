"""The link table the workers of `proxy --workers N` share in memory: what one worker writes
another reads at once, with no store write to wait for; what does not fit, has expired, was
evicted or is torn reads as a miss, and the store answers instead."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from kvmigrate.continuity.link_table import (
    BUCKET_SLOTS,
    ENV,
    LinkTable,
    LinkTableError,
    create_table,
)

CONVERSATION = "h:0123456789abcdef01234567"
SLOT_BYTES = 40


def key(n: int) -> str:
    return f"c:{n:032x}"


def test_what_one_mapping_writes_another_reads(tmp_path: Path) -> None:
    path = create_table(str(tmp_path))
    writer, reader = LinkTable(path), LinkTable(path)
    expires = time.time() + 60
    assert writer.put(key(1), CONVERSATION, 3, expires)
    assert reader.get(key(1)) == (CONVERSATION, 3)
    assert writer.put(key(1), CONVERSATION, 4, expires)  # the same link again: replaced
    assert reader.get(key(1)) == (CONVERSATION, 4)
    assert reader.get(key(2)) is None
    assert reader.get("q:" + key(1)[2:]) is None  # a request link is another key


@pytest.mark.parametrize(
    ("conversation", "turn"),
    [
        ("alice@example.com", 1),  # a declared key: the store keeps its keyed hash instead
        ("h:0123", 1),
        ("h:0123456789abcdef0123456z", 1),
        (CONVERSATION, -1),
        (CONVERSATION, 2**32),
    ],
)
def test_a_link_that_does_not_fit_a_slot_is_refused(
    tmp_path: Path, conversation: str, turn: int
) -> None:
    table = LinkTable(create_table(str(tmp_path)))
    assert not table.put(key(1), conversation, turn, time.time() + 60)
    assert table.get(key(1)) is None


def test_an_expired_link_reads_as_a_miss_and_its_slot_is_reused(tmp_path: Path) -> None:
    table = LinkTable(create_table(str(tmp_path), buckets=1))
    for n in range(BUCKET_SLOTS):
        assert table.put(key(n), CONVERSATION, 1, time.time() - 5 if n == 3 else time.time() + 60)
    assert table.get(key(3)) is None
    assert table.put(key(100), CONVERSATION, 2, time.time() + 60)  # takes the expired slot
    assert [table.get(key(n)) is not None for n in range(BUCKET_SLOTS)] == [
        n != 3 for n in range(BUCKET_SLOTS)
    ]
    assert table.get(key(100)) == (CONVERSATION, 2)


def test_a_full_bucket_evicts_the_link_that_expires_first(tmp_path: Path) -> None:
    table = LinkTable(create_table(str(tmp_path), buckets=1))
    now = time.time()
    for n in range(BUCKET_SLOTS):
        table.put(key(n), CONVERSATION, 1, now + 600 - (100 if n == 5 else 0))
    table.put(key(100), CONVERSATION, 1, now + 600)
    assert table.get(key(5)) is None
    assert all(table.get(key(n)) for n in range(BUCKET_SLOTS) if n != 5)
    assert table.get(key(100)) == (CONVERSATION, 1)


def test_a_torn_slot_reads_as_a_miss_and_is_written_again(tmp_path: Path) -> None:
    """Two workers writing one slot at once, or a read during a write, leave a slot whose
    checksum does not match: no worker trusts it, and the next link may take it."""
    path = create_table(str(tmp_path), buckets=1)
    table = LinkTable(path)
    table.put(key(1), CONVERSATION, 7, time.time() + 60)
    data = bytearray(path.read_bytes())
    data[17] ^= 0xFF  # a byte of the conversation, as a half-finished write leaves it
    path.write_bytes(bytes(data))
    assert LinkTable(path).get(key(1)) is None
    assert table.put(key(1), CONVERSATION, 8, time.time() + 60)
    assert LinkTable(path).get(key(1)) == (CONVERSATION, 8)


@pytest.mark.parametrize("size", [0, SLOT_BYTES * BUCKET_SLOTS - 1])
def test_a_file_that_is_not_a_table_is_refused(tmp_path: Path, size: int) -> None:
    path = tmp_path / "links.table"
    path.write_bytes(b"\0" * size)
    with pytest.raises(LinkTableError, match="not a link table"):
        LinkTable(path)


def test_a_worker_finds_its_table_by_the_environment_and_does_without_a_missing_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker maps the table its parent named; one started after a cleaner removed the
    file starts anyway, its links going through the store, and says so."""
    monkeypatch.delenv(ENV, raising=False)
    assert LinkTable.from_environment() is None  # a single proxy: no table
    path = create_table(str(tmp_path))
    monkeypatch.setenv(ENV, str(path))
    found = LinkTable.from_environment()
    assert found is not None
    assert found.put(key(1), CONVERSATION, 1, time.time() + 60)
    path.unlink()
    with caplog.at_level("WARNING", logger="kvmigrate.identity"):
        assert LinkTable.from_environment() is None
    assert "conversation links go through the store only" in caplog.text
