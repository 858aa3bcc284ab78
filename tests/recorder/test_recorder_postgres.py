"""Several proxy replicas write to one PostgreSQL; gates read per-backend windows from it."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import orjson
import pytest
from recorder_support import (
    HOSTED_MODEL,
    Backends,
    recorder_config,
    start_recording_proxy,
    wait_until,
)

from kvmigrate.exchange import Exchange, Role
from kvmigrate.recorder import Record, open_store, window_stats
from kvmigrate.recorder.convert import RecordConverter
from kvmigrate.report import busters


def test_two_proxies_write_to_one_postgres_at_once(
    backends: Backends, pg_url: str, tmp_path: Path
) -> None:
    # The spool of a PostgreSQL recorder would be in the working directory's .kvmigrate/.
    spool = str(tmp_path / "spool")
    config = recorder_config(backends.hosted.url, backends.vllm.url, pg_url, spool_dir=spool)
    proxies = [
        start_recording_proxy(config, source=f"replica-{i}", batch_size=8, flush_interval=0.05)
        for i in range(2)
    ]
    clients = [p.client() for p in proxies]

    def drive(index: int) -> None:
        client = clients[index % 2]
        client.chat.completions.create(
            model=HOSTED_MODEL, messages=[{"role": "user", "content": f"question {index}"}],
            max_tokens=4, extra_headers={"X-Session-ID": f"s{index}"},
        )  # fmt: skip

    started = time.time()
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(drive, range(60)))
    for p in proxies:
        wait_until(lambda p=p: p.recorder.stats.written >= 60, timeout=20)  # type: ignore[misc]
        p.stop()
    assert [p.recorder.stats.write_errors for p in proxies] == [0, 0]

    with open_store(pg_url) as store:
        rows = store.query(
            "SELECT role, count(*), count(DISTINCT source) FROM records GROUP BY role ORDER BY role"
        )
        assert rows == [("serve", 60, 2), ("shadow", 60, 2)]
    windows = window_stats(pg_url, since=started - 1)
    assert set(windows) == {"hosted", "vllm"}
    for window in windows.values():
        assert window.requests == 60
        assert window.conversations == 60
        assert window.errors == 0
        # The calls were not streamed: no TTFT, and the gates fall back to latency.
        assert window.ttft_p95 is None
        assert window.latency_p95 is not None
        assert window.latency_p95 > 0
    assert window_stats(pg_url, since=started - 1, roles=["shadow"]).keys() == {"vllm"}


def _rec(i: int, backend: str, **kw: object) -> Record:
    base: dict[str, object] = dict(
        request_id=f"r{backend}{i}", ts=1000.0 + i, route="chat/completions", backend=backend,
        role="serve", model="m", served_model="m", conversation=f"c{i % 3}", turn=1,
        stream=False, status=200, ttft_ms=float(i),
    )  # fmt: skip
    base.update(kw)
    return Record(**base)  # type: ignore[arg-type]


def test_window_stats_counts_errors_as_gates_expect(pg_url: str) -> None:
    with open_store(pg_url) as store:
        store.insert([_rec(i, "hosted") for i in range(1, 11)])
        store.insert(
            [
                _rec(1, "vllm", status=503, error="http_503", ttft_ms=None),
                _rec(2, "vllm", status=None, error="connect_error", ttft_ms=None),
                _rec(3, "vllm", status=400, error="http_400"),
                _rec(4, "vllm", error="client_disconnected"),
                _rec(5, "vllm", status=None, ttft_ms=None),  # no verdict yet: not counted
                _rec(6, "vllm", ts=5000.0),  # outside the window
                _rec(7, "other", route="other"),  # passthrough: not model traffic
            ]
        )
        windows = window_stats(store, since=1000.0, until=2000.0)
    assert set(windows) == {"hosted", "vllm"}
    hosted, vllm = windows["hosted"], windows["vllm"]
    assert (hosted.requests, hosted.conversations, hosted.errors) == (10, 3, 0)
    assert hosted.ttft_p50 == 0.0055
    assert hosted.ttft_p95 is not None
    assert abs(hosted.ttft_p95 - 0.00955) < 1e-9
    assert (vllm.requests, vllm.errors) == (4, 2)
    assert vllm.error_rate == 0.5
    assert vllm.parity is None
    assert vllm.parity_samples == 0


def _agent_records(conversations: int, turns: int) -> list[Record]:
    """Agents whose system prompt stamps the time every turn (a cache buster), and agents
    that keep it, interleaved in time, as the proxy's recorder writes them."""
    convert = RecordConverter("redacted", "test")
    records = []
    for turn in range(1, turns + 1):
        for c in range(conversations):
            system = "You are a careful coding agent. " * 20
            if c % 2:
                system = f"Current time: 2025-01-06T10:{turn:02d}:00Z\n{system}"
            history = [{"role": "system", "content": system}]
            for step in range(1, turn + 1):
                history.append({"role": "user", "content": f"Task {c}, step {step}."})
                if step < turn:
                    history.append({"role": "assistant", "content": f"Did step {step}."})
            x = Exchange(
                request_id=f"{c}-{turn}", route="chat/completions", backend="hosted",
                role=Role.SERVE, model="m", served_model="m", conversation=f"conv-{c}",
                turn=turn, stream=False, started=0.0, status=200, first_byte=0.1, finished=0.2,
                request_body=orjson.dumps({"model": "m", "messages": history}),
            )  # fmt: skip
            x.chunks = [orjson.dumps({"choices": [{"message": {"content": "ok"}}]})]
            records.append(convert((x, 100.0 + turn * conversations + c)))
    return records


def test_the_reports_cache_buster_section_reads_postgres_as_sqlite(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The section reads its window a batch of conversations at a time, by timestamps (the
    `ts IN (...)` and `CASE WHEN` of its queries): PostgreSQL gives what SQLite gives."""
    monkeypatch.setattr(busters, "BATCH_ROWS", 5)
    records = _agent_records(conversations=6, turns=4)
    found = []
    for url in (pg_url, f"sqlite:///{tmp_path / 'records.db'}"):
        with open_store(url) as store:
            store.insert(records)
            fleet, _own, _cohorts = busters.buster_summaries(store, 0.0, 10_000.0, {})
        found.append(fleet.as_dict())
    assert found[0] == found[1]
    assert (found[0]["conversations"], found[0]["requests"]) == (6, 24)
    assert found[0]["busters"]  # the stamped agents' turns each bust the cache
    assert 0 < found[0]["reuse_ratio"] < 1
