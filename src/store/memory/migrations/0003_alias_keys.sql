-- memory.db schema version 3 (issue "Security, third round", item 9): the aliases a message
-- names are found by looking up the message's words in an index, not by reading every alias
-- for every message. `name_key` is the alias trimmed and lower-cased (Unicode, as the
-- message is); the migration's hook fills it for the rows that exist (`facts::alias_key`).
ALTER TABLE entity_aliases ADD COLUMN name_key TEXT NOT NULL DEFAULT '';
CREATE INDEX entity_aliases_key ON entity_aliases (name_key);
-- "Is this the name of an entity with current facts?" (alias checks, entity resolution).
CREATE INDEX facts_entity_current ON facts (entity COLLATE NOCASE) WHERE invalidated_at IS NULL;
