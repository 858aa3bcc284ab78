"""Probes of cohort selection by client key: several cohorts may share one key (a partner's
key used on two models, or one key narrowed further by a header), and each must still be
reachable. The key itself never shows in what the resolver exposes."""

from __future__ import annotations

import pytest
from multidict import CIMultiDict, CIMultiDictProxy

from kvmigrate.config import Config, parse_config
from kvmigrate.proxy.cohorts import CohortResolver

CONFIG = """
backends:
  hosted: {api_base: "http://127.0.0.1:9/v1"}
  vllm: {api_base: "http://127.0.0.1:9/v1"}
models:
  - {model_name: mini, hosted: m, vllm: m}
  - {model_name: big, hosted: b, vllm: b}
cohorts:
  - {name: partner-mini, model: mini, match: {client_key: os.environ/PARTNER_KEY}}
  - name: partner-big-coder
    model: big
    match: {client_key: os.environ/PARTNER_KEY, header: {X-Agent: coder}}
  - {name: partner-big, model: big, match: {client_key: os.environ/PARTNER_KEY}}
  - {name: other-big, model: big, match: {client_key: os.environ/OTHER_KEY}}
"""


def config() -> Config:
    return parse_config(CONFIG, env={"PARTNER_KEY": "sk-partner", "OTHER_KEY": "sk-other"})


def headers(**values: str) -> CIMultiDictProxy[str]:
    return CIMultiDictProxy(CIMultiDict({k.replace("_", "-"): v for k, v in values.items()}))


@pytest.mark.parametrize(
    ("model", "hdrs", "cohort"),
    [
        ("mini", {"Authorization": "Bearer sk-partner"}, "partner-mini"),
        ("big", {"Authorization": "Bearer sk-partner"}, "partner-big"),  # same key, other model
        ("big", {"Authorization": "Bearer sk-partner", "X_Agent": "coder"}, "partner-big-coder"),
        ("big", {"x_api_key": "sk-partner"}, "partner-big"),  # Anthropic SDKs' header
        ("big", {"Authorization": "Bearer sk-other"}, "other-big"),
        ("big", {"Authorization": "Bearer sk-nobody"}, "big"),
        ("mini", {"Authorization": "Bearer sk-other"}, "mini"),  # another model's key cohort
        ("big", {}, "big"),
    ],
)
def test_cohorts_that_share_a_client_key_are_each_reachable(
    model: str, hdrs: dict[str, str], cohort: str
) -> None:
    assert CohortResolver(config()).resolve(model, headers(**hdrs), {}) == cohort


def test_the_resolvers_labels_never_carry_a_key() -> None:
    table = CohortResolver(config()).table
    labels = {s.key_label for selectors in table.selectors.values() for s in selectors}
    assert not any("sk-" in str(label) for label in labels)
    assert "sk-partner" not in repr(table)
