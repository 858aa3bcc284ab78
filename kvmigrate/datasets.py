"""Request datasets as JSONL: the one reader of their lines, with its errors.

`kvmigrate cachecheck`, `parity`, `plan` and `bench` each read conversations or requests
from JSONL files in shapes of their own; what they share is here: a file read as UTF-8 line
by line (never whole, a recording can be large), blank lines skipped, and each line one
JSON object, with an error that names the file and the line.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import orjson


class DatasetError(ValueError):
    """Bad input, with the file (and line) it came from."""


def jsonl_objects(
    path: str | Path, comments: bool = False
) -> Iterator[tuple[int, str, dict[str, Any]]]:
    """Each line's object, with its line number and its place (`path:number`) for errors.
    `comments`: a line starting with `#` is skipped too."""
    try:
        with open(path, encoding="utf-8") as handle:
            yield from json_objects(handle, str(path), comments)
    except OSError as exc:
        raise DatasetError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise DatasetError(f"{path}: not UTF-8 text: {exc.reason}") from None


def json_objects(
    lines: Iterable[str], name: str, comments: bool = False
) -> Iterator[tuple[int, str, dict[str, Any]]]:
    """`jsonl_objects` over lines already at hand (`name` says where they came from)."""
    for number, line in enumerate(lines, start=1):
        text = line.strip()
        if not text or (comments and text.startswith("#")):
            continue
        where = f"{name}:{number}"
        try:
            data = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            raise DatasetError(f"{where}: not valid JSON ({exc})") from None
        if not isinstance(data, dict):
            raise DatasetError(f"{where}: expected a JSON object, got {_kind(data)}")
        yield number, where, data


def _kind(value: Any) -> str:
    return {list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number"
    )
