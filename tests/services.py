"""What a test does when a system program it needs (redis-server, PostgreSQL, Chromium) is
not installed.

Outside the test script (a contributor's `.venv/bin/pytest`), the test is skipped, saying
what is missing and how to get it. `scripts/test.sh` installs every one of them and sets
`REQUIRE_ENV`, so there, and so in CI, a missing program fails the run instead: a suite that
quietly skipped the Redis or PostgreSQL tests would pass without testing them.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

REQUIRE_ENV = "KVMIGRATE_TEST_REQUIRE_SERVICES"


def required() -> bool:
    """Whether a missing program fails the run (scripts/test.sh) rather than skipping."""
    return os.environ.get(REQUIRE_ENV, "") not in ("", "0")


def missing(program: str, package: str) -> NoReturn:
    """Skip the test, or fail it under scripts/test.sh, for want of `program`."""
    reason = (
        f"{program} is not installed: apt-get install -y {package}, or run scripts/test.sh, "
        "which installs it"
    )
    if required():
        pytest.fail(f"{reason} ({REQUIRE_ENV} is set: a missing program fails the run)")
    pytest.skip(reason)
