"""Real stores for the rollout tests: SQLite files in tmp dirs, and a real redis-server."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from services import missing

from kvmigrate.config import Config, parse_config
from kvmigrate.emulator import EmulatorSettings, build_app
from kvmigrate.serving import BackgroundServer, free_port

MODEL = "gpt-4o-mini"
SERVED = "meta-llama/Llama-3.1-8B-Instruct"


@dataclass(frozen=True)
class RedisServer:
    url: str
    process: subprocess.Popen[bytes]  # a test may pause it (SIGSTOP), as a hung store


@pytest.fixture(scope="session")
def redis_url(redis_server: RedisServer) -> str:
    return redis_server.url


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A throwaway redis-server on a free loopback port (Debian's redis-server package)."""
    binary = shutil.which("redis-server") or missing("redis-server", "redis-server")
    port = free_port()
    workdir = tmp_path_factory.mktemp("redis")
    proc = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(workdir),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 10
    while True:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                break
        assert proc.poll() is None, "redis-server exited at start"
        assert time.monotonic() < deadline, "redis-server did not listen"
        time.sleep(0.05)
    try:
        yield RedisServer(f"redis://127.0.0.1:{port}/0", proc)
    finally:
        proc.send_signal(signal.SIGCONT)  # if a test left it paused
        proc.terminate()
        proc.wait(10)


@pytest.fixture
def paused(redis_server: RedisServer) -> Iterator[RedisServer]:
    """The session's Redis for a test that pauses it (SIGSTOP, a hung store): resumed
    after the test whatever happens."""
    try:
        yield redis_server
    finally:
        redis_server.process.send_signal(signal.SIGCONT)


@pytest.fixture
def fresh_redis_url(redis_url: str, request: pytest.FixtureRequest) -> str:
    """The session's Redis, emptied for this test."""
    import redis

    # `-m "not redis"` must leave out every test that starts one: one that reaches Redis
    # through `getfixturevalue` is not marked from its fixtures, so it says so itself.
    assert request.node.get_closest_marker("redis"), f"mark {request.node.nodeid} `redis`"

    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    client.close()
    return redis_url


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/state.db"


ConfigFor = Callable[..., Config]


@pytest.fixture(scope="module")
def responses_emulators() -> Iterator[tuple[BackgroundServer, BackgroundServer]]:
    hosted = BackgroundServer(lambda: build_app(EmulatorSettings("hosted", time_scale=0.02)))
    vllm = BackgroundServer(lambda: build_app(EmulatorSettings("vllm", time_scale=0.02)))
    with hosted, vllm:
        yield hosted, vllm


@pytest.fixture
def config_for(
    tmp_path: Path, responses_emulators: tuple[BackgroundServer, BackgroundServer]
) -> ConfigFor:
    """A config for a proxy in front of `responses_emulators`, recording in full unless
    `content` says otherwise."""

    def make(rollout: str, state: str = "", vllm_url: str = "", content: str = "full") -> Config:
        hosted, vllm = responses_emulators
        state = state or f"sqlite:///{tmp_path}/state.db"
        return parse_config(
            f"""
backends:
  hosted: {{api_base: "{hosted.url}/v1"}}
  vllm: {{api_base: "{vllm_url or vllm.url}/v1", connect_timeout: 1}}
models:
  - {{model_name: {MODEL}, hosted: {MODEL}, vllm: {SERVED}}}
rollout: {{{rollout}, state: "{state}"}}
record: {{db: "sqlite:///{tmp_path}/records.db", content: {content}}}
""",
            env={},
        )

    return make
