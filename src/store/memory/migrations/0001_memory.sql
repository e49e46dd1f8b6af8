-- memory.db schema version 1 (SPEC §13): the workspace index, the embedding cache and
-- structured memory. Times are Unix seconds. Never edit a shipped migration: append a file.

-- Indexed workspace files (paths relative to the workspace), one row per file.
CREATE TABLE files (
    path TEXT PRIMARY KEY,
    hash TEXT NOT NULL,              -- sha256 hex of the file content
    size INTEGER NOT NULL,
    mtime INTEGER NOT NULL,
    indexed_at INTEGER NOT NULL
);

-- Line-based chunks of indexed files (chunk_chars / overlap_chars). A chunk keeps its id while
-- its text is unchanged (an edit above it only moves its line numbers).
CREATE TABLE chunks (
    id INTEGER PRIMARY KEY,
    path TEXT NOT NULL REFERENCES files(path) ON DELETE CASCADE,
    start_line INTEGER NOT NULL,     -- 1-based, inclusive
    end_line INTEGER NOT NULL,       -- 1-based, inclusive
    hash TEXT NOT NULL,              -- sha256 hex of the embedded text (path + text): the cache key
    text TEXT NOT NULL
);
CREATE INDEX chunks_path ON chunks (path);
CREATE INDEX chunks_hash ON chunks (hash);

-- Full-text index over the chunk text and its file path (so "anna" finds people/anna.md).
CREATE VIRTUAL TABLE chunks_fts USING fts5(
    path, text, content='chunks', content_rowid='id', tokenize='porter unicode61'
);
CREATE TRIGGER chunks_ai AFTER INSERT ON chunks BEGIN
    INSERT INTO chunks_fts (rowid, path, text) VALUES (new.id, new.path, new.text);
END;
CREATE TRIGGER chunks_ad AFTER DELETE ON chunks BEGIN
    INSERT INTO chunks_fts (chunks_fts, rowid, path, text)
        VALUES ('delete', old.id, old.path, old.text);
END;
CREATE TRIGGER chunks_au AFTER UPDATE OF path, text ON chunks BEGIN
    INSERT INTO chunks_fts (chunks_fts, rowid, path, text)
        VALUES ('delete', old.id, old.path, old.text);
    INSERT INTO chunks_fts (rowid, path, text) VALUES (new.id, new.path, new.text);
END;

-- Small state of the memory database. `index_generation` grows with every change to chunks or
-- embeddings, so a process holding vectors in memory knows when to reload them.
CREATE TABLE meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
INSERT INTO meta (key, value) VALUES ('index_generation', '0');

-- Embeddings by (model, sha256 of the text): chunk texts and queries alike, so an unchanged
-- chunk or a repeated query is never embedded twice. `embedding` is little-endian f32.
CREATE TABLE embedding_cache (
    model TEXT NOT NULL,
    hash TEXT NOT NULL,
    dims INTEGER NOT NULL,
    embedding BLOB NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (model, hash)
);

-- Facts: entity / attribute / value. A new value supersedes the old one (the old row gets
-- `invalidated_at` and `superseded_by`); nothing is overwritten. `memory_forget` sets
-- `invalidated_at` only.
CREATE TABLE facts (
    id INTEGER PRIMARY KEY,
    entity TEXT NOT NULL,            -- canonical entity name (aliases resolved)
    attribute TEXT NOT NULL,
    value TEXT NOT NULL,
    confidence REAL NOT NULL DEFAULT 1.0,
    source TEXT NOT NULL,            -- 'tool', 'consolidation', ...
    session_id TEXT,
    created_at INTEGER NOT NULL,
    invalidated_at INTEGER,
    superseded_by INTEGER REFERENCES facts(id)
);
CREATE INDEX facts_current ON facts (entity, attribute) WHERE invalidated_at IS NULL;

CREATE VIRTUAL TABLE facts_fts USING fts5(
    entity, attribute, value, content='facts', content_rowid='id', tokenize='porter unicode61'
);
CREATE TRIGGER facts_ai AFTER INSERT ON facts BEGIN
    INSERT INTO facts_fts (rowid, entity, attribute, value)
        VALUES (new.id, new.entity, new.attribute, new.value);
END;
CREATE TRIGGER facts_ad AFTER DELETE ON facts BEGIN
    INSERT INTO facts_fts (facts_fts, rowid, entity, attribute, value)
        VALUES ('delete', old.id, old.entity, old.attribute, old.value);
END;
CREATE TRIGGER facts_au AFTER UPDATE OF entity, attribute, value ON facts BEGIN
    INSERT INTO facts_fts (facts_fts, rowid, entity, attribute, value)
        VALUES ('delete', old.id, old.entity, old.attribute, old.value);
    INSERT INTO facts_fts (rowid, entity, attribute, value)
        VALUES (new.id, new.entity, new.attribute, new.value);
END;

-- Episodes: what happened, summarised (from consolidation).
CREATE TABLE episodes (
    id INTEGER PRIMARY KEY,
    session_id TEXT,
    summary TEXT NOT NULL,
    occurred_at INTEGER,             -- when it happened, if known
    created_at INTEGER NOT NULL,
    invalidated_at INTEGER
);
CREATE VIRTUAL TABLE episodes_fts USING fts5(
    summary, content='episodes', content_rowid='id', tokenize='porter unicode61'
);
CREATE TRIGGER episodes_ai AFTER INSERT ON episodes BEGIN
    INSERT INTO episodes_fts (rowid, summary) VALUES (new.id, new.summary);
END;
CREATE TRIGGER episodes_ad AFTER DELETE ON episodes BEGIN
    INSERT INTO episodes_fts (episodes_fts, rowid, summary) VALUES ('delete', old.id, old.summary);
END;
CREATE TRIGGER episodes_au AFTER UPDATE OF summary ON episodes BEGIN
    INSERT INTO episodes_fts (episodes_fts, rowid, summary) VALUES ('delete', old.id, old.summary);
    INSERT INTO episodes_fts (rowid, summary) VALUES (new.id, new.summary);
END;

-- Commitments: promises with a status.
CREATE TABLE commitments (
    id INTEGER PRIMARY KEY,
    description TEXT NOT NULL,
    owner TEXT,                      -- who committed ('agent', a contact, ...)
    due_at INTEGER,
    status TEXT NOT NULL DEFAULT 'open'
        CHECK (status IN ('open', 'done', 'expired', 'cancelled')),
    session_id TEXT,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
);
CREATE INDEX commitments_status ON commitments (status, due_at);

-- Alternative names of entities ("Mum" -> "Anna Schmidt"); matched case-insensitively.
CREATE TABLE entity_aliases (
    alias TEXT PRIMARY KEY COLLATE NOCASE,
    entity TEXT NOT NULL,
    created_at INTEGER NOT NULL
);

-- Per-session consolidation watermark: trail lines up to `last_seq` were processed.
CREATE TABLE consolidation_state (
    session_id TEXT PRIMARY KEY,
    last_seq INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
);

-- Workspace files already consolidated, by content hash (processed again only when changed).
CREATE TABLE consolidation_file_hashes (
    path TEXT PRIMARY KEY,
    hash TEXT NOT NULL,
    updated_at INTEGER NOT NULL
);
