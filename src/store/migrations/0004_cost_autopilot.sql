-- agentd.db schema version 4: the cost autopilot (SPEC §20).

-- Cache writes with the 1-hour TTL, a part of cache_write_tokens priced at
-- cost_per_mtok.cache_write_1h; NULL (rows before this version) reads as 0.
ALTER TABLE costs ADD COLUMN cache_write_1h_tokens INTEGER;

-- Where the message that made the call came from (telegram, system, http, ...: control::Source),
-- for `--cost --by source`; NULL for rows before this version and calls outside a message.
ALTER TABLE costs ADD COLUMN source TEXT;

-- One row per [[schedule]] run a precheck skipped (exit 1): no provider call was made.
-- saved_usd is the estimate, the job's last cost; NULL when it never ran.
CREATE TABLE skipped_runs (
    id INTEGER PRIMARY KEY,
    timestamp INTEGER NOT NULL,     -- Unix seconds
    schedule TEXT NOT NULL,
    session_id TEXT NOT NULL,
    saved_usd REAL
);
CREATE INDEX skipped_runs_timestamp ON skipped_runs (timestamp);
