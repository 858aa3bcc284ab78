"""A proxy's config in front of two Responses emulators, for the tests of chains and
conversations through the proxy. The stores (SQLite, Redis) are tests/conftest.py's."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kvmigrate.config import Config, parse_config
from kvmigrate.emulator import EmulatorSettings, build_app
from kvmigrate.serving import BackgroundServer

MODEL = "gpt-4o-mini"
SERVED = "meta-llama/Llama-3.1-8B-Instruct"


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
