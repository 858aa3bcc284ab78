"""The one error type that config loading raises."""

from __future__ import annotations


class ConfigError(Exception):
    """A config file that cannot be used, with where and why.

    The message names the file, the dotted key path and the reason, so the CLI can print it
    as it is and exit non-zero instead of showing a traceback.
    """

    def __init__(self, source: str, path: str, reason: str) -> None:
        self.source = source
        self.path = path
        self.reason = reason
        where = f"{source}: {path}" if path else source
        super().__init__(f"{where}: {reason}")
