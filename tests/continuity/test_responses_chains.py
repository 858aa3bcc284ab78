"""Responses API chains through the proxy (issue 17): a `previous_response_id` chain is one
conversation, on the backend that stored it, with its turns counted; a shadow copy continues
the candidate's own chain. Real proxies, real emulators (each with its own response store,
which answers 404 for an id it never issued), real SQLite and redis-server, the official
openai SDK.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import openai
import pytest
from settling import wait_settled

from kvmigrate.config import Config
from kvmigrate.emulator import EmulatorSettings, build_app
from kvmigrate.recorder.evidence import open_controller
from kvmigrate.recorder.store import open_store as open_record_store
from kvmigrate.report.build import build_report
from kvmigrate.runtime import build_app as build_runtime_app
from kvmigrate.serving import BackgroundServer

MODEL = "gpt-4o-mini"
ConfigFor = Callable[..., Config]  # tests/continuity/conftest.py's config_for
CHAINS = 8
TURNS = 4
INSTRUCTIONS = "You are a concise travel assistant."


def start(config: Config) -> BackgroundServer:
    return BackgroundServer(lambda: build_runtime_app(config, poll_interval=0.1)).start()


def client_for(proxy: BackgroundServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.url + "/v1", api_key="sk-client", max_retries=0)


def ask(client: openai.OpenAI, text: str, previous: str | None, stream: bool) -> str:
    """One turn; the id of its answer, as an agent reads it."""
    extra: dict[str, Any] = {"previous_response_id": previous} if previous else {}
    if not stream:
        answer = client.responses.create(
            model=MODEL, instructions=INSTRUCTIONS, input=text, max_output_tokens=64, **extra
        )
        assert answer.output_text
        return answer.id
    events = client.responses.create(
        model=MODEL,
        instructions=INSTRUCTIONS,
        input=text,
        max_output_tokens=64,
        stream=True,
        **extra,
    )
    done = [e for e in events if e.type in ("response.completed", "response.incomplete")]
    assert len(done) == 1
    return done[0].response.id


def run_chains(clients: list[openai.OpenAI], stream: bool) -> None:
    """CHAINS agents, TURNS turns each, every turn naming the previous answer; the turns of
    one chain go to the clients in turn (two proxies: alternate proxies)."""
    for number in range(CHAINS):
        previous = None
        for turn in range(1, TURNS + 1):
            client = clients[(number + turn) % len(clients)]
            previous = ask(client, f"Chain {number}: what about step {turn}?", previous, stream)


Row = tuple[str, int, str, str, int, int | None, str | None]


def record_rows(config: Config) -> list[Row]:
    store = open_record_store(config.record.db)
    try:
        rows = store.query(
            "SELECT conversation, turn, backend, role, status, cached_tokens, identity "
            "FROM records WHERE route = 'responses'",
            (),
        )
    finally:
        store.close()
    return [(str(r[0]), int(r[1]), str(r[2]), str(r[3]), int(r[4] or 0), r[5], r[6]) for r in rows]


def by_conversation(rows: list[Row], role: str) -> dict[str, list[Row]]:
    grouped: dict[str, list[Row]] = defaultdict(list)
    for row in rows:
        if row[3] == role:
            grouped[row[0]].append(row)
    return {key: sorted(value, key=lambda r: r[1]) for key, value in grouped.items()}


def assert_whole_chains(rows: list[Row]) -> dict[str, list[Row]]:
    """Every chain: turns 1..TURNS, all answered, all by one backend."""
    served = by_conversation(rows, "serve")
    assert len(served) == CHAINS
    for conversation, turns in served.items():
        assert [r[1] for r in turns] == list(range(1, TURNS + 1)), conversation
        assert {r[4] for r in turns} == {200}
        assert len({r[2] for r in turns}) == 1, f"chain {conversation} split: {turns}"
        assert [r[6] for r in turns[1:]] == ["chain"] * (TURNS - 1)
    return served


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_shadow_mode_shadows_each_chain_on_the_candidates_own_chain(
    config_for: ConfigFor, stream: bool
) -> None:
    config = config_for("mode: shadow")
    proxy = start(config)
    client = client_for(proxy)
    run_chains([client], stream)
    client.close()
    wait_settled(proxy.url)  # the last turn's copy may still be in flight
    proxy.stop()  # flushes the recorder

    rows = record_rows(config)
    served = assert_whole_chains(rows)
    assert {turns[0][2] for turns in served.values()} == {"hosted"}
    copies = by_conversation(rows, "shadow")
    assert copies.keys() == served.keys()
    for conversation, turns in copies.items():
        # The candidate 404s an id it never issued: 200s at turns 2-4 mean each copy named
        # the candidate's own answer of the turn before, which its prefix cache then reuses.
        assert [(r[1], r[2], r[4]) for r in turns] == [(t, "vllm", 200) for t in (1, 2, 3, 4)]
        cached = [r[5] or 0 for r in turns]
        assert cached == sorted(cached), conversation
        assert cached[-1] > cached[0], conversation
    store = open_record_store(config.record.db)
    report = build_report(store, since=0)
    store.close()
    # The report's by-turn tables count this traffic's turns: every chain at each of 1-4.
    cache_turns = [row.turn for row in report.cache_by_turn]
    assert cache_turns[:TURNS] == ["1", "2", "3", "4"], cache_turns
    if stream:  # TTFT exists for streamed answers only
        counts = [(r.turn, r.primary_n, r.candidate_n) for r in report.ttft_by_turn]
        assert counts[:TURNS] == [(str(t), CHAINS, CHAINS) for t in range(1, TURNS + 1)]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_split_keeps_every_chain_on_the_backend_that_stored_it(
    config_for: ConfigFor, stream: bool
) -> None:
    config = config_for("mode: split, percent: 50, shadow_sample: 0")
    proxy = start(config)
    client = client_for(proxy)
    run_chains([client], stream)
    client.close()
    proxy.stop()

    served = assert_whole_chains(record_rows(config))
    assert {turns[0][2] for turns in served.values()} == {"hosted", "vllm"}  # it did split
    store = open_record_store(config.record.db)
    report = build_report(store, since=0)
    store.close()
    assert report.identity.split == 0


def test_a_rollback_mid_chain_moves_new_chains_but_not_the_candidates_chains(
    config_for: ConfigFor,
) -> None:
    """A chain stored on the candidate cannot move: after a rollback to 0% its next turns
    still go there (the primary would answer 404), while new chains go to the primary."""
    config = config_for("mode: split, percent: 50, shadow_sample: 0")
    proxy = start(config)
    client = client_for(proxy)
    chains = {n: ask(client, f"Chain {n}: first step?", None, False) for n in range(CHAINS)}
    controller = open_controller(config)
    controller.rollback(reason="test")
    controller.store.close()
    deadline = time.monotonic() + 10
    while (
        _metric(proxy, "kvmigrate_rollout_percent") != 0
        or _metric(proxy, "kvmigrate_rollout_version") < 1
    ):
        assert time.monotonic() < deadline, "the proxy did not pick up the rollback"
        time.sleep(0.05)
    for number, previous in chains.items():
        for turn in (2, 3):
            previous = ask(client, f"Chain {number}: step {turn}?", previous, False)
    ask(client, "A new chain after the rollback", None, False)
    client.close()
    proxy.stop()

    rows = record_rows(config)
    served = by_conversation(rows, "serve")
    old = {key: turns for key, turns in served.items() if len(turns) == 3}
    assert len(old) == CHAINS
    for conversation, turns in old.items():
        assert len({r[2] for r in turns}) == 1, (conversation, turns)
    assert {turns[0][2] for turns in old.values()} == {"hosted", "vllm"}
    new = [turns for turns in served.values() if len(turns) == 1]
    assert [turns[0][2] for turns in new] == ["hosted"]


@pytest.mark.slow
def test_two_proxies_sharing_redis_continue_each_others_chains(
    config_for: ConfigFor, fresh_redis_url: str
) -> None:
    config = config_for("mode: split, percent: 50", state=fresh_redis_url)
    proxies = [start(config), start(config)]
    clients = [client_for(p) for p in proxies]
    run_chains(clients, stream=True)
    misses = sum(_metric(p, "kvmigrate_chain_misses_total") for p in proxies)
    for client in clients:
        client.close()
    for proxy in proxies:
        proxy.stop()
    served = assert_whole_chains(record_rows(config))
    assert {turns[0][2] for turns in served.values()} == {"hosted", "vllm"}
    assert misses == 0


@pytest.mark.slow
def test_two_proxies_sharing_redis_shadow_each_others_chains(
    config_for: ConfigFor, fresh_redis_url: str
) -> None:
    """In shadow mode a turn's copy may go out from the other proxy than the turn before:
    it still continues the candidate's own chain, with the id the first proxy stored."""
    config = config_for("mode: shadow", state=fresh_redis_url)
    proxies = [start(config), start(config)]
    clients = [client_for(p) for p in proxies]
    run_chains(clients, stream=False)
    for proxy in proxies:
        # A copy may wait for the other proxy's previous copy, so it can outlive its answer.
        wait_settled(proxy.url)
    skipped = sum(
        _metric(p, "kvmigrate_shadow_dropped_total", 'reason="no_candidate_chain"') for p in proxies
    )
    for client in clients:
        client.close()
    for proxy in proxies:
        proxy.stop()
    rows = record_rows(config)
    assert_whole_chains(rows)
    copies = by_conversation(rows, "shadow")
    assert len(copies) == CHAINS
    for conversation, turns in copies.items():
        assert [(r[1], r[4]) for r in turns] == [(t, 200) for t in (1, 2, 3, 4)], conversation
    assert skipped == 0


