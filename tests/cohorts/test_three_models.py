"""The issue's picture: one proxy, three models moving at their own pace. gpt-4o-mini is at
100% on the candidate, gpt-4o at 50%, o3-mini in shadow across two candidates. The openai
SDK drives all three; each conversation's backend follows its own cohort's percent and
pins; each candidate gets its own shadow copies; `--candidate` picks which one a split
serves, and only that one serves."""

from __future__ import annotations

import itertools
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import openai
import pytest

from kvmigrate.config import parse_config
from kvmigrate.emulator import EmulatorSettings, build_app
from kvmigrate.policies.split import in_candidate_share
from kvmigrate.runtime import build_app as build_runtime_app
from kvmigrate.serving import BackgroundServer

VLLM = "meta-llama/Llama-3.1-8B-Instruct"


@pytest.fixture(scope="module")
def emulators() -> Iterator[dict[str, BackgroundServer]]:
    settings = {
        "hosted": EmulatorSettings("hosted", time_scale=0),
        "vllm": EmulatorSettings("vllm", time_scale=0),
        "vllm-fp8": EmulatorSettings("vllm", name="vllm-fp8", time_scale=0),
    }
    servers = {n: BackgroundServer(lambda s=s: build_app(s)) for n, s in settings.items()}
    for server in servers.values():
        server.start()
    yield servers
    for server in servers.values():
        server.stop()


@pytest.fixture
def setup(tmp_path: Path, emulators: dict[str, BackgroundServer]) -> Iterator[tuple[Path, str]]:
    text = f"""
backends:
  hosted: {{api_base: "{emulators["hosted"].url}/v1"}}
  vllm: {{api_base: "{emulators["vllm"].url}/v1"}}
  vllm-fp8: {{api_base: "{emulators["vllm-fp8"].url}/v1"}}
models:
  - {{model_name: gpt-4o-mini, hosted: gpt-4o-mini, vllm: {VLLM}}}
  - {{model_name: gpt-4o, hosted: gpt-4o-mini, vllm: {VLLM}}}
  - model_name: o3-mini
    hosted: gpt-4o-mini
    vllm: {VLLM}
    vllm-fp8: {VLLM}
    candidates: [vllm, vllm-fp8]
rollout: {{state: "sqlite:///{tmp_path}/state.db"}}
record: {{enabled: false}}
"""
    path = tmp_path / "config.yaml"
    path.write_text(text)
    config = parse_config(text, env={})
    proxy = BackgroundServer(lambda: build_runtime_app(config, poll_interval=0.1)).start()
    yield path, proxy.url
    proxy.stop()


def cli(config: Path, *args: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "kvmigrate", *args, "--force", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


def turn(url: str, model: str, session: str) -> str:
    with openai.OpenAI(base_url=url + "/v1", api_key="sk-c", max_retries=0) as client:
        raw = client.chat.completions.with_raw_response.create(
            model=model,
            messages=[{"role": "user", "content": f"hello from {session}"}],
            extra_headers={"X-Session-ID": session},
        )
    return raw.headers["x-kvmigrate-backend"]


def shadow_copies(url: str, backend: str, cohort: str) -> float:
    text = urllib.request.urlopen(url + "/metrics").read().decode()
    pattern = (
        rf'^kvmigrate_requests_total\{{backend="{re.escape(backend)}",cohort="{cohort}",'
        r'role="shadow",[^}]*\} (\S+)$'
    )
    return sum(float(m.group(1)) for m in re.finditer(pattern, text, re.MULTILINE))


# A deadline, not a measurement: each probe opens an SDK client, slow on a loaded machine;
# pickup within a second is tested on the proxies' own rollout version (test_cohort_live).
DEADLINE_S = 30.0


def wait_until(predicate: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


@pytest.mark.slow
def test_three_models_each_follow_their_own_rollout(setup: tuple[Path, str]) -> None:
    config, url = setup
    probes = itertools.count()

    def fresh() -> str:
        # A new conversation per probe: a probe answered before the change applied is
        # pinned where it went, and would be answered there forever after.
        return f"probe-{next(probes)}"

    cli(config, "rollout", "--model", "gpt-4o-mini", "--percent", "100")
    cli(config, "rollout", "--model", "gpt-4o", "--percent", "50")
    wait_until(lambda: turn(url, "gpt-4o-mini", fresh()) == "vllm", DEADLINE_S)
    wait_until(lambda: in_candidate_share("kvmigrate", "p2", 50) == (turn(url, "gpt-4o", "p2") == "vllm"), DEADLINE_S)  # fmt: skip

    sessions = [f"s{i}" for i in range(24)]
    mini = {s: {turn(url, "gpt-4o-mini", s) for _ in range(2)} for s in sessions}
    big = {s: {turn(url, "gpt-4o", s) for _ in range(2)} for s in sessions}
    shadow = {s: {turn(url, "o3-mini", s) for _ in range(2)} for s in sessions}
    assert all(b == {"vllm"} for b in mini.values())
    assert all(b == {"hosted"} for b in shadow.values())
    for s, backends in big.items():  # one backend per conversation, by its bucket
        assert backends == {"vllm" if in_candidate_share("kvmigrate", s, 50) else "hosted"}
    assert {next(iter(b)) for b in big.values()} == {"vllm", "hosted"}
    # In shadow, each of o3-mini's candidates gets its own copy of every turn.
    for backend in ("vllm", "vllm-fp8"):
        wait_until(
            lambda b=backend: shadow_copies(url, b, "o3-mini") >= 2 * len(sessions), DEADLINE_S
        )
    assert shadow_copies(url, "vllm-fp8", "gpt-4o") == 0

    # Raising gpt-4o moves new conversations only: pins hold the started ones.
    cli(config, "rollout", "--model", "gpt-4o", "--percent", "100")
    wait_until(lambda: turn(url, "gpt-4o", fresh()) == "vllm", DEADLINE_S)
    for s, backends in big.items():
        assert turn(url, "gpt-4o", s) == next(iter(backends))

    # A split of o3-mini serves the chosen candidate only; the other keeps its copies.
    cli(config, "rollout", "--model", "o3-mini", "--percent", "100", "--candidate", "vllm-fp8")
    wait_until(lambda: turn(url, "o3-mini", fresh()) == "vllm-fp8", DEADLINE_S)
    served = {turn(url, "o3-mini", f"n{i}") for i in range(8)}
    assert served == {"vllm-fp8"}
    assert turn(url, "gpt-4o-mini", "after") == "vllm"  # the others did not move
