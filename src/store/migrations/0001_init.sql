-- agentd.db schema version 1. Never edit this file once shipped: add 0002_*.sql instead.

-- One row per provider call of every kind (SPEC §8). `timestamp` is Unix seconds.
CREATE TABLE costs (
    id INTEGER PRIMARY KEY,
    timestamp INTEGER,
    session_id TEXT,
    model TEXT,
    provider TEXT,
    call_type TEXT,
    input_tokens INTEGER,
    output_tokens INTEGER,
    cache_read_tokens INTEGER,
    cache_write_tokens INTEGER,
    cost_usd REAL
);

-- Budgets and `--cost` sum rows since a point in time.
CREATE INDEX costs_timestamp ON costs (timestamp);

-- Small key-value state (e.g. the Telegram update offset).
CREATE TABLE kv (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
