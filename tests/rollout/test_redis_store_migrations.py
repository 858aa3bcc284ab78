"""The Redis rollout store's migrations: named in the `<prefix>:migrations` set once run, run
under the `<prefix>:migrating` lock so that replicas starting at once run each once, on a
real redis-server.

Each earlier shape is written here key by key, as that release wrote it: round 2 (pins and
links keyed in the clear, no secret) and round 3 (a secret, keys hashed, no migrations set).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import pytest
import redis

from kvmigrate.rollout.keys import StoreKeys, is_hashed
from kvmigrate.rollout.redis_store import PREFIX, RedisRolloutStore
from kvmigrate.rollout.state import RolloutState

SEED = RolloutState()
SESSION = "gpt-4o-mini:alice@example.com"
DECLARED = "alice@example.com"
DERIVED = "h:" + "0123456789abcdef01234567"
OLD_SECRET = "cd" * 32
STATE = json.dumps({"mode": "split", "percent": 10, "version": 1, "epoch": 0})


@pytest.fixture
def client(fresh_redis_url: str) -> Iterator[redis.Redis]:
    db = redis.Redis.from_url(fresh_redis_url, decode_responses=True)
    yield db
    db.close()


def write_release(client: redis.Redis, keys: StoreKeys | None) -> None:
    """The keys a release wrote: in the clear (`keys` None, round 2), or hashed under the
    secret it kept (round 3)."""
    key = keys.key if keys else (lambda k: k)
    conversation = keys.conversation if keys else (lambda c: c)
    client.set(f"{PREFIX}:state", STATE)
    client.set(f"{PREFIX}:version", 1)
    client.rpush(f"{PREFIX}:history", json.dumps({"version": 1}))
    expires = time.time() + 600
    client.set(f"{PREFIX}:pin:{key(SESSION)}", f"vllm|0|{expires}", ex=600)
    link = json.dumps([conversation(DECLARED), 2, expires, ""])
    client.set(f"{PREFIX}:link:{key('r:resp_1')}", link, ex=600)
    client.set(f"{PREFIX}:link:{key('c:' + 'ab' * 16)}", json.dumps([DERIVED, 3, expires, ""]))
    if keys:
        client.set(f"{PREFIX}:secret", OLD_SECRET)


def pins_and_links(client: redis.Redis) -> list[str]:
    return sorted(client.keys(f"{PREFIX}:pin:*") + client.keys(f"{PREFIX}:link:*"))


def test_a_round2_store_gets_its_keys_hashed_once_with_their_ttls(
    client: redis.Redis, fresh_redis_url: str
) -> None:
    write_release(client, None)
    store = RedisRolloutStore(fresh_redis_url, SEED)
    keys = store.keys
    assert store.migrated == ["r001_hashed_keys"]
    assert client.smembers(f"{PREFIX}:migrations") == {"r001_hashed_keys"}
    assert client.get(f"{PREFIX}:migrating") is None  # the lock is let go
    names = pins_and_links(client)
    assert names == sorted(
        [
            f"{PREFIX}:pin:{keys.key(SESSION)}",
            f"{PREFIX}:link:{keys.key('r:resp_1')}",
            f"{PREFIX}:link:{keys.key('c:' + 'ab' * 16)}",
        ]
    )
    assert all(is_hashed(n.rsplit(":", 1)[1]) for n in names)
    assert 0 < client.ttl(f"{PREFIX}:pin:{keys.key(SESSION)}") <= 600  # TTLs kept
    assert client.ttl(f"{PREFIX}:link:{keys.key('c:' + 'ab' * 16)}") == -1  # none, still none
    assert "alice" not in repr([(n, client.get(n)) for n in names])
    [pin] = store.load_pins()
    assert (pin.conversation, pin.backend) == (keys.key(SESSION), "vllm")
    [link] = store.load_links([keys.key("r:resp_1")])
    assert (link.conversation, link.turn) == (keys.key(DECLARED), 2)
    assert store.load_links([keys.key("c:" + "ab" * 16)])[0].conversation == DERIVED
    assert (store.read().percent, store.version()) == (10, 1)  # the state, untouched
    store.close()
    again = RedisRolloutStore(fresh_redis_url, SEED)
    assert again.migrated == []
    assert again.keys.key(SESSION) == keys.key(SESSION)
    again.close()


def test_a_round3_store_keeps_its_secret_and_only_records_the_migration(
    client: redis.Redis, fresh_redis_url: str
) -> None:
    old = StoreKeys(OLD_SECRET)
    write_release(client, old)
    before = [(n, client.get(n)) for n in pins_and_links(client)]
    store = RedisRolloutStore(fresh_redis_url, SEED)
    assert store.migrated == ["r001_hashed_keys"]
    assert store.keys.key(SESSION) == old.key(SESSION)
    assert [(n, client.get(n)) for n in pins_and_links(client)] == before
    assert client.smembers(f"{PREFIX}:migrations") == {"r001_hashed_keys"}
    store.close()


def test_replicas_opening_at_once_wait_for_the_lock_and_run_the_migration_once(
    client: redis.Redis, fresh_redis_url: str
) -> None:
    """Another process holds the migration lock: both replicas wait (the keys stay as
    they are meanwhile); once it is let go, one runs the migration and the other finds it
    recorded."""
    write_release(client, None)
    client.set(f"{PREFIX}:migrating", "another-process", ex=60)
    stores: list[RedisRolloutStore] = []
    threads = [
        threading.Thread(target=lambda: stores.append(RedisRolloutStore(fresh_redis_url, SEED)))
        for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    time.sleep(0.5)
    assert stores == []  # both are waiting on the lock
    assert f"{PREFIX}:pin:{SESSION}" in pins_and_links(client)  # nothing moved yet
    assert client.get(f"{PREFIX}:secret") is None
    client.delete(f"{PREFIX}:migrating")
    for thread in threads:
        thread.join(30)
    assert sorted(s.migrated for s in stores) == [[], ["r001_hashed_keys"]]
    a, b = (s.keys.key(SESSION) for s in stores)
    assert a == b
    assert f"{PREFIX}:pin:{a}" in pins_and_links(client)
    assert all(is_hashed(n.rsplit(":", 1)[1]) for n in pins_and_links(client))
    for store in stores:
        store.close()
