"""Property tests for every exact match that decides who gets in and where a request goes:
client keys, cohort selectors, conversation identity, response and conversation ids, and
the workers' shared link table.

Each generator makes near-misses of a value: a shared prefix (the value cut short or
extended), a case variant, a Unicode look-alike (Cyrillic or Greek letters, a non-breaking
or zero-width space), and surrounding whitespace. A near-miss must never match what it
resembles; the value itself always must. Prefix, substring, case-folded or normalised
matching would each fail here on the first few examples.
"""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from multidict import CIMultiDict, CIMultiDictProxy

from kvmigrate.config import Secret, parse_config
from kvmigrate.continuity.link_table import LinkTable, create_table
from kvmigrate.policies.chain import chain_ref, id_key
from kvmigrate.policies.cohorts import CohortTable, Selector, resolve_cohort
from kvmigrate.policies.conversation import declared_key, derived_key, is_derived_key
from kvmigrate.proxy.cohorts import CohortResolver

LOOK_ALIKES = {
    "a": "\u0430",  # Cyrillic a
    "e": "\u0435",
    "o": "\u043e",
    "p": "\u0440",
    "c": "\u0441",
    "x": "\u0445",
    "i": "\u0456",
    "s": "\u0455",
    "k": "\u03ba",  # Greek kappa
    "-": "\u2010",  # hyphen
    "_": "\uff3f",  # fullwidth low line
    "0": "O",
    "1": "l",
}

# Values as clients send them: API keys, header values, ids.
VALUES = st.text(
    alphabet=st.sampled_from("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_"),
    min_size=1,
    max_size=48,
)


@st.composite
def near_miss(draw: st.DrawFn, value: str) -> str:
    """A string that resembles `value` and is not it."""
    kind = draw(st.sampled_from(["shorter", "longer", "case", "look-alike", "space", "inner"]))
    at = draw(st.integers(0, len(value) - 1))
    if kind == "shorter":
        variant = value[: draw(st.integers(0, len(value) - 1))]
    elif kind == "longer":
        variant = value + draw(st.text(min_size=1, max_size=4))
    elif kind == "case":
        variant = value[:at] + value[at].swapcase() + value[at + 1 :]
    elif kind == "look-alike":
        variant = value[:at] + LOOK_ALIKES.get(value[at], "\u200b" + value[at]) + value[at + 1 :]
    elif kind == "space":
        variant = draw(st.sampled_from([" ", "\t", "\u00a0", "\u200b"])) + value
    else:
        variant = value[:at] + draw(st.sampled_from(["\u200b", "\u00ad", " "])) + value[at:]
    assume(variant != value)
    return variant


@st.composite
def value_and_near_miss(draw: st.DrawFn) -> tuple[str, str]:
    value = draw(VALUES)
    return value, draw(near_miss(value))


# --- client keys ----------------------------------------------------------------------------


@given(value_and_near_miss())
def test_a_key_matches_itself_and_no_near_miss(pair: tuple[str, str]) -> None:
    key, other = pair
    assert Secret(key).matches(key)
    assert not Secret(key).matches(other)
    assert not Secret(other).matches(key)


@given(VALUES, st.text(alphabet=st.characters(), max_size=8))
def test_a_key_never_matches_with_a_lone_surrogate_or_any_other_character_added(
    key: str, extra: str
) -> None:
    assume(extra)
    assert not Secret(key).matches(key + extra)
    assert not Secret(key).matches(extra + key)


def _cohort_config(billing_key: str, support_key: str) -> str:
    return f"""
backends:
  hosted: {{api_base: "http://127.0.0.1:9/v1"}}
  vllm: {{api_base: "http://127.0.0.1:9/v1"}}
models:
  - {{model_name: m, hosted: m, vllm: m}}
cohorts:
  - {{name: billing, model: m, match: {{client_key: "{billing_key}"}}}}
  - {{name: support, model: m, match: {{client_key: "{support_key}"}}}}
"""


@settings(max_examples=60)
@given(value_and_near_miss(), st.sampled_from(["authorization", "api-key", "x-api-key"]))
def test_a_cohort_keyed_by_client_key_takes_that_key_only(
    pair: tuple[str, str], header: str
) -> None:
    key, other = pair
    assume(other.isprintable() and other.strip() == other and "\u200b" not in other)
    config = parse_config(_cohort_config(key, "support-" + key), env={})
    resolver = CohortResolver(config)

    def cohort_of(token: str) -> str:
        value = f"Bearer {token}" if header == "authorization" else token
        headers = CIMultiDictProxy(CIMultiDict({header: value}))
        return resolver.resolve("m", headers, {})

    assert cohort_of(key) == "billing"
    assert cohort_of("support-" + key) == "support"
    assert cohort_of(other) == "m"


# --- cohort selectors -----------------------------------------------------------------------


@given(value_and_near_miss(), value_and_near_miss())
def test_a_selector_takes_exact_header_and_metadata_values(
    header: tuple[str, str], metadata: tuple[str, str]
) -> None:
    (want_header, near_header), (want_meta, near_meta) = header, metadata
    table = CohortTable(
        {"m": (Selector("team", (("x-agent", want_header),), (("team", want_meta),)),)}
    )

    def cohort(agent: str, team: str) -> str:
        headers = CIMultiDictProxy(CIMultiDict({"X-Agent": agent}))
        return resolve_cohort(table, "m", headers, {"team": team})

    assert cohort(want_header, want_meta) == "team"
    assert cohort(near_header, want_meta) == "m"
    assert cohort(want_header, near_meta) == "m"


