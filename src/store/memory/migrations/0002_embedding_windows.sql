-- memory.db schema version 2 (issue 20): a chunk longer than the embeddings model reads is
-- embedded in windows of at most 800 characters (memory::chunk::WINDOW_CHARS), and its vector
-- is the mean of theirs. Vectors made before from such a chunk saw only its beginning: drop
-- them, so the next `agentd index` embeds these chunks again, and only these. The condition
-- is the length of the embedded text (the path without ".md", a line break, the chunk), with
-- three characters to spare for paths without ".md"; query embeddings are not chunks and stay.
DELETE FROM embedding_cache
 WHERE hash IN (SELECT hash FROM chunks WHERE length(path) + length(text) > 796);

-- In-memory vector sets of a running process reload.
UPDATE meta SET value = CAST(value AS INTEGER) + 1 WHERE key = 'index_generation';
