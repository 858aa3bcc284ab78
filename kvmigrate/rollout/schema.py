"""The SQLite rollout store's schema, changed only by named, append-only migrations.

kvmigrate.sql_migrations runs them, as it runs the records store's, and records each name
in `rollout_migrations` (not `migrations`, which the records store keeps: both stores may
share one file). Never edit or reorder a migration that has shipped: append a new one.

Stores written before this list existed have their tables but no migrations table. Each of
the first five migrations is the DDL a release shipped, with `IF NOT EXISTS`, so such a store
adopts the ones its release had (a no-op each) and gains only what came later, in place: the
round-1 tables keep the fleet-wide default (cohort "") and its history, untouched, and each
cohort's own state and history go to the rollout_cohort_* tables. A migration added from now
on needs no `IF NOT EXISTS`: the runner knows whether it ran.
"""

from __future__ import annotations

from kvmigrate.rollout.keys import StoreKeys, new_secret
from kvmigrate.sql_migrations import Cursor, Migration

MIGRATIONS_TABLE = "rollout_migrations"
# The secret of the keyed hashes that key pins and links (kvmigrate.rollout.keys), in
# rollout_meta.
KEY_SECRET = "key_secret"


def hash_clear_keys(cursor: Cursor) -> None:
    """Make the store's secret, and hash every pin and link key written in the clear before
    stores hashed them. A store that already has a secret (written by a release that hashed
    keys, before migrations were recorded) holds no clear keys: it is left as it is."""
    cursor.execute("SELECT value FROM rollout_meta WHERE name = ?", (KEY_SECRET,))
    if cursor.fetchall():
        return
    secret = new_secret()
    keys = StoreKeys(secret)
    cursor.execute("SELECT * FROM rollout_pins")
    pins = cursor.fetchall()
    cursor.execute("SELECT * FROM rollout_links")
    links = cursor.fetchall()
    cursor.execute("DELETE FROM rollout_pins")
    cursor.execute("DELETE FROM rollout_links")
    cursor.executemany(
        "INSERT OR IGNORE INTO rollout_pins VALUES (?, ?, ?, ?)",
        [(keys.key(c), b, e, x) for c, b, e, x in pins],
    )
    cursor.executemany(
        "INSERT OR REPLACE INTO rollout_links VALUES (?, ?, ?, ?, ?)",
        [(keys.key(k), keys.conversation(c), t, x, d) for k, c, t, x, d in links],
    )
    cursor.execute("INSERT INTO rollout_meta VALUES (?, ?)", (KEY_SECRET, secret))


MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        "r001_state_history_pins",
        (
            """CREATE TABLE IF NOT EXISTS rollout_state (id INTEGER PRIMARY KEY CHECK (id = 1),
                data TEXT NOT NULL, version INTEGER NOT NULL)""",
            """CREATE TABLE IF NOT EXISTS rollout_history (version INTEGER PRIMARY KEY,
                at REAL NOT NULL, data TEXT NOT NULL)""",
            """CREATE TABLE IF NOT EXISTS rollout_pins (conversation TEXT PRIMARY KEY,
                backend TEXT NOT NULL, epoch INTEGER NOT NULL, expires_at REAL NOT NULL)""",
        ),
    ),
    Migration(
        "r002_links",
        (
            # Conversation continuity (kvmigrate.continuity.link_table).
            """CREATE TABLE IF NOT EXISTS rollout_links (key TEXT PRIMARY KEY,
                conversation TEXT NOT NULL, turn INTEGER NOT NULL, expires_at REAL NOT NULL,
                detail TEXT NOT NULL DEFAULT '')""",
        ),
    ),
    Migration(
        "r003_cohorts",
        (
            """CREATE TABLE IF NOT EXISTS rollout_cohort_state (cohort TEXT PRIMARY KEY,
                data TEXT NOT NULL, version INTEGER NOT NULL)""",
            """CREATE TABLE IF NOT EXISTS rollout_cohort_history (
                seq INTEGER PRIMARY KEY AUTOINCREMENT, cohort TEXT NOT NULL,
                version INTEGER NOT NULL, at REAL NOT NULL, data TEXT NOT NULL)""",
        ),
    ),
    Migration(
        "r004_expiry_indexes",
        (
            # Each batch of links (and each pin) first deletes what expired, which without
            # them scanned the whole table, one row per conversation turn of the last TTL.
            "CREATE INDEX IF NOT EXISTS rollout_links_expiry ON rollout_links (expires_at)",
            "CREATE INDEX IF NOT EXISTS rollout_pins_expiry ON rollout_pins (expires_at)",
        ),
    ),
    Migration(
        "r005_hashed_keys",
        ("CREATE TABLE IF NOT EXISTS rollout_meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)",),
        hash_clear_keys,
    ),
)
