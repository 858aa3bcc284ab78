"""Fixtures for the recorder tests: emulated backends and a real PostgreSQL server."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
from recorder_support import Backends, postgres_bin, postgres_server
from services import missing

from kvmigrate.emulator import EmulatorSettings, build_app
from kvmigrate.serving import BackgroundServer


@pytest.fixture(scope="module")
def backends() -> Iterator[Backends]:
    """Instant emulators (time_scale 0): the tests measure behaviour, not sleeps."""
    hosted = BackgroundServer(lambda: build_app(EmulatorSettings(profile="hosted", time_scale=0)))
    vllm = BackgroundServer(lambda: build_app(EmulatorSettings(profile="vllm", time_scale=0)))
    with hosted, vllm:
        yield Backends(hosted, vllm)


@pytest.fixture(scope="session")
def postgres() -> Iterator[str]:
    """One PostgreSQL server for the session (each xdist worker starts its own). Missing
    binaries skip, or fail under scripts/test.sh."""
    bindir = postgres_bin() or missing("PostgreSQL (/usr/lib/postgresql/*/bin)", "postgresql")
    with postgres_server(bindir) as url:
        yield url


@pytest.fixture
def pg_url(postgres: str) -> str:
    """A fresh, empty database on the session's server."""
    name = "t_" + uuid.uuid4().hex[:12]
    with psycopg.connect(postgres, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return postgres.rsplit("/", 1)[0] + "/" + name
