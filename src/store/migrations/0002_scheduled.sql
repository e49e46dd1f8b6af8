-- agentd.db schema version 2: scheduled one-shot messages and the run log of [[schedule]].

-- One-shot messages from the schedule_message tool (SPEC §11, §14).
CREATE TABLE scheduled (
    id TEXT PRIMARY KEY,
    target TEXT NOT NULL,           -- session key / contact name the message goes to
    text TEXT NOT NULL,
    due_at INTEGER NOT NULL,        -- Unix seconds
    created_at INTEGER NOT NULL,
    created_by TEXT NOT NULL,       -- session key that scheduled it
    status TEXT NOT NULL DEFAULT 'pending'   -- pending | done | cancelled
);
CREATE INDEX scheduled_due ON scheduled (status, due_at);

-- Last run of each [[schedule]] entry (missed-run policy: run once at start).
CREATE TABLE schedule_runs (
    name TEXT PRIMARY KEY,
    last_run_at INTEGER NOT NULL
);
