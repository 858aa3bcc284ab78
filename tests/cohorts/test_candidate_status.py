"""`rollout status` with several candidates: the next step's gates for every candidate of a
cohort, each judged on its own shadow copies, and the candidates compared against each
other; the same through `/admin/rollout`. Real emulators (one candidate failing every call),
a real proxy driven by the official openai SDK, real SQLite records and state."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import openai
import pytest
from aiohttp import web
from candidate_backends import two_candidates

from kvmigrate.config import parse_config
from kvmigrate.emulator.settings import FaultRates
from kvmigrate.recorder.evidence import open_controller
from kvmigrate.runtime import build_app as build_runtime_app
from kvmigrate.serving import BackgroundServer

VLLM = "meta-llama/Llama-3.1-8B-Instruct"
CONVERSATIONS = 40


@pytest.fixture(scope="module")
def emulators() -> Iterator[dict[str, BackgroundServer]]:
    with two_candidates(time_scale=0, fp8_faults=FaultRates(error_rate=1.0)) as servers:
        yield servers


@pytest.fixture(scope="module")
def config_path(
    tmp_path_factory: pytest.TempPathFactory, emulators: dict[str, BackgroundServer]
) -> Path:
    """A config with o3-mini in shadow across two candidates, after CONVERSATIONS streamed
    conversations through a real proxy (stopped: its records are flushed)."""
    tmp = tmp_path_factory.mktemp("candidates")
    text = f"""
server: {{admin_key: adm-secret}}
backends:
  hosted: {{api_base: "{emulators["hosted"].url}/v1"}}
  vllm: {{api_base: "{emulators["vllm"].url}/v1"}}
  vllm-fp8: {{api_base: "{emulators["vllm-fp8"].url}/v1"}}
models:
  - {{model_name: gpt-4o-mini, hosted: gpt-4o-mini, vllm: {VLLM}}}
  - model_name: o3-mini
    hosted: gpt-4o-mini
    vllm: {VLLM}
    vllm-fp8: {VLLM}
    candidates: [vllm, vllm-fp8]
rollout:
  mode: shadow
  noise_sample: 0  # no second primary calls: the primary has one request per conversation
  state: "sqlite:///{tmp}/state.db"
  gates: {{min_conversations: 5, min_requests: 20}}
  auto_rollback: {{enabled: false}}
