"""A strict reader over one mapping of a parsed YAML file.

Each typed getter records the key it read, so `finish()` can refuse every key nobody asked
for. Typos such as `shadow_sampel` then fail at start with their full path, rather than being
silently ignored the way most YAML loaders ignore them.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import urlsplit

from kvmigrate.config.errors import ConfigError, shown
from kvmigrate.config.model import URL_MAX_CHARS
from kvmigrate.config.secret import Secret, safe_url

ENV_PREFIX = "os.environ/"
MISSING: Any = object()  # no default: the key is required


class Section:
    """A mapping in the config file, read key by key."""

    def __init__(
        self,
        data: Any,
        source: str,
        path: str,
        env: Mapping[str, str],
        secrets_required: bool = True,
    ) -> None:
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ConfigError(
                source, path or "(top level)", f"expected a mapping, got {_kind(data)}"
            )
        self._data: dict[Any, Any] = data
        self._seen: set[str] = set()
        # The variable each value read from the environment came from, by key: an error
        # names the variable, never the value (a URL in one often holds a password).
        self._env_names: dict[str, str] = {}
        self.source = source
        self.path = path
        self.env = env
        # False for commands that never use a credential (report, records): a secret whose
        # variable is unset then loads as `UnsetSecret`, which fails only if revealed.
        self.secrets_required = secrets_required

    def key_path(self, key: str | int) -> str:
        if isinstance(key, int):
            return f"{self.path}[{key}]"
        return f"{self.path}.{key}" if self.path else key

    def error(self, key: str | int, reason: str) -> ConfigError:
        path = self.key_path(key)
        name = self._env_names.get(str(key))
        if name is not None:
            path += f" (from {ENV_PREFIX}{name})"
        return ConfigError(self.source, path, reason)

    def quoted(self, key: str | int, value: object) -> str:
        """How an error shows the value read at `key`: one read from the environment not at
        all (`error` names its variable), a URL without its password, any value cut short."""
        if str(key) in self._env_names:
            return "the value of that variable"
        return shown(safe_url(value) if isinstance(value, str) else value)

    def has(self, key: str) -> bool:
        return key in self._data

    def names(self) -> Iterator[str]:
        for key in self._data:
            if not isinstance(key, str):
                raise self.error(str(key), "keys must be strings")
            yield key

    def raw(self, key: str, default: Any = MISSING) -> Any:
        self._seen.add(key)
        if key not in self._data or self._data[key] is None:
            if default is MISSING:
                raise self.error(key, "is required")
            return default
        return self._data[key]

    def section(self, key: str) -> Section:
        return self.child(key, self.raw(key, {}))

    def child(self, key: str | int, value: Any) -> Section:
        path = self.key_path(key)
        return Section(value, self.source, path, self.env, self.secrets_required)

    def string(self, key: str, default: Any = MISSING) -> Any:
        value = self.raw(key, default)
        if value is default and default is not MISSING:
            return value
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise self.error(key, f"expected a string, got {_kind(value)}")
        return self.resolved(key, str(value))

    def word(self, key: str, default: Any, limit: int) -> Any:
        """A string of one word (a host name, a URL): at most `limit` characters, with no
        whitespace or control character."""
        value = self.string(key, default)
        return value if value is None else self.checked(key, value, limit, spaces=False)

    def name(self, key: str | int, limit: int) -> str:
        """A name (a model's, a cohort's): at most `limit` characters of printable text."""
        value = self.string(str(key))
        return self.checked(key, value, limit, spaces=True)

    def checked(self, key: str | int, text: str, limit: int, *, spaces: bool) -> str:
        """`text`, if it is at most `limit` characters without a control character (a line
        break, a tab, an escape, a bidi control), nor a space unless `spaces`. Refused
        naming the key and its variable, never the value: one from the environment may be
        a URL with a password in it."""
        if len(text) > limit:
            raise self.error(key, f"must be at most {limit} characters; got {len(text)}")
        if text.isprintable() and (spaces or " " not in text):
            return text
        bad = next(c for c in text if not c.isprintable() or (c == " " and not spaces))
        what = "control characters" if spaces else "whitespace or control characters"
        raise self.error(key, f"must not contain {what}; found U+{ord(bad):04X}")

    def resolved(self, key: str | int, text: str) -> str:
        """`text`, or the environment variable it names as `os.environ/NAME`."""
        if not text.startswith(ENV_PREFIX):
            return text
        value = self._env_value(key, text)
        self._env_names[str(key)] = text[len(ENV_PREFIX) :]
        return value

    def secret(self, key: str) -> Secret | None:
        """A credential: literal or `os.environ/NAME`, wrapped so it never prints."""
        text = self.raw(key, None)
        if not self.secrets_required and isinstance(text, str) and text.startswith(ENV_PREFIX):
            name = text[len(ENV_PREFIX) :]
            if name and not self.env.get(name):
                return UnsetSecret(name, self.key_path(key))
        value = self.string(key, None)
        if value is None:
            return None
        if not value:
            raise self.error(key, "is empty; remove the key to leave it unset")
        return Secret(value)

    def boolean(self, key: str, default: bool) -> bool:
        value = self.raw(key, default)
        if not isinstance(value, bool):
            raise self.error(key, f"expected true or false, got {shown(value)}")
        return value

    def integer(
        self, key: str, default: int, low: int | None = None, high: int | None = None
    ) -> int:
        value = self.raw(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(key, f"expected a whole number, got {shown(value)}")
        _check_range(self, key, value, low, high)
        return value

    def number(
        self, key: str, default: float, low: float | None = None, high: float | None = None
    ) -> float:
        value = self.raw(key, default)
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
        ):
            raise self.error(key, f"expected a number, got {shown(value)}")
        _check_range(self, key, value, low, high)
        return float(value)

    def optional_number(
        self, key: str, default: float | None, low: float | None = None, high: float | None = None
    ) -> float | None:
        """A number that may be left unset (null or absent) to switch its check off."""
        if self.raw(key, None) is None:
            return default
        return self.number(key, 0.0, low, high)

    def choice(self, key: str, default: str, allowed: tuple[str, ...]) -> str:
        value = self.string(key, default)
        if value not in allowed:
            got = self.quoted(key, value)
            raise self.error(key, f"must be one of {', '.join(allowed)}; got {got}")
        return str(value)

    def url(self, key: str | int, value: Any, schemes: tuple[str, ...] = ("http", "https")) -> str:
        if not isinstance(value, str):
            raise self.error(key, f"expected a URL string, got {_kind(value)}")
        text = self.checked(key, self.resolved(key, value), URL_MAX_CHARS, spaces=False)
        expected = f"expected a {'/'.join(schemes)} URL"
        try:
            parts = urlsplit(text)
            parts.port  # noqa: B018 - parsed here, or the first request fails on it
        except ValueError as exc:  # an unclosed `[` (IPv6), a port out of range
            # Not the message's end: it quotes the port as written, which is the password
            # in `http://user:secret/v1` (the host forgotten).
            problem = str(exc).partition(" as ")[0]
            raise self.error(key, f"{expected}: {problem}") from None
        if parts.scheme not in schemes or not parts.netloc:
            raise self.error(key, f"{expected}, got {self.quoted(key, text)}")
        return text.rstrip("/")

    def finish(self) -> None:
        """Refuse the keys that no getter read: they are typos or unsupported settings."""
        unknown = [str(k) for k in self._data if k not in self._seen]
        if unknown:
            raise self.error(unknown[0], "unknown key" + _suggest(unknown[0], self._seen))

    def _env_value(self, key: str | int, text: str) -> str:
        name = text[len(ENV_PREFIX) :]
        if not name:
            raise self.error(key, f"{ENV_PREFIX} must name an environment variable")
        value = self.env.get(name)
        if value is None:
            raise self.error(key, f"environment variable {name} is not set")
        if not value:
            raise self.error(key, f"environment variable {name} is set but empty")
        return value


class UnsetSecret(Secret):
    """A secret whose environment variable is not set, in a config loaded by a command that
    does not need it. Using it fails with the reason the loader would have given."""

    __slots__ = ("_name", "_where")

    def __init__(self, name: str, where: str) -> None:
        super().__init__("")
        self._name = name
        self._where = where

    def reveal(self) -> str:
        raise ConfigError("", self._where, f"environment variable {self._name} is not set")

    def matches(self, candidate: str) -> bool:
        return False


def _check_range(
    section: Section, key: str, value: float, low: float | None, high: float | None
) -> None:
    if low is not None and value < low:
        raise section.error(key, f"must be at least {low}; got {shown(value)}")
    if high is not None and value > high:
        raise section.error(key, f"must be at most {high}; got {shown(value)}")


def _kind(value: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), type(value).__name__
    )


def _suggest(unknown: str, known: set[str]) -> str:
    import difflib

    close = difflib.get_close_matches(unknown, sorted(known), n=1)
    return f" (did you mean {shown(close[0])}?)" if close else ""
