"""Without `record.hash_key`, conversation ids in records are hashed with a secret key, not
the public default salt: one derived from the rollout store's secret (the same after a
restart, and for every proxy on the store), else a random one. A real proxy (runtime, with
its SQLite rollout store) in front of emulators, the official SDK as client."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import openai
from recorder_support import HOSTED_MODEL, Backends, recorder_config, wait_until

from kvmigrate.recorder import RecorderAddon, open_store
from kvmigrate.recorder.convert import stored_conversation
from kvmigrate.rollout.keys import StoreKeys
from kvmigrate.rollout.sqlite_store import KEY_SECRET
from kvmigrate.runtime import build_app
from kvmigrate.serving import BackgroundServer

PUBLIC_SALT = b"kvmigrate"  # rollout.salt's default, what records were hashed with before
SESSION = "alice@example.com"


def _one_turn(backends: Backends, tmp_path: Path) -> None:
    rollout = f'{{mode: shadow, shadow_sample: 0, state: "sqlite:///{tmp_path}/state.db"}}'
    config = recorder_config(
        backends.hosted.url, backends.vllm.url, f"sqlite:///{tmp_path}/records.db",
        rollout=rollout,
    )  # fmt: skip
    with BackgroundServer(lambda: build_app(config)) as proxy:
        client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="sk-client", max_retries=0)
        with client:
            client.chat.completions.create(
                model=HOSTED_MODEL,
                messages=[{"role": "user", "content": "Hi"}],
                max_tokens=4,
                extra_headers={"X-Session-ID": SESSION},
            )


def _conversations(tmp_path: Path, count: int) -> list[str]:
    with open_store(f"sqlite:///{tmp_path}/records.db") as store:
        wait_until(lambda: store.query("SELECT count(*) FROM records")[0][0] >= count)
        return [r[0] for r in store.query("SELECT conversation FROM records ORDER BY ts")]


def test_ids_are_hashed_with_the_stores_key_and_stay_the_same_after_a_restart(
    backends: Backends, tmp_path: Path
) -> None:
    _one_turn(backends, tmp_path)
    _one_turn(backends, tmp_path)  # a restart: a new proxy on the same stores
    first, second = _conversations(tmp_path, 2)
    assert first == second  # one conversation across the restart
    with contextlib.closing(sqlite3.connect(tmp_path / "state.db")) as db:
        read = "SELECT value FROM rollout_meta WHERE name = ?"
        secret = db.execute(read, (KEY_SECRET,)).fetchone()[0]
    keys = StoreKeys(secret)
    grouped = keys.conversation(SESSION)  # the id as the rollout store keys it
    assert first == stored_conversation(grouped, "redacted", keys.records_key())
    for public in (stored_conversation(c, "redacted", PUBLIC_SALT) for c in (SESSION, grouped)):
        assert first != public


def test_a_recorder_without_a_key_makes_its_own(tmp_path: Path) -> None:
    one = RecorderAddon(f"sqlite:///{tmp_path}/a.db", worker="thread")
    two = RecorderAddon(f"sqlite:///{tmp_path}/b.db", worker="thread")
    assert len(one.hash_key) == 32
    assert PUBLIC_SALT not in (one.hash_key, two.hash_key)
    assert one.hash_key != two.hash_key