@pytest.mark.slow
def test_a_chain_no_proxy_remembers_goes_to_the_primary_and_is_counted(
    config_for: ConfigFor, responses_emulators: tuple[BackgroundServer, BackgroundServer]
) -> None:
    """A chain begun at the hosted API before the proxy existed: its next turn is a miss,
    answered by the primary. The candidate never saw the chain: its copy goes with the
    chain's context read back from the primary (re-seeded), and the next turn's copy
    continues the candidate's own chain from there."""
    hosted, _vllm = responses_emulators
    direct = openai.OpenAI(base_url=hosted.url + "/v1", api_key="sk", max_retries=0)
    first = direct.responses.create(model=MODEL, input="Plan a day in Rome.")
    direct.close()
    config = config_for("mode: shadow")
    proxy = start(config)
    client = client_for(proxy)
    answer = client.responses.with_raw_response.create(
        model=MODEL, input="And the evening?", previous_response_id=first.id
    )
    assert answer.headers["x-kvmigrate-backend"] == "hosted"
    assert answer.parse().output_text
    # Its answer is known now: the chain continues as a chain.
    client.responses.create(model=MODEL, input="And then?", previous_response_id=answer.parse().id)
    misses = _metric(proxy, "kvmigrate_chain_misses_total")
    wait_settled(proxy.url)
    skipped = _metric(proxy, "kvmigrate_shadow_dropped_total", 'reason="no_candidate_chain"')
    reseeded = _metric(proxy, "kvmigrate_shadow_reseeded_total")
    sources = _identity_sources(proxy)
    client.close()
    proxy.stop()
    assert misses == 1
    assert (skipped, reseeded) == (0, 1)
    assert (sources["guess"], sources["chain"]) == (1, 1)  # the miss, then the chain
    copies = [(r[1], r[2], r[4]) for r in record_rows(config) if r[3] == "shadow"]
    assert sorted(copies) == [(2, "vllm", 200), (3, "vllm", 200)]


