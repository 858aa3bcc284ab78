"""A Secret never shows its value except through `reveal()`, and compares exactly."""

from __future__ import annotations

import pytest

from kvmigrate.config.secret import Secret, safe_url

KEY = "sk-live-0123456789abcdef"


def test_str_and_repr_are_masked() -> None:
    secret = Secret(KEY)
    assert repr(secret) == "Secret('********')"
    assert str(secret) == "Secret('********')"
    assert f"{secret} {[secret]} {secret!r}".count("Secret('********')") == 3
    assert secret.reveal() == KEY


@pytest.mark.parametrize(
    ("value", "candidate", "matches"),
    [
        (KEY, KEY, True),
        (KEY, KEY + "x", False),
        (KEY, KEY[:-1], False),
        (KEY, "", False),
        ("café-key", "café-key", True),
        # aiohttp decodes undecodable header bytes to lone surrogates; os.environ does too.
        (KEY, "sk-\udcff", False),
        ("sk-\udcff", "sk-\udcff", True),
        ("sk-\udcff", "sk-\udcfe", False),
    ],
)
def test_matches(value: str, candidate: str, matches: bool) -> None:
    assert Secret(value).matches(candidate) is matches


def test_equality_and_hash_follow_the_value() -> None:
    assert Secret(KEY) == Secret(KEY)
    assert Secret(KEY) != Secret(KEY + "x")
    assert Secret(KEY) != KEY  # never equal to the bare string it hides
    assert hash(Secret(KEY)) == hash(Secret(KEY))
    assert hash(Secret(KEY)) != hash(Secret(KEY + "x"))
    assert hash(Secret(KEY)) != hash(KEY)
    assert len({Secret(KEY), Secret(KEY), Secret("other")}) == 2


@pytest.mark.parametrize(
    ("url", "safe"),
    [
        ("redis://:hunter2@cache:6379/0", "redis://:***@cache:6379/0"),
        ("postgresql://app:hunter2@db/kv", "postgresql://app:***@db/kv"),
        ("postgresql://app@db/kv", "postgresql://app@db/kv"),
        ("sqlite:////var/lib/kv.db", "sqlite:////var/lib/kv.db"),
        # the password also appearing elsewhere in the URL stays there: only the netloc's goes
        ("redis://u:db@db:6379/0?name=db", "redis://u:***@db:6379/0?name=db"),
        # a password holding `@` or `:` is hidden whole
        ("redis://u:p@ss@cache:6379/0", "redis://u:***@cache:6379/0"),
        ("redis://u:a:b:c@cache/0", "redis://u:***@cache/0"),
        ("postgresql://app:pw@[::1]:5432/kv", "postgresql://app:***@[::1]:5432/kv"),
        # redis-py and libpq take the password as a query parameter too
        ("redis://cache:6379/0?password=hunter2", "redis://cache:6379/0?password=***"),
        (
            "postgresql://app@db/kv?sslmode=require&password=hunter2",
            "postgresql://app@db/kv?sslmode=require&password=***",
        ),
        (
            "postgresql://db/kv?sslpassword=x&connect_timeout=5",
            "postgresql://db/kv?sslpassword=***&connect_timeout=5",
        ),
        (
            "rediss://u:pw@cache/0?ssl_keyfile_password=k",
            "rediss://u:***@cache/0?ssl_keyfile_password=***",
        ),
        ("sqlite:////var/lib/kv.db?mode=ro", "sqlite:////var/lib/kv.db?mode=ro"),
        # one urlsplit refuses shows nothing of itself
        ("redis://:hunter2@[cache/0", "<a URL that does not parse>"),
        # written wrong, so urlsplit finds no userinfo: the `user:password@` still goes
        ("redis//:hunter2@cache:6379/0", "redis//***@cache:6379/0"),
        ("app:hunter2@db/kv", "***@db/kv"),
        ("sqlite:////var/lib/a@b.db", "sqlite:////var/lib/a@b.db"),  # no password there
        # a backend's URL: a query credential by any of its names
        ("https://gw/v1?api-key=k1&api-version=2024", "https://gw/v1?api-key=***&api-version=2024"),
        ("https://gw/v1?sig=k2&sv=1", "https://gw/v1?sig=***&sv=1"),
        ("https://gw/v1?X-Amz-Security-Token=k3", "https://gw/v1?X-Amz-Security-Token=***"),
        # names only the pattern knows, in any case (a fresh-context audit's miss)
        ("redis://cache/0?Passphrase=k4", "redis://cache/0?Passphrase=***"),
        ("https://gw/v1?AccessKey=k5&sv=1", "https://gw/v1?AccessKey=***&sv=1"),
        ("https://gw/v1?CLIENT_SECRET=k6", "https://gw/v1?CLIENT_SECRET=***"),
    ],
)
def test_safe_url_hides_only_the_password(url: str, safe: str) -> None:
    assert safe_url(url) == safe
