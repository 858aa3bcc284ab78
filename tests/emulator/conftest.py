"""Fixtures that stand up emulators on free loopback ports, answering instantly by default."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from emulator_support import StartEmulator

from kvmigrate.emulator import EmulatorSettings, build_app
from kvmigrate.serving import BackgroundServer


def _start(profile: str, **overrides: Any) -> BackgroundServer:
    overrides.setdefault("time_scale", 0.0)
    settings = EmulatorSettings(profile=profile, **overrides)  # type: ignore[arg-type]
    return BackgroundServer(lambda: build_app(settings)).start()


@pytest.fixture
def start_emulator() -> Iterator[StartEmulator]:
    """Start emulators with custom settings; all are stopped after the test."""
    servers: list[BackgroundServer] = []

    def start(profile: str = "vllm", **overrides: Any) -> BackgroundServer:
        server = _start(profile, **overrides)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture(scope="module")
def hosted_server() -> Iterator[BackgroundServer]:
    server = _start("hosted")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def vllm_server() -> Iterator[BackgroundServer]:
    server = _start("vllm")
    yield server
    server.stop()


@pytest.fixture(params=["hosted", "vllm"])
def any_server(
    request: pytest.FixtureRequest, hosted_server: BackgroundServer, vllm_server: BackgroundServer
) -> BackgroundServer:
    return hosted_server if request.param == "hosted" else vllm_server