@pytest.mark.slow
def test_every_turn_of_a_chain_is_counted_by_how_it_was_identified(
    config_for: ConfigFor,
) -> None:
    """kvmigrate_conversation_identity_total{source="chain"} counts the turns that continue
    a stored response; the first turn is an opening."""
    proxy = start(config_for("mode: shadow, shadow_sample: 0"))
    client = client_for(proxy)
    previous = None
    for turn in range(3):
        previous = ask(client, f"Turn {turn}.", previous, stream=False)
    sources = _identity_sources(proxy)
    client.close()
    proxy.stop()
    assert {s: n for s, n in sources.items() if n} == {"opening": 1, "chain": 2}


def _identity_sources(proxy: BackgroundServer) -> dict[str, float]:
    sources = ("header", "user", "continuity", "opening", "guess", "body", "chain")
    return {
        s: _metric(proxy, "kvmigrate_conversation_identity_total", f'source="{s}"') for s in sources
    }


def test_a_chain_whose_backend_is_down_gets_a_clear_error_not_another_backend(
    config_for: ConfigFor,
) -> None:
    vllm = BackgroundServer(lambda: build_app(EmulatorSettings("vllm", time_scale=0))).start()
    config = config_for("mode: split, percent: 100", vllm_url=vllm.url)
    proxy = start(config)
    client = client_for(proxy)
    first = client.responses.with_raw_response.create(model=MODEL, input="Plan a day in Rome.")
    assert first.headers["x-kvmigrate-backend"] == "vllm"
    # Retrieving it goes where it is stored, not to the primary (which would 404).
    stored = client.responses.with_raw_response.retrieve(first.parse().id)
    assert stored.headers["x-kvmigrate-backend"] == "vllm"
    assert stored.parse().output_text == first.parse().output_text
    vllm.stop()
    with pytest.raises(openai.APIStatusError) as caught:
        client.responses.create(
            model=MODEL, input="And the evening?", previous_response_id=first.parse().id
        )
    client.close()
    proxy.stop()
    assert caught.value.status_code == 502
    assert "continues a response stored on `vllm`" in caught.value.message
    rows = record_rows(config)
    assert [(r[1], r[2]) for r in rows if r[3] == "serve"] == [(1, "vllm"), (2, "vllm")]


