"""The one JSONL reader behind cachecheck, parity, plan and bench: every bad line is named
by file and line, in one wording."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvmigrate.datasets import DatasetError, jsonl_objects


def test_objects_come_with_their_line_and_place(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_bytes(b'{"a": 1}\n\n   \n# a comment\n{"b": 2}\r\n')
    with pytest.raises(DatasetError, match=r"d\.jsonl:4: not valid JSON"):
        list(jsonl_objects(path))
    assert list(jsonl_objects(path, comments=True)) == [
        (1, f"{path}:1", {"a": 1}),
        (5, f"{path}:5", {"b": 2}),
    ]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'{"a": 1}\n{"a": \n', r"d\.jsonl:2: not valid JSON \(unexpected end of data"),
        (b"[1, 2]\n", r"d\.jsonl:1: expected a JSON object, got a list"),
        (b'"text"\n', r"d\.jsonl:1: expected a JSON object, got a string"),
        (b"null\n", r"d\.jsonl:1: expected a JSON object, got null"),
        (b"7\n", r"d\.jsonl:1: expected a JSON object, got a number"),
        (b'{"a": "\xff\xfe"}\n', r"d\.jsonl: not UTF-8 text: invalid start byte"),
    ],
)
def test_a_bad_line_is_named(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "d.jsonl"
    path.write_bytes(content)
    with pytest.raises(DatasetError, match=message):
        list(jsonl_objects(path))


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match=r"nope\.jsonl: cannot read: No such file"):
        list(jsonl_objects(tmp_path / "nope.jsonl"))


def test_a_folder_is_named(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match=r": cannot read: Is a directory"):
        list(jsonl_objects(tmp_path))
