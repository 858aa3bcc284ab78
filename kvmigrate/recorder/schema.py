"""The records schema, changed only by named, append-only migrations.

Each migration runs once per database, in order, and its name goes into the `migrations`
table in the same transaction (kvmigrate.sql_migrations runs them). Never edit or reorder a
migration that has shipped: append a new one. The SQL is written once for SQLite and
PostgreSQL alike (`DOUBLE PRECISION`, `BIGINT`, `BOOLEAN` and `TEXT` mean the same to both).
"""

from __future__ import annotations

from kvmigrate.sql_migrations import Migration

# The records' migrations table: the rollout store keeps its own (`rollout_migrations`), so
# both stores can share one SQLite file.
MIGRATIONS_TABLE = "migrations"

MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        "m001_records",
        (
            """CREATE TABLE records (
                request_id TEXT PRIMARY KEY,
                ts DOUBLE PRECISION NOT NULL,
                route TEXT NOT NULL,
                backend TEXT NOT NULL,
                role TEXT NOT NULL,
                model TEXT NOT NULL,
                served_model TEXT NOT NULL,
                conversation TEXT NOT NULL,
                turn BIGINT NOT NULL,
                stream BOOLEAN NOT NULL,
                status BIGINT,
                error TEXT,
                ttft_ms DOUBLE PRECISION,
                latency_ms DOUBLE PRECISION,
                prompt_tokens BIGINT,
                cached_tokens BIGINT,
                completion_tokens BIGINT,
                finish_reason TEXT,
                tool_calls TEXT,
                fallback_from TEXT,
                pair_id TEXT,
                source TEXT NOT NULL,
                content TEXT NOT NULL,
                request_json TEXT,
                response_json TEXT
            )""",
        ),
    ),
    Migration(
        "m002_records_indexes",
        (
            "CREATE INDEX records_ts ON records (ts)",
            "CREATE INDEX records_backend_ts ON records (backend, ts)",
            "CREATE INDEX records_pair ON records (pair_id)",
            "CREATE INDEX records_conversation ON records (conversation, turn)",
        ),
    ),
    Migration(
        "m003_parity",
        (
            # Set on a shadow copy (kind `candidate`) or a second primary call (`noise`),
            # scored against the answer it copies; see kvmigrate.parity.recording.
            "ALTER TABLE records ADD COLUMN parity_kind TEXT",
            "ALTER TABLE records ADD COLUMN parity_score DOUBLE PRECISION",
            "ALTER TABLE records ADD COLUMN parity_applicable TEXT",
            "ALTER TABLE records ADD COLUMN parity_disagree TEXT",
            "ALTER TABLE records ADD COLUMN parity_tool_agree DOUBLE PRECISION",
            "ALTER TABLE records ADD COLUMN parity_json_valid DOUBLE PRECISION",
        ),
    ),
    Migration(
        "m004_messages",
        (
            # A request's history, one row per distinct message (kvmigrate.recorder.history).
            """CREATE TABLE messages (
                digest TEXT PRIMARY KEY,
                last_seen DOUBLE PRECISION NOT NULL,
                body TEXT NOT NULL
            )""",
            "CREATE INDEX messages_last_seen ON messages (last_seen)",
            "ALTER TABLE records ADD COLUMN request_messages TEXT",
        ),
    ),
    Migration(
        "m005_drop_unread_indexes",
        (
            # Nothing reads records by backend, pair or conversation through SQL: the report
            # and the gates scan a time range (records_ts), and pairs are matched by the
            # recorder before writing. Each index slowed every insert; add your
            # own for ad-hoc queries.
            "DROP INDEX IF EXISTS records_backend_ts",
            "DROP INDEX IF EXISTS records_pair",
            "DROP INDEX IF EXISTS records_conversation",
        ),
    ),
    Migration(
        "m006_identity",
        # How the proxy knew the conversation (kvmigrate.continuity.resolver.SOURCES), so the
        # report can say how much traffic was keyed by a guess.
        ("ALTER TABLE records ADD COLUMN identity TEXT",),
    ),
    Migration(
        "m007_cache_write_tokens",
        # Prompt tokens written to the prompt cache (Anthropic's cache_creation_input_tokens):
        # billed apart from plain input and cache reads, so the cost projection needs them.
        ("ALTER TABLE records ADD COLUMN cache_write_tokens BIGINT",),
    ),
    Migration(
        "m008_cohort",
        # The rollout cohort the request was routed in (a name from the config), so gates
        # and the report judge each cohort on its own traffic. NULL before cohorts: such a
        # record belongs to its model's own cohort.
        ("ALTER TABLE records ADD COLUMN cohort TEXT",),
    ),
    Migration(
        "m009_answered",
        (
            # How many exchanges each proxy process answered per minute (recorder.tally),
            # so the report counts the answers that have no record.
            """CREATE TABLE answered (
                source TEXT NOT NULL,
                bucket DOUBLE PRECISION NOT NULL,
                role TEXT NOT NULL,
                answers BIGINT NOT NULL,
                PRIMARY KEY (source, bucket, role)
            )""",
            "CREATE INDEX answered_bucket ON answered (bucket)",
            # A proxy process that ended without a clean stop (kill -9, OOM, a crash): its
            # spool was replayed, but what it had not spooled yet was never counted.
            """CREATE TABLE unclean_stops (
                source TEXT PRIMARY KEY,
                ts DOUBLE PRECISION NOT NULL,
                replayed BIGINT NOT NULL
            )""",
        ),
    ),
    Migration(
        "m010_engine_samples",
        (
            # The candidates' engine and GPU figures, scraped by each proxy process
            # (kvmigrate.engine.scraper): one row per scrape of one target, failed or not,
            # so the report can say why a figure is missing. Counters are the engine's own
            # running totals; histograms are JSON lists of [upper bound, cumulative count].
            """CREATE TABLE engine_samples (
                ts DOUBLE PRECISION NOT NULL,
                source TEXT NOT NULL,
                kind TEXT NOT NULL,
                backend TEXT NOT NULL,
                target TEXT NOT NULL,
                error TEXT,
                kv_usage DOUBLE PRECISION,
                running DOUBLE PRECISION,
                waiting DOUBLE PRECISION,
                prefix_queries DOUBLE PRECISION,
                prefix_hits DOUBLE PRECISION,
                prompt_tokens DOUBLE PRECISION,
                generation_tokens DOUBLE PRECISION,
                ttft TEXT,
                itl TEXT,
                gpu_util DOUBLE PRECISION,
                gpus BIGINT,
                absent TEXT,
                bad_lines BIGINT NOT NULL
            )""",
            "CREATE INDEX engine_samples_ts ON engine_samples (ts)",
        ),
    ),
    Migration(
        "m011_decode",
        (
            # A streamed answer's decode timing (kvmigrate.exchange): with completion_tokens,
            # its output tokens per second after the first and its time per output token.
            "ALTER TABLE records ADD COLUMN decode_ms DOUBLE PRECISION",
            "ALTER TABLE records ADD COLUMN decode_chunks BIGINT",
            "ALTER TABLE records ADD COLUMN chunk_gap_max_ms DOUBLE PRECISION",
        ),
    ),
    Migration(
        "m012_feedback",
        (
            # The id of the answer the client got (a chat completion's or a Responses
            # answer's `id`), keyed-hashed like the conversation: feedback names an answer
            # by it (kvmigrate.feedback), and the report joins the two.
            "ALTER TABLE records ADD COLUMN response_id TEXT",
            # Scores clients give a conversation or an answer (`POST /v1/feedback`), in the
            # shape of Langfuse's and LangSmith's scores: a name, a numeric value, a comment.
            """CREATE TABLE feedback (
                id TEXT PRIMARY KEY,
                ts DOUBLE PRECISION NOT NULL,
                conversation TEXT,
                response_id TEXT,
                name TEXT NOT NULL,
                value DOUBLE PRECISION NOT NULL,
                comment TEXT,
                source TEXT NOT NULL
            )""",
            "CREATE INDEX feedback_ts ON feedback (ts)",
        ),
    ),
)
