"""`kvmigrate proxy --workers 2` with SQLite state (no Redis): a Responses chain stays
shadowed on the candidate's own chain whichever worker each turn reaches.

The turns of one chain reach different workers when the client opens a new connection per
turn (the Python SDK, a client per turn) or several at once (the Node SDK's keep-alive pool,
chains run side by side). The copy of turn N must continue the candidate's answer to the
copy of turn N-1, which may still run on the other worker: the candidate here is slower than
the primary, as a self-hosted model often is, so it usually does.

Real processes, real emulators on loopback (the candidate answers 404 to an id it never
issued), the official openai SDKs. What is counted: the later turns the primary answered,
and the candidate's calls that continued a chain of its own and were answered (the
candidate's record of what reached it), less the later turns it served itself (split).
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest
from aiohttp import web
from settling import wait_settled

from kvmigrate.emulator import EmulatorSettings, build_app
from kvmigrate.serving import BackgroundServer, free_port
from kvmigrate.testbed.node_openai import NodeMissing, ensure_node_openai

MODEL = "gpt-4o-mini"
SERVED = "meta-llama/Llama-3.1-8B-Instruct"
CHAINS, TURNS = 8, 4
NODE_SCRIPT = Path(__file__).with_name("node_chains.cjs")
START_S = 60.0  # generous: a loaded machine is slow; these are not timings
Handler = Callable[[web.Request], Any]


@dataclass
class Candidate:
    """The candidate emulator, recording each Responses call: whether it named a
    previous response, and its status."""

    calls: list[tuple[bool, int]] = field(default_factory=list)

    def app(self) -> web.Application:
        @web.middleware
        async def record(request: web.Request, handler: Handler) -> web.StreamResponse:
            raw = await request.read()
            response: web.StreamResponse = await handler(request)
            if request.method == "POST" and request.path == "/v1/responses":
                continues = "previous_response_id" in orjson.loads(raw)
                self.calls.append((continues, response.status))
            return response

        # Far slower than the primary: its copies outlast the next turn's answer.
        app = build_app(EmulatorSettings("vllm", time_scale=0.6))
        app.middlewares.insert(0, record)
        return app


@dataclass
class Pool:
    url: str
    records: Path
    candidate: Candidate
    proc: subprocess.Popen[bytes]

    def stop(self) -> None:
        """SIGTERM: the workers drain, and write every record, before they end."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(60)


def _wait_for_workers(proc: subprocess.Popen[bytes], log: Path) -> None:
    """Until the pool says every worker serves (its banner), not merely the first."""
    deadline = time.monotonic() + START_S
    while b"worker processes" not in log.read_bytes():
        assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
        assert time.monotonic() < deadline, "the pool did not start"
        time.sleep(0.1)


@pytest.fixture(params=["shadow", "split"])
def pool(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Pool]:
    # Most chains stay on the primary in the split, so most are shadowed.
    rollout = {"shadow": "mode: shadow", "split": "mode: split, percent: 25"}[request.param]
    candidate = Candidate()
    hosted = BackgroundServer(lambda: build_app(EmulatorSettings("hosted", time_scale=0.01)))
    with hosted, BackgroundServer(candidate.app) as vllm:
        port = free_port()
        config = tmp_path / "config.yaml"
        config.write_text(f"""
server: {{host: 127.0.0.1, port: {port}}}
backends:
  hosted: {{api_base: "{hosted.url}/v1"}}
  vllm: {{api_base: "{vllm.url}/v1"}}
models:
  - {{model_name: {MODEL}, hosted: {MODEL}, vllm: {SERVED}}}
rollout: {{{rollout}, shadow_sample: 1, state: "sqlite:///{tmp_path}/state.db"}}
record: {{db: "sqlite:///{tmp_path}/records.db"}}
""")
        log = tmp_path / "proxy.log"
        argv = [sys.executable, "-m", "kvmigrate", "proxy", "--config", str(config)]
        with log.open("wb") as out:
            proc = subprocess.Popen([*argv, "--workers", "2"], stdout=out, stderr=out)
        running = Pool(f"http://127.0.0.1:{port}", tmp_path / "records.db", candidate, proc)
        try:
            _wait_for_workers(proc, log)
            yield running
        finally:
            running.stop()


def python_chains(url: str) -> None:
    """Chains through a new client, so a new connection, per turn."""
    for number in range(CHAINS):
        previous = None
        for turn in range(1, TURNS + 1):
            extra: dict[str, Any] = {"previous_response_id": previous} if previous else {}
            with openai.OpenAI(base_url=url + "/v1", api_key="sk-client", max_retries=0) as client:
                answer = client.responses.create(
                    model=MODEL,
                    input=f"Chain {number}: what about step {turn}?",
                    max_output_tokens=32,
                    **extra,
                )
            assert answer.output_text
            previous = answer.id


def node_chains(url: str) -> None:
    """Chains through one Node client, four side by side."""
    try:
        modules = ensure_node_openai() / "node_modules"
    except NodeMissing as exc:
        pytest.skip(str(exc))
    done = subprocess.run(
        ["node", str(NODE_SCRIPT), url + "/v1", str(CHAINS), str(TURNS), "4"],
        env={**os.environ, "NODE_PATH": str(modules)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout) == {"turns": CHAINS * TURNS}


def later_turns(records: Path, backend: str) -> int:
    """The later turns (2 on) of chains that `backend` served."""
    with sqlite3.connect(records) as db:
        (count,) = db.execute(
            "SELECT COUNT(*) FROM records WHERE route = 'responses' AND role = 'serve' "
            "AND backend = ? AND turn >= 2",
            (backend,),
        ).fetchone()
    return int(count)


@pytest.mark.slow
@pytest.mark.parametrize("client", [python_chains, node_chains], ids=["python", "node"])
def test_a_pool_of_two_shadows_every_later_turn_of_every_chain(
    pool: Pool, client: Callable[[str], None]
) -> None:
    client(pool.url)
    wait_settled(pool.url, timeout=60, answers=CHAINS * TURNS)
    pool.stop()
    # The candidate's answered calls that continued a chain of its own: copies, and in a
    # split the later turns of the chains it serves.
    continued = sum(1 for named, status in pool.candidate.calls if named and status == 200)
    failed = [status for named, status in pool.candidate.calls if status != 200]
    shadowed_on_primary = later_turns(pool.records, "hosted")
    shadowed = continued - later_turns(pool.records, "vllm")
    assert shadowed_on_primary > 0
    assert failed == []
    assert shadowed >= 0.99 * shadowed_on_primary, (shadowed, shadowed_on_primary)
