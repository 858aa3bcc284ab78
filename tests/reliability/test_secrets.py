"""No API key, whoever's it is, ever shows up where it should not.

A real proxy process at debug log level, real traffic (streamed, failed, shadowed, admin
calls with right and wrong keys), then every place a key could leak is searched: logs, the
records database files, every report format, error bodies and /metrics. The candidate
backend records what reaches it, to show the client's hosted key never does.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from aiohttp import web
from settling import wait_settled

from kvmigrate.emulator import EmulatorSettings, build_app
from kvmigrate.serving import BackgroundServer, free_port

CLIENT_KEY = "sk-proj-CLIENTHOSTEDKEY0123456789abcdef"
HOSTED_KEY = "sk-org-BACKENDHOSTEDKEY9876543210fedcba"
VLLM_KEY = "vllm-BACKENDKEY-5f1e2d3c4b5a69788796"
MASTER_KEY = "kvm-master-MASTERKEY-aa11bb22cc33dd44"
ADMIN_KEY = "kvm-admin-ADMINKEY-ee55ff66aa77bb88"
ALL_KEYS = (CLIENT_KEY, HOSTED_KEY, VLLM_KEY, MASTER_KEY, ADMIN_KEY)


@pytest.fixture
def candidate() -> Iterator[tuple[BackgroundServer, list[dict[str, str]]]]:
    seen: list[dict[str, str]] = []

    async def handle(request: web.Request) -> web.StreamResponse:
        seen.append(dict(request.headers))
        await request.read()
        return web.json_response(
            {"error": {"message": "candidate says no", "type": "x", "code": 500}}, status=500
        )

    def make() -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handle)
        return app

    with BackgroundServer(make) as server:
        yield server, seen


def start_proxy(config: Path, env: dict[str, str], port: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kvmigrate",
            "proxy",
            "--config",
            str(config),
            "--log-level",
            "debug",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, **env},
    )
    deadline = time.monotonic() + 30
    while True:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return proc
        assert proc.poll() is None, "proxy exited"
        assert time.monotonic() < deadline, "proxy did not start"
        time.sleep(0.05)


def drive(base: str, client_key: str) -> list[str]:
    """Traffic of every kind; returns every error body the clients saw."""
    bodies: list[str] = []
    with openai.OpenAI(base_url=base + "/v1", api_key=client_key, max_retries=0) as client:
        for i in range(4):
            client.chat.completions.create(
                model="gpt-4o-mini", messages=[{"role": "user", "content": f"hi {i} {CLIENT_KEY}"}]
            )
        list(
            client.chat.completions.create(
                model="gpt-4o-mini", stream=True, messages=[{"role": "user", "content": "stream"}]
            )
        )
        for call in (
            lambda: client.chat.completions.create(model="nope", messages=[]),
            lambda: client.chat.completions.create(
                model="gpt-4o-mini", messages=[], extra_headers={"x-emulator-fault": "hosted:401"}
            ),
        ):
            try:
                call()
            except openai.APIStatusError as exc:
                bodies.append(exc.response.text)
    with openai.OpenAI(
        base_url=base + "/v1", api_key="sk-wrong-" + ADMIN_KEY[:6], max_retries=0
    ) as wrong:
        try:
            wrong.models.list()
        except openai.APIStatusError as exc:
            bodies.append(exc.response.text)
    for key in (ADMIN_KEY, "wrong-admin-key", MASTER_KEY):
        request = urllib.request.Request(
            base + "/admin/rollout", headers={"Authorization": f"Bearer {key}"}
        )
        try:
            urllib.request.urlopen(request, timeout=10).read()
        except urllib.error.HTTPError as exc:
            bodies.append(exc.read().decode())
    return bodies


@pytest.mark.slow
@pytest.mark.parametrize("pass_through", [False, True], ids=["configured-keys", "client-key"])
def test_no_key_leaks_anywhere(
    tmp_path: Path, candidate: tuple[BackgroundServer, list[dict[str, str]]], pass_through: bool
) -> None:
    candidate_server, candidate_seen = candidate
    hosted_key = CLIENT_KEY if pass_through else HOSTED_KEY
    hosted = BackgroundServer(
        lambda: build_app(EmulatorSettings("hosted", time_scale=0, api_key=hosted_key))
    ).start()
    port = free_port()
    hosted_auth = "" if pass_through else "api_key: os.environ/HOSTED_KEY,"
    master = "" if pass_through else "master_key: os.environ/MASTER_KEY,"
    config = tmp_path / "config.yaml"
    config.write_text(f"""
server: {{port: {port}, {master} admin_key: os.environ/ADMIN_KEY}}
backends:
  hosted: {{api_base: "{hosted.url}/v1", {hosted_auth}}}
  vllm: {{api_base: "{candidate_server.url}/v1", api_key: os.environ/VLLM_KEY}}
models:
  - {{model_name: gpt-4o-mini, hosted: gpt-4o-mini, vllm: llama}}
rollout: {{mode: shadow, shadow_sample: 1.0, state: "sqlite:///{tmp_path}/state.db"}}
record: {{db: "sqlite:///{tmp_path}/records.db"}}
""")
    env = {
        "HOSTED_KEY": HOSTED_KEY,
        "VLLM_KEY": VLLM_KEY,
        "MASTER_KEY": MASTER_KEY,
        "ADMIN_KEY": ADMIN_KEY,
    }
    proc = start_proxy(config, env, port)
    base = f"http://127.0.0.1:{port}"
    try:
        error_bodies = drive(base, CLIENT_KEY if pass_through else MASTER_KEY)
        wait_settled(base)  # shadow copies finish, the recorder writes them
        metrics = urllib.request.urlopen(base + "/metrics").read().decode()
    finally:
        proc.terminate()
        # Reads the debug log while the proxy shuts down: a full pipe would block its
        # logging, and with it the shutdown. ~1 s quiet; beside a CPU hog the workers
        # (lowest priority) took over 15 s to exit, so the deadline only catches a hang.
        out, _ = proc.communicate(timeout=120)
        hosted.stop()
    logs = out.decode()
    assert "kvmigrate proxy on" in logs  # the log was captured at debug level
    reports = []
    for fmt in ("text", "md", "json", "html"):
        out = subprocess.run(
            [sys.executable, "-m", "kvmigrate", "report", "--config", str(config), "--format", fmt],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, **env},
        )
        assert out.returncode == 0, out.stderr
        reports.append(out.stdout + out.stderr)
    # The records and whatever the recorder's spool still holds (unredacted exchanges, until
    # their records are written: a clean stop leaves none).
    stored = [p for p in tmp_path.glob("records.db*") if p.is_file()]
    stored += [p for p in tmp_path.glob("records.db.spool/**/*") if p.is_file()]
    db_bytes = b"".join(p.read_bytes() for p in stored)
    places = {
        "logs": logs,
        "metrics": metrics,
        "error bodies": "\n".join(error_bodies),
        "reports": "\n".join(reports),
        "records db": db_bytes.decode("latin-1"),
    }
    # The prompt itself quoted CLIENT_KEY: the default `redacted` content policy scrubs it.
    for key in ALL_KEYS:
        for place, text in places.items():
            assert key not in text, f"{key[:12]}... leaked into {place}"
    assert candidate_seen, "the candidate got its shadow copies"
    for headers in candidate_seen:
        assert headers.get("Authorization") == f"Bearer {VLLM_KEY}"
        assert CLIENT_KEY not in json.dumps(headers)
