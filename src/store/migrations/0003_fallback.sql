-- agentd.db schema version 3: the model a fallback answered for (SPEC §18.3).

-- The config name of the model that was asked for and failed, when a model of its `fallback`
-- list answered this call instead; NULL when the model asked for answered.
ALTER TABLE costs ADD COLUMN fallback_from TEXT;
