"""The report over mixed traffic: OpenAI chat through a real proxy, and Anthropic Messages
exchanges recorded as the proxy hands them to the recorder (streamed SSE bytes in their
wire framing). TTFT and cache hit by turn count both APIs, with Anthropic's cache reads as
cached tokens and its cache writes priced apart in the cost projection."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import messages_wire as mw
import pytest
from recording_bed import recorded_config

from kvmigrate.config import load_config
from kvmigrate.exchange import Exchange, Role
from kvmigrate.recorder import RecorderAddon, open_store
from kvmigrate.report import RENDERERS, Prices, build_report
from kvmigrate.report.cost import project_cost
from kvmigrate.report.rows import Row

CONFIG = """
backends:
  hosted: {{api_base: "{hosted}/v1"}}
  vllm: {{api_base: "{vllm}/v1"}}
models:
  - {{model_name: gpt-4o-mini, hosted: gpt-4o-mini, vllm: meta-llama/Llama-3.1-8B-Instruct}}
rollout: {{mode: shadow, noise_sample: 0}}
record: {{db: "sqlite:///{db}", content: redacted}}
cachecheck: {{enabled: false}}
"""
TURNS, CHATS, AGENTS = 3, 2, 2
STAMPED = 1  # this agent stamps the time in its system prompt: a cache buster
SYSTEM = "You are a coding agent. " * 80
# (plain input, cache reads, cache writes) by turn, as Anthropic reports a 480-token cached
# system prompt: written on the first turn, read on the later ones.
HOSTED_USAGE = {1: (20, 0, 480), 2: (40, 480, 0), 3: (60, 480, 0)}
VLLM_USAGE = {1: (500, 0, 0), 2: (64, 456, 0), 3: (84, 456, 0)}
TTFT_MS = {"hosted": 400.0, "vllm": 100.0}


def _chat(client: Any) -> None:
    for conv in range(CHATS):
        messages = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"Task {conv}: fix the parser"},
        ]
        for _ in range(TURNS):
            stream = client.chat.completions.create(
                model="gpt-4o-mini", messages=messages, max_tokens=8, stream=True,
                stream_options={"include_usage": True},
                extra_headers={"X-Session-ID": f"chat-{conv}"},
            )  # fmt: skip
            text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
            messages += [
                {"role": "assistant", "content": text},
                {"role": "user", "content": "continue"},
            ]


def _messages_exchange(
    backend: str, role: Role, conv: int, turn: int, request_id: str, pair_id: str | None
) -> Exchange:
    plain, read, write = (HOSTED_USAGE if backend == "hosted" else VLLM_USAGE)[turn]
    history: list[dict[str, Any]] = [{"role": "user", "content": f"Agent task {conv}"}]
    for _ in range(turn - 1):
        history += [
            {"role": "assistant", "content": [mw.text("Working on it.")]},
            {"role": "user", "content": "continue"},
        ]
    system = [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}]
    if conv == STAMPED:
        system.append({"type": "text", "text": f"Current time: 2026-12-01T10:{turn:02d}:07Z"})
    answer = mw.message([mw.text("Working on it.")], use=mw.usage(plain, 5, read=read, write=write))
    started = time.perf_counter() - 2.0
    x = Exchange(
        request_id=request_id,
        route="messages",
        backend=backend,
        role=role,
        model=mw.MODEL,
        served_model=mw.MODEL,
        conversation=f"h:{conv:024x}",
        turn=turn,
        stream=True,
        started=started,
        request_body=mw.body(mw.request(history, system=system, stream_it=True)),
        status=200,
        first_byte=started + TTFT_MS[backend] / 1000,
        finished=started + 0.6,
        pair_id=pair_id,
        has_shadow_copy=pair_id is None,
    )
    x.chunks.extend(mw.chunks(mw.stream(answer), 64))
    return x


def _record_agents(db: str) -> None:
    """The Messages traffic of AGENTS conversations: each turn served by the hosted API
    and shadowed to vLLM, handed to the recorder as the proxy hands it finished calls."""
    recorder = RecorderAddon(db, content="redacted", worker="thread")
    recorder.start()
    for conv in range(AGENTS):
        for turn in range(1, TURNS + 1):
            served = f"msg-{conv}-{turn}"
            recorder.exchange_done(
                _messages_exchange("hosted", Role.SERVE, conv, turn, served, None)
            )
            recorder.exchange_done(
                _messages_exchange("vllm", Role.SHADOW, conv, turn, served + "-s", served)
            )
        # The agent counts its prompt first: recorded, but not model traffic.
        counted = _messages_exchange("hosted", Role.SERVE, conv, 1, f"count-{conv}", None)
        counted.route, counted.stream, counted.has_shadow_copy = (
            "messages/count_tokens",
            False,
            False,
        )
        counted.chunks[:] = [b'{"input_tokens": 520}']
        recorder.exchange_done(counted)
    recorder.close()


@pytest.fixture(scope="module")
def databases() -> Iterator[tuple[str, Any, Any]]:
    """(the records URL, the report over chat alone, the report over chat + messages)."""
    with recorded_config(CONFIG, _chat, 2 * TURNS * CHATS, 0.02, "kvmigrate-mixed-") as path:
        url = load_config(path).record.db
        with open_store(url) as store:
            chat_only = build_report(store, 0.0)
        _record_agents(url)
        with open_store(url) as store:
            mixed = build_report(store, 0.0)
        yield url, chat_only, mixed


def _sums(url: str, route: str) -> dict[tuple[str, int], tuple[int, int]]:
    with open_store(url) as store:
        rows = store.query(
            "SELECT backend, turn, SUM(prompt_tokens), SUM(cached_tokens) FROM records "
            "WHERE route = ? AND status < 400 GROUP BY backend, turn",
            (route,),
        )
    return {(b, t): (p or 0, c or 0) for b, t, p, c in rows}


def test_messages_records_hold_anthropic_usage_and_their_parity(
    databases: tuple[str, Any, Any],
) -> None:
    url, _, _ = databases
    with open_store(url) as store:
        rows = store.query(
            "SELECT backend, turn, prompt_tokens, cached_tokens, cache_write_tokens, "
            "finish_reason, ttft_ms, parity_kind, parity_score FROM records "
            "WHERE route = 'messages' ORDER BY backend, turn"
        )
    assert len(rows) == 2 * AGENTS * TURNS
    for backend, turn, prompt, cached, written, finish, ttft, kind, score in rows:
        plain, read, write = (HOSTED_USAGE if backend == "hosted" else VLLM_USAGE)[turn]
        assert (prompt, cached, written) == (plain + read + write, read, write)
        assert finish == "end_turn"
        assert ttft == pytest.approx(TTFT_MS[backend])
        # The shadow copy is scored against the answer it copies: the same text agrees.
        assert (kind, score) == (("candidate", 1.0) if backend == "vllm" else (None, None))


def test_ttft_by_turn_counts_both_apis(databases: tuple[str, Any, Any]) -> None:
    _, chat_only, mixed = databases
    before = {r.turn: r for r in chat_only.ttft_by_turn}
    after = {r.turn: r for r in mixed.ttft_by_turn}
    assert sorted(after) == [str(t) for t in range(1, TURNS + 1)]
    for turn, row in after.items():
        assert row.primary_n == before[turn].primary_n + AGENTS
        assert row.candidate_n == before[turn].candidate_n + AGENTS
        # The Messages calls are far slower than the emulated chat ones: the p95 is theirs.
        assert row.primary_p95_ms == pytest.approx(TTFT_MS["hosted"], rel=0.05)
        assert row.candidate_p95_ms == pytest.approx(TTFT_MS["vllm"], rel=0.05)


def test_cache_hit_by_turn_counts_anthropic_reads_as_cached(
    databases: tuple[str, Any, Any],
) -> None:
    url, _, mixed = databases
    chat, messages = _sums(url, "chat/completions"), _sums(url, "messages")
    hits = {r.turn: r.hit for r in mixed.cache_by_turn}
    for turn in range(1, TURNS + 1):
        for backend in ("hosted", "vllm"):
            prompt = chat[backend, turn][0] + messages[backend, turn][0]
            cached = chat[backend, turn][1] + messages[backend, turn][1]
            assert hits[str(turn)][backend] == pytest.approx(cached / prompt)
    # Anthropic's first turn writes the cache and reads nothing: no hit on that turn.
    assert messages["hosted", 1][1] == 0
    assert messages["hosted", 2] == (AGENTS * 520, AGENTS * 480)


def test_the_cost_projection_prices_cache_writes_on_their_own(
    databases: tuple[str, Any, Any],
) -> None:
    _, _, mixed = databases
    writes = AGENTS * HOSTED_USAGE[1][2]  # served traffic only: the shadow copies are not
    assert mixed.cost.monthly_cache_write_tokens == pytest.approx(
        writes * 30 * 86_400 / mixed.cost.basis_s
    )
    text = RENDERERS["text"](mixed)
    assert "input tokens / month written to the cache" in text
    assert "$3.12 per 1M" in text  # 1.25 x the default $2.50 input price
    for fmt in ("md", "html"):
        assert "written to the cache" in RENDERERS[fmt](mixed)


def _row(prompt: int, cached: int, written: int | None, output: int, ts: float) -> Row:
    return Row(
        f"r{ts}", ts, "hosted", "serve", "c", 1, 200, None, None, 1000.0,
        prompt, cached, output, None, None, None, None, None, None, None,
        cache_write_tokens=written,
    )  # fmt: skip


def test_anthropic_prices_reads_writes_and_plain_input_apart() -> None:
    """Sonnet's list prices: $3 input, $0.30 cache reads (0.1x), $3.75 cache writes (1.25x
    for the 5-minute cache), $15 output, per million tokens."""
    rows = [_row(1_000_000, 0, 800_000, 10_000, 0.0), _row(1_000_000, 900_000, 0, 10_000, 99.0)]
    prices = Prices(input_per_m=3.0, cached_input_per_m=0.30, output_per_m=15.0)
    cost = project_cost(rows, "vllm", prices)
    plain = 200_000 + 100_000
    per_window = (plain * 3.0 + 900_000 * 0.30 + 800_000 * 3.75 + 20_000 * 15.0) / 1e6
    assert cost.hosted_monthly_usd == pytest.approx(per_window * 30 * 86_400 / 100.0)
    assert cost.monthly_cache_write_tokens == pytest.approx(800_000 * 30 * 86_400 / 100.0)
    # A configured write price replaces the 1.25x default.
    dearer = project_cost(rows, "vllm", Prices(3.0, 0.30, 15.0, cache_write_per_m=6.0))
    extra = 800_000 * (6.0 - 3.75) / 1e6 * 30 * 86_400 / 100.0
    assert dearer.hosted_monthly_usd == pytest.approx(cost.hosted_monthly_usd + extra)


def test_openai_style_traffic_costs_what_it_did() -> None:
    """No cache writes reported (None): the cost is the plain + cached split as before."""
    rows = [_row(1_000_000, 400_000, None, 0, 0.0), _row(0, 0, None, 0, 99.0)]
    cost = project_cost(rows, "vllm", Prices(input_per_m=2.5, cached_input_per_m=1.25))
    per_window = (600_000 * 2.5 + 400_000 * 1.25) / 1e6
    assert cost.hosted_monthly_usd == pytest.approx(per_window * 30 * 86_400 / 100.0)
    assert cost.monthly_cache_write_tokens == 0


def test_cache_busters_in_messages_system_prompts_are_reported(
    databases: tuple[str, Any, Any],
) -> None:
    _, _, mixed = databases
    busters = mixed.cache_busters
    assert busters.checked
    assert busters.conversations == CHATS + AGENTS
    assert busters.breaks == TURNS - 1  # every later turn of the stamped agent
    (row,) = busters.busters
    assert (row.cls, row.field, row.label) == ("timestamp", "system content", "Current time:")
    assert row.conversations == 1


def test_count_tokens_calls_are_recorded_but_are_not_model_traffic(
    databases: tuple[str, Any, Any],
) -> None:
    url, chat_only, mixed = databases
    with open_store(url) as store:
        (counted,) = store.query(
            "SELECT COUNT(*) FROM records WHERE route = 'messages/count_tokens'"
        )[0]
    assert counted == AGENTS
    serves = {b.backend: b.serve for b in chat_only.backends}
    assert {b.backend: b.serve for b in mixed.backends} == {
        "hosted": serves["hosted"] + AGENTS * TURNS,
        "vllm": serves.get("vllm", 0),
    }