def _metric(proxy: BackgroundServer, name: str, labels: str = "") -> float:
    import urllib.request

    text = urllib.request.urlopen(proxy.url + "/metrics", timeout=5).read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and labels in line and not line.startswith("#"):
            total += float(line.rpartition(" ")[2])
    return total


def test_a_conversations_api_conversation_is_one_conversation_on_the_primary(
    config_for: ConfigFor,
) -> None:
    """Conversations live where `POST /v1/conversations` created them: the primary (a
    pass-through route). Its turns stay there even at 100%, counted as turns of one key."""
    config = config_for("mode: split, percent: 100")
    proxy = start(config)
    client = client_for(proxy)
    for turn in (1, 2, 3):
        answer = client.responses.with_raw_response.create(
            model=MODEL, input=f"Step {turn}?", conversation="conv_trip"
        )
        assert answer.headers["x-kvmigrate-backend"] == "hosted"
    client.close()
    proxy.stop()
    served = by_conversation(record_rows(config), "serve")
    assert [(r[1], r[2], r[4]) for r in served["conv:conv_trip"]] == [
        (1, "hosted", 200),
        (2, "hosted", 200),
        (3, "hosted", 200),
    ]


def test_a_forged_response_id_cannot_forge_log_lines(
    config_for: ConfigFor, caplog: pytest.LogCaptureFixture
) -> None:
    """The first miss is logged with the client's id: escaped and cut, it cannot start a
    line of its own, carry a terminal escape, or fill the log."""
    forged = (
        "resp_zz\n2026-12-05 02:40:00,000 CRITICAL kvmigrate.proxy: FORGED\x1b[31m" + "x" * 5000
    )
    proxy = start(config_for("mode: shadow"))
    client = client_for(proxy)
    # The primary never stored it either: an error answer, and one miss logged.
    with (
        caplog.at_level(logging.WARNING, logger="kvmigrate.identity"),
        pytest.raises(openai.APIStatusError),
    ):
        client.responses.create(model=MODEL, input="Go on.", previous_response_id=forged)
    client.close()
    proxy.stop()
    [warning] = [r.getMessage() for r in caplog.records if "no proxy remembers" in r.getMessage()]
    assert "\n" not in warning
    assert "\x1b" not in warning
    assert "resp_zz\\n2026-12-05" in warning
    assert len(warning) < 600
