"""A rollout store holding a state this version cannot read (a newer kvmigrate wrote a mode
it does not know, or the row is not JSON): the store says so, naming itself
(UnreadableState), so the CLI fails with one line, and a proxy that starts on it serves the
config's rollout, keeps watching (its supervisor retries), and follows the store once its
state reads. It used to be a bare ValueError: a CLI traceback, and a proxy whose watcher
never started, so it never followed the store again.

Real SQLite files and a real redis-server; the unreadable rows are written with the
stores' own drivers, as another version would write them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

import pytest
import redis

from kvmigrate.config import Config, parse_config
from kvmigrate.rollout.controller import initial_state
from kvmigrate.rollout.live import LiveRollout
from kvmigrate.rollout.redis_store import PREFIX
from kvmigrate.rollout.store import RolloutStore, UnreadableState, open_store
from kvmigrate.serving import free_port

NEWER = {"mode": "canary", "percent": 5.0, "version": 3, "epoch": 1, "weights": [1, 2]}
FIXED = {"mode": "split", "percent": 100.0, "version": 4, "epoch": 2}


def make_config(state: str) -> Config:
    return parse_config(
        f"""
backends:
  hosted: {{api_base: "http://127.0.0.1:9/v1"}}
  vllm: {{api_base: "http://127.0.0.1:9/v1"}}
models:
  - {{model_name: gpt-4o-mini, hosted: gpt-4o-mini, vllm: served}}
rollout: {{mode: shadow, percent: 0, state: "{state}"}}
record: {{enabled: false}}
""",
        env={},
    )


def write_sqlite(path: Path, data: object) -> None:
    with closing(sqlite3.connect(path)) as db, db:
        raw = data if isinstance(data, str) else json.dumps(data)
        db.execute(
            "INSERT INTO rollout_state (id, data, version) VALUES (1, ?, ?) "
            "ON CONFLICT (id) DO UPDATE SET data = excluded.data, version = excluded.version",
            (raw, int(data["version"]) if isinstance(data, dict) else 7),
        )


def write_redis(url: str, data: object) -> None:
    client = redis.Redis.from_url(url)
    raw = data if isinstance(data, str) else json.dumps(data)
    version = int(data["version"]) if isinstance(data, dict) else 7
    client.set(f"{PREFIX}:state", raw)
    client.set(f"{PREFIX}:version", version)
    client.close()


@pytest.mark.parametrize("unreadable", [NEWER, "{not json"], ids=["newer-mode", "not-json"])
@pytest.mark.parametrize("kind", ["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
def test_an_unreadable_state_is_a_store_error_and_the_proxy_follows_once_it_reads(
    kind: str, unreadable: object, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = request.getfixturevalue("fresh_redis_url") if kind == "redis" else (
        f"sqlite:///{tmp_path}/state.db"
    )  # fmt: skip
    config = make_config(url)
    store = open_store(url, initial_state(config))

    def write(data: object) -> None:
        if kind == "sqlite":
            write_sqlite(tmp_path / "state.db", data)
        else:
            write_redis(url, data)

    try:
        write(unreadable)
        for call in (store.read, store.read_all):
            with pytest.raises(UnreadableState, match="cannot read"):
                call()
        asyncio.run(follow_once_readable(config, store, write))
    finally:
        store.close()


async def follow_once_readable(
    config: Config, store: RolloutStore, write: Callable[[object], None]
) -> None:
    live = LiveRollout(config, store, poll_interval=0.05)
    await live.running()  # must not raise: the proxy serves on the config's rollout
    try:
        assert live.state_of("gpt-4o-mini").percent == 0
        assert live.store_errors == 1  # said once at start
        for _ in range(200):  # the watcher runs, fails on the state, and is restarted
            if live.supervisor.restarts["rollout-watch"] >= 1:
                break
            await asyncio.sleep(0.05)
        assert live.supervisor.restarts["rollout-watch"] >= 1
        write(FIXED)
        for _ in range(200):
            if live.state_of("gpt-4o-mini").percent == 100:
                break
            await asyncio.sleep(0.05)
        assert live.state_of("gpt-4o-mini").percent == 100
    finally:
        await live.done()


def test_a_store_down_at_start_is_logged_once_not_again_by_the_first_polls(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One outage, one line: the start's error was followed a poll later by the watcher's
    own, so every proxy process said it twice."""
    port = free_port()  # nothing listens there: connections are refused at once
    config = make_config(f"redis://:{'pw-secret-77'}@127.0.0.1:{port}/0")
    store = open_store(config.rollout.state, initial_state(config))

    async def run() -> None:
        live = LiveRollout(config, store, poll_interval=0.02)
        await live.running()
        try:
            for _ in range(500):
                if live.store_errors >= 5:
                    break
                await asyncio.sleep(0.02)
            assert live.store_errors >= 5
        finally:
            await live.done()

    try:
        with caplog.at_level(logging.ERROR, logger="kvmigrate.rollout"):
            asyncio.run(run())
    finally:
        store.close()
    lines = [r.getMessage() for r in caplog.records if r.name == "kvmigrate.rollout"]
    assert len(lines) == 1, lines
    assert "pw-secret-77" not in lines[0]


def test_the_admin_api_answers_an_unreadable_state_with_503_in_the_envelope(
    tmp_path: Path,
) -> None:
    """As for a store that is down: a bare 500 told the operator nothing."""
    import urllib.error
    import urllib.request

    from kvmigrate.runtime import build_app
    from kvmigrate.serving import BackgroundServer

    url = f"sqlite:///{tmp_path}/state.db"
    open_store(url, initial_state(make_config(url))).close()  # the schema, as a proxy makes
    write_sqlite(tmp_path / "state.db", NEWER)
    config = parse_config(
        f"""
server: {{admin_key: adm}}
backends:
  hosted: {{api_base: "http://127.0.0.1:9/v1"}}
  vllm: {{api_base: "http://127.0.0.1:9/v1"}}
models:
  - {{model_name: gpt-4o-mini, hosted: gpt-4o-mini, vllm: served}}
rollout: {{mode: shadow, percent: 0, state: "{url}"}}
record: {{enabled: false}}
""",
        env={},
    )
    with BackgroundServer(lambda: build_app(config, record=False)) as server:
        request = urllib.request.Request(
            server.url + "/admin/rollout", headers={"Authorization": "Bearer adm"}
        )
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(request, timeout=10)
        body = json.loads(caught.value.read())
    assert caught.value.code == 503
    assert body["error"]["code"] == "store_unavailable"
    assert "cannot read a stored rollout state" in body["error"]["message"]
