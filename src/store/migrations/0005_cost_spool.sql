-- agentd.db schema version 5: exactly-once replay of the cost spool (SPEC §16.4).

-- The spool ids (`cost::spool`, `agentd.db.spool`) of cost rows written from the spool, each
-- inserted in the same transaction as its row: a replay that a crash stopped after its commit
-- and before the spool was emptied skips these rows the next time. Emptied once the spool is.
CREATE TABLE cost_spool_applied (
    id TEXT PRIMARY KEY
) WITHOUT ROWID;
