"""Selectors, keys and hashed ids match exactly; every path of a key lookup is tried; every
comparison of a secret is constant-time.

The wrong values the suite used differed from the first character, so a match by prefix,
by substring or without regard to case passed. Each row here is a near miss: the same value
one character shorter or longer, in another case, a part of it, or holding it.
"""

from __future__ import annotations

import ast
import hmac
from pathlib import Path
from typing import Any

import pytest
from multidict import CIMultiDict, CIMultiDictProxy

from kvmigrate.config import parse_config
from kvmigrate.proxy.cohorts import CohortResolver
from kvmigrate.recorder import build_recorder
from kvmigrate.rollout.keys import HASHED_PREFIX, StoreKeys, is_hashed, random_keys

ROOT = Path(__file__).resolve().parents[2]
BILLING_KEY = "sk-billing-Key-0123"
CONFIG = f"""
backends:
  hosted: {{api_base: "http://127.0.0.1:9/v1"}}
  vllm: {{api_base: "http://127.0.0.1:9/v1"}}
models:
  - {{model_name: m, hosted: m, vllm: m}}
cohorts:
  - {{name: by-header, model: m, match: {{header: {{X-Agent: billing-bot}}}}}}
  - {{name: by-metadata, model: m, match: {{metadata: {{team: billing}}}}}}
  - {{name: by-key, model: m, match: {{client_key: {BILLING_KEY}}}}}
"""


def near_misses(value: str) -> list[str]:
    return [
        value[:-1],
        value + "s",
        value[1:],
        "x" + value,
        value[: len(value) // 2],
        value.upper(),
        value[:-1] + value[-1].swapcase() if value[-1].isalpha() else value.upper(),
        value + " ",
    ]


@pytest.fixture(scope="module")
def resolver() -> CohortResolver:
    return CohortResolver(parse_config(CONFIG, env={}))


def cohort_of(
    resolver: CohortResolver, headers: dict[str, str], body: dict[str, Any] | None = None
) -> str:
    return resolver.resolve("m", CIMultiDictProxy(CIMultiDict(headers)), body or {})


def test_each_selector_matches_its_exact_value(resolver: CohortResolver) -> None:
    assert cohort_of(resolver, {"X-Agent": "billing-bot"}) == "by-header"
    assert cohort_of(resolver, {"x-agent": "billing-bot"}) == "by-header"  # names: any case
    assert cohort_of(resolver, {}, {"metadata": {"team": "billing"}}) == "by-metadata"
    assert cohort_of(resolver, {"Authorization": "Bearer " + BILLING_KEY}) == "by-key"
    assert cohort_of(resolver, {"x-api-key": BILLING_KEY}) == "by-key"
    assert cohort_of(resolver, {}) == "m"


@pytest.mark.parametrize("value", near_misses("billing-bot"))
def test_a_near_miss_of_a_header_selector_is_the_models_own_cohort(
    resolver: CohortResolver, value: str
) -> None:
    assert cohort_of(resolver, {"X-Agent": value}) == "m"


@pytest.mark.parametrize("value", [*near_misses("billing"), ["billing"], {"v": "billing"}])
def test_a_near_miss_of_a_metadata_selector_is_the_models_own_cohort(
    resolver: CohortResolver, value: object
) -> None:
    assert cohort_of(resolver, {}, {"metadata": {"team": value}}) == "m"


@pytest.mark.parametrize("value", [v for v in near_misses(BILLING_KEY) if v.strip() != BILLING_KEY])
def test_a_near_miss_of_a_client_key_selector_is_the_models_own_cohort(
    resolver: CohortResolver, value: str
) -> None:
    assert cohort_of(resolver, {"Authorization": "Bearer " + value}) == "m"
    assert resolver.key_label(CIMultiDictProxy(CIMultiDict({"x-api-key": value}))) is None


# --- hashed conversation ids --------------------------------------------------------------------

KEYS = StoreKeys("00" * 32)
HASHED = KEYS.key("m:alice@example.com")


def test_a_hashed_id_is_the_prefix_and_exactly_32_lower_case_hex_digits() -> None:
    assert is_hashed(HASHED)
    assert len(HASHED) == len(HASHED_PREFIX) + 32


@pytest.mark.parametrize(
    "near",
    [HASHED[:-1], HASHED + "0", HASHED.upper(), "K" + HASHED[1:], HASHED[:-1] + "g",
     HASHED[len(HASHED_PREFIX):] + "ab", "x" + HASHED[:-1], HASHED_PREFIX],
)  # fmt: skip
def test_a_near_miss_of_a_hashed_id_is_no_hash_and_is_hashed_whole(near: str) -> None:
    assert not is_hashed(near)
    assert KEYS.key(near) != near  # hashed, not kept as if it were one
    assert is_hashed(KEYS.key(near))


@pytest.mark.parametrize(
    "candidate",
    ["m:alice@example.co", "m:alice@example.comm", "m:ALICE@example.com", "alice@example.com",
     "m:alice", "M:alice@example.com"],
)  # fmt: skip
def test_a_hashed_conversation_is_recovered_by_its_exact_key_only(candidate: str) -> None:
    assert KEYS.recover(HASHED, [candidate]) == HASHED
    assert KEYS.recover(HASHED, [candidate, "m:alice@example.com"]) == "m:alice@example.com"
    assert KEYS.recover(HASHED[:-1] + "0", ["m:alice@example.com"]) != "m:alice@example.com"


# --- the records' hash key: each of its three sources -------------------------------------------


def _record_key(extra: str = "", keys: StoreKeys | None = None) -> bytes:
    config = parse_config(CONFIG + extra, env={"HASH_KEY": "records-secret"})
    recorder = build_recorder(config, keys, worker="thread")
    return bytes(recorder.hash_key)


def test_the_records_hash_key_comes_from_the_config_first() -> None:
    configured = "record: {db: 'sqlite:///:memory:', hash_key: os.environ/HASH_KEY}"
    assert _record_key(configured, KEYS) == b"records-secret"
    assert _record_key(configured) == b"records-secret"


def test_without_one_it_is_derived_from_the_stores_secret() -> None:
    key = _record_key("record: {db: 'sqlite:///:memory:'}", KEYS)
    expected = hmac.digest(b"00" * 32, b"kvmigrate records conversation key", "sha256")
    assert key == expected  # the same on every proxy of the store, after every restart
    assert key == _record_key("record: {db: 'sqlite:///:memory:'}", StoreKeys("00" * 32))
    assert key != _record_key("record: {db: 'sqlite:///:memory:'}", StoreKeys("01" * 32))


def test_without_a_store_each_recorder_draws_its_own() -> None:
    first = _record_key("record: {db: 'sqlite:///:memory:'}")
    second = _record_key("record: {db: 'sqlite:///:memory:'}")
    assert len(first) >= 32
    assert first != second
    assert first != KEYS.records_key()
    assert random_keys().key("a") != random_keys().key("a")


# --- constant-time comparison: a static check of every site that compares a secret --------------


def _compares_a_revealed_secret(tree: ast.AST) -> list[int]:
    """Lines where `==`, `!=`, `in` or `startswith` takes a `.reveal()` directly."""
    lines = []
    for node in ast.walk(tree):
        operands: list[ast.expr] = []
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("startswith", "endswith", "find", "count")
        ):
            operands = [node.func.value, *node.args]
        for operand in operands:
            for inner in ast.walk(operand):
                if (
                    isinstance(inner, ast.Call)
                    and isinstance(inner.func, ast.Attribute)
                    and inner.func.attr == "reveal"
                ):
                    lines.append(node.lineno)
    return lines