record: {{db: "sqlite:///{tmp}/records.db"}}
"""
    path = tmp / "config.yaml"
    path.write_text(text)
    config = parse_config(text, env={})
    proxy = BackgroundServer(lambda: build_runtime_app(config, poll_interval=0.1)).start()
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="sk-client", max_retries=0)
    for number in range(CONVERSATIONS):
        stream = client.chat.completions.create(
            model="o3-mini",
            messages=[{"role": "user", "content": f"Conversation {number}: plan a trip."}],
            user=f"agent-{number}",
            stream=True,
        )
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    client.close()
    # Every copy has ended before the proxy stops (a stop cancels copies still running).
    deadline = time.monotonic() + 120
    while min(shadow_requests(proxy, b) for b in ("vllm", "vllm-fp8")) < CONVERSATIONS:
        assert time.monotonic() < deadline, "the shadow copies did not all end"
        time.sleep(0.05)
    proxy.stop()  # flushes the recorder
    return path


def shadow_requests(proxy: BackgroundServer, backend: str) -> float:
    text = urllib.request.urlopen(proxy.url + "/metrics", timeout=10).read().decode()
    return sum(
        float(line.rpartition(" ")[2])
        for line in text.splitlines()
        if line.startswith("kvmigrate_requests_total{")
        and f'backend="{backend}"' in line
        and 'role="shadow"' in line
    )


def cli(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvmigrate", *args, "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def copy_of(config_path: Path, tmp_path: Path) -> Path:
    """The config with its state and records copied under `tmp_path`."""
    for name in ("state.db", "records.db"):
        shutil.copy(config_path.parent / name, tmp_path / name)
    path = tmp_path / "config.yaml"
    path.write_text(config_path.read_text().replace(str(config_path.parent), str(tmp_path)))
    return path


def gates_of(status: dict[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
    return {c["backend"]: {g["name"]: g for g in c["gates"]} for c in status["candidates"]}


def test_every_candidate_gets_its_own_gates_and_a_comparison(config_path: Path) -> None:
    done = cli(config_path, "rollout", "status", "--model", "o3-mini", "--json")
    assert done.returncode == 0, done.stderr
    status = json.loads(done.stdout)
    assert [(c["backend"], c["serving"]) for c in status["candidates"]] == [
        ("vllm", True),
        ("vllm-fp8", False),
    ]
    gates = gates_of(status)
    # Each is judged on its own copies: one per conversation each, none of the other's.
    for backend in ("vllm", "vllm-fp8"):
        figures = gates[backend]["error_rate"]["figures"]
        assert (figures["candidate_requests"], figures["primary_requests"]) == (
            CONVERSATIONS,
            CONVERSATIONS,
        )
        assert gates[backend]["traffic"]["verdict"] == "passed"
    assert gates["vllm"]["error_rate"]["figures"]["candidate_errors"] == 0
    assert gates["vllm"]["error_rate"]["verdict"] != "failed"
    assert gates["vllm-fp8"]["error_rate"]["figures"]["candidate_errors"] == CONVERSATIONS
    assert gates["vllm-fp8"]["error_rate"]["verdict"] == "failed"
    # The serving candidate's gates are still where they were.
    assert status["gates_for_next_step"] == status["candidates"][0]["gates"]

    compared = {d["measure"]: d for d in status["comparisons"]}
    assert set(compared) == {"error_rate", "ttft_p50", "parity"}
    error = compared["error_rate"]
    assert (error["a"], error["b"], error["lead"]) == ("vllm", "vllm-fp8", "a_better")
    assert error["estimate"] == pytest.approx(-1.0)
    assert error["high"] < 0
    assert compared["parity"]["lead"] == "undecided"  # no parity scores in this window

    text = cli(config_path, "rollout", "status", "--model", "o3-mini")
    assert text.returncode == 0, text.stderr
    assert "candidate vllm (selected: a split serves it):" in text.stdout
    assert "candidate vllm-fp8:" in text.stdout
    assert "vllm better" in text.stdout


def test_the_status_table_lists_each_candidate_under_its_cohort(config_path: Path) -> None:
    done = cli(config_path, "rollout", "status")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("o3-mini"))
    serving, other, pair = lines[at + 1 : at + 4]
    assert serving.startswith("  * vllm (selected) for 10%: traffic passed")
    assert other.startswith("    vllm-fp8 for 10%: traffic passed")
    assert "error_rate failed" in other
    assert pair.startswith("  vllm vs vllm-fp8: error_rate vllm better -100.00 pts [")
    mini = next(line for line in lines if line.startswith("gpt-4o-mini"))
    assert lines[lines.index(mini) + 1 :] == [] or not lines[lines.index(mini) + 1].startswith(
        "  "
    )  # a cohort of one candidate stays one line


def test_the_admin_api_answers_the_same_and_marks_the_chosen_candidate(
    config_path: Path, tmp_path: Path
) -> None:
    config_path = copy_of(config_path, tmp_path)  # the switch below stays in this test
    switched = cli(
        config_path, "rollout", "--model", "o3-mini", "--percent", "0", "--candidate", "vllm-fp8"
    )
    assert switched.returncode == 0, switched.stderr
    config = parse_config(config_path.read_text(), env={})
    proxy = BackgroundServer(lambda: build_runtime_app(config, record=False)).start()
    try:
        request = urllib.request.Request(
            proxy.url + "/admin/rollout?cohort=o3-mini",
            headers={"Authorization": "Bearer adm-secret"},
        )
        with urllib.request.urlopen(request, timeout=30) as answer:
            status = json.loads(answer.read())
    finally:
        proxy.stop()
    assert [(c["backend"], c["serving"]) for c in status["candidates"]] == [
        ("vllm", False),
        ("vllm-fp8", True),
    ]
    assert status["candidate"] == "vllm-fp8"
    # The switch is a change: the gates count evidence from it on, for every candidate.
    assert {b: g["traffic"]["figures"]["requests"] for b, g in gates_of(status).items()} == {
        "vllm": 0,
        "vllm-fp8": 0,
    }
    assert [d["measure"] for d in status["comparisons"]] == ["error_rate", "ttft_p50", "parity"]


def test_status_against_a_proxy_older_than_cohorts_falls_back_to_its_one_status(
    config_path: Path,
) -> None:
    """A release before cohorts serves `/admin/rollout` only (and its status has no
    candidates): `rollout status` says so and shows that status instead of failing on the
    404 of `/admin/rollout/cohorts`."""
    config = parse_config(config_path.read_text(), env={})

    async def old_status(request: web.Request) -> web.Response:
        controller = open_controller(config)
        try:
            answer = msgspec.to_builtins(controller.status("gpt-4o-mini"))
        finally:
            controller.store.close()
        for newer in ("cohort", "candidate", "candidates", "comparisons"):
            del answer[newer]
        return web.json_response(answer)

    def old_proxy() -> web.Application:
        app = web.Application()
        app.router.add_get("/admin/rollout", old_status)
        return app

    with BackgroundServer(old_proxy) as old:
        done = cli(config_path, "rollout", "status", "--proxy-url", old.url)
    assert done.returncode == 0, done.stderr
    assert "/admin/rollout/cohorts answered 404" in done.stderr
    assert "predates cohorts" in done.stderr
    assert done.stdout.startswith("mode shadow, candidate share 0%")
