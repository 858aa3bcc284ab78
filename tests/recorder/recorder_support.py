"""Helpers for the recorder and report tests: a proxy with a recorder in front of emulators,
and a PostgreSQL server of our own (a local copy of the proxy tests' helpers, so the two
suites stay independent)."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai

from kvmigrate.config import Config, parse_config
from kvmigrate.proxy import build_proxy_app
from kvmigrate.recorder import RecorderAddon, WriterSettings, build_recorder
from kvmigrate.serving import BackgroundServer, free_port

HOSTED_MODEL = "gpt-4o-mini"
VLLM_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


@dataclass
class Backends:
    hosted: BackgroundServer
    vllm: BackgroundServer


def recorder_config(
    hosted_url: str,
    vllm_url: str,
    db: str,
    content: str = "redacted",
    rollout: str = "{mode: shadow, noise_sample: 0}",
    workers: int = 1,
    spool_dir: str = "",
) -> Config:
    text = f"""
backends:
  hosted: {{api_base: "{hosted_url}/v1", read_timeout: 5}}
  vllm: {{api_base: "{vllm_url}/v1", read_timeout: 5}}
models:
  - {{model_name: {HOSTED_MODEL}, hosted: {HOSTED_MODEL}, vllm: {VLLM_MODEL}}}
rollout: {rollout}
record: {{db: "{db}", content: {content}, workers: {workers}, spool_dir: "{spool_dir}"}}
"""
    return parse_config(text, env={})


@dataclass
class RecordingProxy:
    server: BackgroundServer
    config: Config
    recorder: RecorderAddon
    clients: list[openai.OpenAI] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.server.url

    def client(self) -> openai.OpenAI:
        client = openai.OpenAI(base_url=self.url + "/v1", api_key="sk-client", max_retries=0)
        self.clients.append(client)
        return client

    def stop(self) -> None:
        """Stop the server: its cleanup awaits the recorder's `done()`, which flushes."""
        for client in self.clients:
            client.close()
        self.server.stop(timeout=30)


def start_recording_proxy(
    config: Config, source: str | None = None, **settings: Any
) -> RecordingProxy:
    recorder = build_recorder(config, settings=WriterSettings(**settings), source=source)
    server = BackgroundServer(lambda: build_proxy_app(config, addons=[recorder])).start()
    return RecordingProxy(server, config, recorder)


def wait_until(predicate: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.05)


# --- a PostgreSQL server of our own ------------------------------------------------------


def postgres_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"), key=_version)
    return Path(found[-1]).parent if found else None


def _version(path: str) -> float:
    try:
        return float(Path(path).parents[1].name)
    except ValueError:
        return 0.0


def _as_postgres(args: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """PostgreSQL refuses to run as root: drop to the `postgres` user when we are root."""
    prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    return subprocess.run(
        prefix + args, check=True, capture_output=True, text=True, timeout=120, **kwargs
    )


@contextmanager
def postgres_server(bindir: Path) -> Iterator[str]:
    """A throwaway PostgreSQL on a free port; yields the URL of its `postgres` database."""
    root = Path(tempfile.mkdtemp(prefix="kvmigrate-pg-"))
    data, sockets = root / "data", root / "sockets"
    sockets.mkdir()
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
        shutil.chown(sockets, "postgres")
    port = free_port()
    try:
        _as_postgres(
            [str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust",
             "-E", "UTF8", "--no-sync"]
        )  # fmt: skip
        options = f"-p {port} -k {sockets} -c listen_addresses=127.0.0.1 -c fsync=off"
        _as_postgres(
            [str(bindir / "pg_ctl"), "-D", str(data), "-o", options, "-l", str(root / "log"),
             "-w", "-t", "60", "start"]
        )  # fmt: skip
        try:
            yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
        finally:
            _as_postgres([str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"])
    finally:
        shutil.rmtree(root, ignore_errors=True)
