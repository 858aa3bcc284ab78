"""The config's lookups, one table each: cohorts in their order, each cohort's candidates
and steps, the model a cohort belongs to, the backends a rollout may reach, and what a
backend shows of itself."""

from __future__ import annotations

import pytest

from kvmigrate.config import Config, parse_config
from kvmigrate.config.model import NotDirect

CONFIG = """
backends:
  hosted: {api_base: "http://127.0.0.1:9/v1"}
  vllm: {api_base: ["http://127.0.0.1:9/v1", "http://127.0.0.2:9/v1"]}
  fp8: {api_base: "http://127.0.0.1:9/v1", api_key: os.environ/FP8_KEY}
  gw: {type: litellm, litellm_params: {vertex_credentials: os.environ/GW_KEY}}
models:
  - {model_name: chat, hosted: gpt-4o, vllm: llama, fp8: llama-fp8, candidates: [fp8, vllm]}
  - {model_name: mini, hosted: gpt-4o-mini, vllm: small}
  - {model_name: embed, hosted: text-embedding-3-small}
  - {model_name: gateway, hosted: gpt-4o, gw: openai/gpt-4o, candidates: [gw]}
cohorts:
  - {name: beta, model: chat, match: {header: {X-Tier: beta}}, steps: [1, 5]}
  - {name: mini-beta, model: mini, match: {header: {X-Tier: beta}}}
  - {name: chat-partner, model: chat, match: {header: {X-Partner: acme}}}
rollout: {candidate: vllm, steps: [10, 50, 100]}
"""


@pytest.fixture
def config() -> Config:
    return parse_config(CONFIG, env={"FP8_KEY": "sk-fp8-secret", "GW_KEY": "sk-gw-secret"})


def test_cohorts_in_order_each_models_named_ones_first(config: Config) -> None:
    # embed: no candidate serves it, so it has no rollout and no cohort
    assert config.cohort_names() == ("beta", "chat-partner", "chat", "mini-beta", "mini", "gateway")


@pytest.mark.parametrize(
    ("cohort", "candidates", "steps", "own_model"),
    [
        ("chat", ("fp8", "vllm"), (10.0, 50.0, 100.0), "chat"),
        ("beta", ("fp8", "vllm"), (1.0, 5.0), ""),
        ("chat-partner", ("fp8", "vllm"), (10.0, 50.0, 100.0), ""),
        ("mini", ("vllm",), (10.0, 50.0, 100.0), "mini"),
        ("mini-beta", ("vllm",), (10.0, 50.0, 100.0), ""),
        ("gateway", ("gw",), (10.0, 50.0, 100.0), "gateway"),
        ("", ("vllm",), (10.0, 50.0, 100.0), ""),
        ("nobody", ("vllm",), (10.0, 50.0, 100.0), ""),
        ("Chat", ("vllm",), (10.0, 50.0, 100.0), ""),
    ],
)
def test_each_cohorts_candidates_steps_and_model(
    config: Config,
    cohort: str,
    candidates: tuple[str, ...],
    steps: tuple[float, ...],
    own_model: str,
) -> None:
    assert config.candidates_of(cohort) == candidates
    assert config.steps_of(cohort) == steps
    assert config.own_model(cohort) == own_model


@pytest.mark.parametrize(
    ("name", "model"), [("beta", "chat"), ("mini-beta", "mini"), ("bet", None), ("chat", None)]
)
def test_a_named_cohort_is_found_by_its_exact_name(
    config: Config, name: str, model: str | None
) -> None:
    found = config.cohort(name)
    assert (found.model if found else None) == model


@pytest.mark.parametrize(
    ("model", "served"),
    [("chat", "gpt-4o"), ("mini", "gpt-4o-mini"), ("chat ", None), ("cha", None), ("", None)],
)
def test_a_route_is_found_by_its_exact_model_name(
    config: Config, model: str, served: str | None
) -> None:
    route = config.route(model)
    assert (route.served_name("hosted") if route else None) == served


def test_what_each_backend_calls_a_model(config: Config) -> None:
    route = config.route("chat")
    assert route is not None
    assert [route.served_name(b) for b in ("hosted", "vllm", "fp8", "gw")] == [
        "gpt-4o",
        "llama",
        "llama-fp8",
        None,
    ]


def test_the_backends_a_rollout_may_reach_the_rollouts_own_first(config: Config) -> None:
    assert config.candidate_backends() == ("vllm", "fp8", "gw")
    assert (config.primary.name, config.candidate.name) == ("hosted", "vllm")


def test_a_backends_replicas_and_direct_calls(config: Config) -> None:
    vllm = config.backends["vllm"]
    assert vllm.api_base == "http://127.0.0.1:9/v1"
    assert vllm.direct_api_bases("bench") == ("http://127.0.0.1:9/v1", "http://127.0.0.2:9/v1")
    with pytest.raises(NotDirect) as caught:
        config.backends["gw"].direct_api_bases("doctor")
    assert str(caught.value) == (
        "backend 'gw' is type litellm: `kvmigrate doctor` calls backends over HTTP directly, "
        "and only `kvmigrate proxy` serves a litellm backend (its traffic is measured in the "
        "proxy's records: `kvmigrate report`)"
    )


def test_a_backend_shows_every_field_but_its_litellm_params(config: Config) -> None:
    gw, fp8 = config.backends["gw"], config.backends["fp8"]
    shown = repr(gw)
    assert shown.startswith("BackendConfig(name='gw', api_bases=(), api_key=None, ")
    assert shown.endswith(", candidate_headers=())")
    assert "litellm_params" not in shown
    assert "sk-gw-secret" not in shown
    assert "type='litellm'" in shown
    assert "sk-fp8-secret" not in repr(fp8)
    assert repr(fp8).startswith(
        "BackendConfig(name='fp8', api_bases=('http://127.0.0.1:9/v1',), api_key="
    )
    # hashable, and equal configs hash equal; a field's change changes the hash
    again = parse_config(CONFIG, env={"FP8_KEY": "sk-fp8-secret", "GW_KEY": "sk-other"}).backends
    assert hash(gw) == hash(again["gw"])
    assert hash(config.backends["vllm"]) == hash(again["vllm"])
    assert hash(config.backends["vllm"]) != hash(config.backends["hosted"])
    assert len({config.backends[n] for n in ("hosted", "vllm", "fp8")}) == 3
