"""Cohort resolution (policies.cohorts) as a table, and the `cohorts:` config section."""

from __future__ import annotations

from types import MappingProxyType

import pytest
from multidict import CIMultiDict, CIMultiDictProxy

from kvmigrate.config import Config, ConfigError, parse_config
from kvmigrate.policies.cohorts import CohortTable, Selector, resolve_cohort
from kvmigrate.proxy.cohorts import CohortResolver

TABLE = CohortTable(
    MappingProxyType(
        {
            "mini": (
                Selector("billing", headers=(("X-Agent", "billing-bot"),)),
                Selector("eu-coder", metadata=(("team", "coder"), ("region", "eu"))),
                Selector("coder", metadata=(("team", "coder"),)),
                Selector("partner", key_label="partner"),
                Selector("partner-chat", headers=(("X-Agent", "chat"),), key_label="partner2"),
            )
        }
    )
)


def headers(**values: str) -> CIMultiDictProxy[str]:
    return CIMultiDictProxy(CIMultiDict({k.replace("_", "-"): v for k, v in values.items()}))


@pytest.mark.parametrize(
    ("model", "hdrs", "metadata", "label", "cohort"),
    [
        ("mini", {}, None, None, "mini"),  # no selector matches: the model's own cohort
        ("big", {"X_Agent": "billing-bot"}, None, None, "big"),  # a model without cohorts
        ("mini", {"X_Agent": "billing-bot"}, None, None, "billing"),
        ("mini", {"x_agent": "billing-bot"}, None, None, "billing"),  # names: any case
        ("mini", {"X_Agent": "Billing-Bot"}, None, None, "mini"),  # values: exact
        ("mini", {}, {"team": "coder"}, None, "coder"),
        ("mini", {}, {"team": "coder", "region": "eu"}, None, "eu-coder"),  # order: first wins
        ("mini", {}, {"team": "coder", "region": "us"}, None, "coder"),
        ("mini", {}, ["team", "coder"], None, "mini"),  # metadata that is no mapping
        ("mini", {}, "coder", None, "mini"),
        ("mini", {}, None, "partner", "partner"),
        ("mini", {}, None, "stranger", "mini"),
        ("mini", {"X_Agent": "chat"}, None, "partner2", "partner-chat"),  # all parts must hold
        ("mini", {"X_Agent": "chat"}, None, None, "mini"),
        ("mini", {"X_Agent": "billing-bot"}, {"team": "coder"}, "partner", "billing"),
    ],
)
def test_every_request_resolves_to_exactly_one_cohort(
    model: str, hdrs: dict[str, str], metadata: object, label: str | None, cohort: str
) -> None:
    assert resolve_cohort(TABLE, model, headers(**hdrs), metadata, label) == cohort


CONFIG = """
backends:
  hosted: {{api_base: "http://127.0.0.1:9/v1"}}
  vllm: {{api_base: "http://127.0.0.1:9/v1"}}
models:
  - {{model_name: mini, hosted: m, vllm: m}}
  - {{model_name: big, hosted: b, vllm: b}}
{cohorts}
"""


def load(cohorts: str, env: dict[str, str] | None = None) -> Config:
    return parse_config(CONFIG.format(cohorts=cohorts), env=env or {})


def test_a_config_without_cohorts_has_one_cohort_per_model() -> None:
    config = load("")
    assert config.cohorts == ()
    assert config.cohort_names() == ("mini", "big")


def test_named_cohorts_come_before_their_models_remainder() -> None:
    config = load(
        """cohorts:
  - name: billing
    model: mini
    match: {header: {X-Agent: billing-bot}}
    steps: [5, 100]
    bake_seconds: 30
  - name: partner
    model: big
    match: {client_key: os.environ/PARTNER_KEY, metadata: {team: p}}
""",
        {"PARTNER_KEY": "sk-partner"},
    )
    assert config.cohort_names() == ("billing", "mini", "partner", "big")
    assert config.steps_of("billing") == (5.0, 100.0)
    assert config.steps_of("mini") == config.rollout.steps
    assert "sk-partner" not in repr(config)  # the key is a Secret, never shown


@pytest.mark.parametrize(
    ("cohorts", "where", "why"),
    [
        ("cohorts: {a: 1}", "cohorts", "expected a list"),
        ("cohorts: [{name: x, model: nope, match: {header: {A: b}}}]", "cohorts[0].model", "known"),
        (
            "cohorts: [{name: mini, model: big, match: {header: {A: b}}}]",
            "cohorts[0].name",
            "already",
        ),
        ("cohorts: [{name: x, model: big}]", "cohorts[0].match", "at least one"),
        (
            "cohorts: [{name: x, model: big, match: {heder: {A: b}}}]",
            "cohorts[0].match.heder",
            "unknown",
        ),
        (
            "cohorts: [{name: x, model: big, match: {header: {A: b}}, step: [1]}]",
            "cohorts[0].step",
            "unknown",
        ),
        (
            "cohorts: [{name: x, model: big, match: {header: {A: b}}}, "
            "{name: x, model: mini, match: {header: {A: c}}}]",
            "cohorts[1].name",
            "already",
        ),
    ],
)
def test_bad_cohorts_are_refused_with_their_key_path(cohorts: str, where: str, why: str) -> None:
    with pytest.raises(ConfigError) as refused:
        load(cohorts)
    assert where in str(refused.value)
    assert why in str(refused.value)


def test_the_proxy_labels_a_client_key_by_its_cohort_never_by_the_key() -> None:
    config = load(
        """cohorts:
  - {name: partner, model: big, match: {client_key: os.environ/PARTNER_KEY}}
""",
        {"PARTNER_KEY": "sk-partner"},
    )
    resolver = CohortResolver(config)
    assert resolver.resolve("big", headers(Authorization="Bearer sk-partner"), {}) == "partner"
    assert resolver.resolve("big", headers(Authorization="Bearer sk-other"), {}) == "big"
    assert resolver.resolve("big", headers(), {}) == "big"
    assert resolver.resolve("mini", headers(Authorization="Bearer sk-partner"), {}) == "mini"


def test_a_model_no_candidate_serves_has_no_cohort() -> None:
    config = parse_config(
        """
backends:
  hosted: {api_base: "http://127.0.0.1:9/v1"}
  vllm: {api_base: "http://127.0.0.1:9/v1"}
models:
  - {model_name: chat, hosted: c, vllm: c}
  - {model_name: embed, hosted: e}
""",
        env={},
    )
    assert config.cohort_names() == ("chat",)


def test_only_a_model_with_a_key_selector_needs_the_clients_key_label() -> None:
    assert TABLE.needs_key("mini")
    assert not TABLE.needs_key("big")  # no cohorts of its own
    plain = CohortTable(MappingProxyType({"mini": (Selector("coder", metadata=(("t", "c"),)),)}))
    assert not plain.needs_key("mini")