def test_no_code_compares_a_revealed_secret_with_an_operator() -> None:
    found = {}
    for path in sorted((ROOT / "kvmigrate").rglob("*.py")):
        if lines := _compares_a_revealed_secret(ast.parse(path.read_text())):
            found[str(path.relative_to(ROOT))] = lines
    assert found == {}


def _calls_compare_digest(function: ast.FunctionDef) -> bool:
    return any(
        isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr == "compare_digest"
        for n in ast.walk(function)
    ) and not any(isinstance(n, ast.Compare) and isinstance(n.ops[0], ast.Eq) and
                  any(isinstance(o, ast.Attribute) and o.attr == "_value" for o in
                      (n.left, *n.comparators)) for n in ast.walk(function))  # fmt: skip


@pytest.mark.parametrize(
    ("module", "function"),
    [
        ("kvmigrate/config/secret.py", "matches"),  # master, admin, metrics, cohort keys
        ("kvmigrate/config/secret.py", "__eq__"),  # cohorts sharing a key
        ("kvmigrate/migrate/ownership.py", "is_sealed"),  # a backup's seal
    ],
)
def test_each_secret_comparison_site_uses_compare_digest(module: str, function: str) -> None:
    tree = ast.parse((ROOT / module).read_text())
    defs = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == function]
    assert len(defs) == 1
    assert _calls_compare_digest(defs[0])


def test_compare_digest_is_the_one_that_decides(monkeypatch: pytest.MonkeyPatch) -> None:
    """By behaviour: the cohort key lookup asks `hmac.compare_digest`, whole key against
    whole token, and its answer is the one taken."""
    resolver = CohortResolver(parse_config(CONFIG, env={}))
    asked: list[tuple[bytes, bytes]] = []
    monkeypatch.setattr(hmac, "compare_digest", lambda a, b: asked.append((a, b)) or True)
    headers = CIMultiDictProxy(CIMultiDict({"Authorization": "Bearer not-it"}))
    assert resolver.key_label(headers) == "by-key"  # the (patched) comparison said yes
    assert asked == [(BILLING_KEY.encode(), b"not-it")]