@given(value_and_near_miss())
def test_a_selector_takes_the_exact_key_label(pair: tuple[str, str]) -> None:
    label, other = pair
    table = CohortTable({"m": (Selector("keyed", key_label=label),)})
    headers = CIMultiDictProxy(CIMultiDict())
    assert resolve_cohort(table, "m", headers, None, key_label=label) == "keyed"
    assert resolve_cohort(table, "m", headers, None, key_label=other) == "m"
    assert resolve_cohort(table, "m", headers, None, key_label=None) == "m"


# --- conversation identity ------------------------------------------------------------------


@given(value_and_near_miss())
def test_session_ids_that_differ_name_different_conversations(pair: tuple[str, str]) -> None:
    session, other = pair
    assume(other)  # an empty header declares nothing

    def key(value: str) -> str | None:
        found = declared_key(CIMultiDictProxy(CIMultiDict({"X-Session-ID": value})), {})
        return None if found is None else found.value

    assert key(session) == key(session) is not None
    assert key(session) != key(other)


@given(value_and_near_miss())
def test_users_that_differ_name_different_conversations(pair: tuple[str, str]) -> None:
    user, other = pair
    assume(other)
    empty = CIMultiDictProxy(CIMultiDict())
    mine = declared_key(empty, {"user": user})
    theirs = declared_key(empty, {"user": other})
    assert mine is not None
    assert theirs is not None
    assert mine.value != theirs.value


LETTERS = st.text(alphabet=st.sampled_from("abcdefghijklmnopqrstuvwxyz ,."), min_size=2)


@given(LETTERS, st.data())
def test_openings_that_differ_in_a_letter_are_different_conversations(
    system: str, data: st.DataObject
) -> None:
    """The opening is masked (digits, dates and ids vary per turn and do not count), so the
    near-misses here change letters, which the mask keeps."""
    assume(any(c.isalpha() for c in system))
    at = data.draw(st.sampled_from([i for i, c in enumerate(system) if c.isalpha()]))
    variant = data.draw(
        st.sampled_from(
            [
                system[:at] + system[at].upper() + system[at + 1 :],
                system[:at] + LOOK_ALIKES.get(system[at], "\u0430") + system[at + 1 :],
                system[:at] + system[at + 1 :],
            ]
        )
    )
    assume(variant != system)

    def key(opening: str) -> str:
        body = {
            "messages": [{"role": "system", "content": opening}, {"role": "user", "content": "hi"}]
        }
        found = derived_key(body, "m")
        assert is_derived_key(found.value)
        return found.value

    assert key(system) == key(system)
    assert key(system) != key(variant)


@given(st.text(alphabet="0123456789abcdef", min_size=24, max_size=24), st.data())
def test_only_the_exact_derived_shape_is_a_derived_key(digits: str, data: st.DataObject) -> None:
    key = "h:" + digits
    assert is_derived_key(key)
    at = data.draw(st.integers(0, 23))
    variant = data.draw(
        st.sampled_from(
            [
                "H:" + digits,
                key[:-1],
                key + "0",
                "h:" + digits[:at] + "g" + digits[at + 1 :],
                "h:" + digits[:at] + digits[at].upper() + digits[at + 1 :],
                "h:" + digits[:at] + " " + digits[at + 1 :],
            ]
        )
    )
    assume(variant != key)
    assert not is_derived_key(variant)


# --- response and conversation ids ----------------------------------------------------------


@given(value_and_near_miss(), st.sampled_from(["resp:", "conv:"]))
def test_ids_that_differ_have_different_keys(pair: tuple[str, str], prefix: str) -> None:
    value, other = pair
    assume(other)
    assert id_key(prefix, value) == id_key(prefix, value)
    assert id_key(prefix, value) != id_key(prefix, other)


@given(value_and_near_miss())
def test_a_continued_response_is_looked_up_by_its_exact_id(pair: tuple[str, str]) -> None:
    value, other = pair
    assume(other)
    mine = chain_ref({"previous_response_id": value})
    theirs = chain_ref({"previous_response_id": other})
    assert mine is not None
    assert theirs is not None
    assert mine.key != theirs.key
    by_conversation = chain_ref({"conversation": value})
    assert by_conversation is not None
    assert by_conversation.key != mine.key


# --- the workers' shared link table ---------------------------------------------------------


@settings(max_examples=80, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    value_and_near_miss(),
    st.text(alphabet="0123456789abcdef", min_size=24, max_size=24),
    st.integers(0, 2**32 - 1),
)
def test_a_link_is_found_by_its_exact_key_only(
    tmp_path: Path, pair: tuple[str, str], digits: str, turn: int
) -> None:
    key, other = pair
    table = LinkTable(create_table(str(tmp_path), buckets=64, shadow_id_buckets=64))
    assert table.put(key, "h:" + digits, turn, expires_at=4e9)
    assert table.get(key) == ("h:" + digits, turn)
    assert table.get(other) is None


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(alphabet="0123456789abcdefABCDEF \t", min_size=24, max_size=24))
def test_a_conversation_the_table_would_not_give_back_whole_goes_through_the_store(
    tmp_path: Path, digits: str
) -> None:
    """Only a derived key's exact shape is packed into a slot: any other conversation (upper
    case hex, spaces that bytes.fromhex skips) is refused, so the table never hands back a
    conversation that differs from the one written."""
    table = LinkTable(create_table(str(tmp_path), buckets=64, shadow_id_buckets=64))
    conversation = "h:" + digits
    stored = table.put("k", conversation, 1, expires_at=4e9)
    assert stored == is_derived_key(conversation)
    assert table.get("k") == ((conversation, 1) if stored else None)
