"""Files that can hold prompts or keys, made private (0600, folders 0700) whatever the umask.

The records database keeps whole prompts (`record.content: full`), the rollout store keeps
the HMAC key of conversation keys, and reports and `--export-requests` files quote
recorded traffic. Created with the umask's usual 0644, any local user could read them.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

FILE_MODE = 0o600
DIR_MODE = 0o700


def private_parents(path: Path) -> None:
    """The folders above `path`; each one made here is 0700 (an existing one is left as
    it is: it may be shared on purpose, like /var/lib)."""
    missing = []
    for parent in [path.parent, *path.parent.parents]:
        if parent.exists():
            break
        missing.append(parent)
    for folder in reversed(missing):
        with contextlib.suppress(FileExistsError):  # made by another process meanwhile
            folder.mkdir(mode=DIR_MODE)
            os.chmod(folder, DIR_MODE)  # mkdir's mode goes through the umask


def create_private(path: Path) -> None:
    """Make `path` an empty 0600 file unless it exists, its folders too: before SQLite
    opens a new database, which then gives its -wal and -shm files the database's mode."""
    private_parents(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    except FileExistsError:
        return
    try:
        os.fchmod(fd, FILE_MODE)
    finally:
        os.close(fd)


@contextlib.contextmanager
def private_output(path: Path) -> Iterator[TextIO]:
    """A text file written whole or not at all, and 0600: a temporary file beside `path`
    (mkstemp makes it 0600), renamed over it once the block ends without an error, so a
    full disk or a Ctrl-C never leaves a truncated file that looks complete."""
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            yield out
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


def write_private(path: Path, text: str) -> None:
    with private_output(path) as out:
        out.write(text)
