//! The workspace index: `files` and their line-based `chunks` (the FTS5 table follows by
//! triggers), and `meta.index_generation`.

use std::collections::HashMap;

use rusqlite::{OptionalExtension, Transaction, params};
use serde::Serialize;

use super::{MemoryDb, now};
use crate::store::StoreError;

/// An indexed file (path relative to the workspace).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileMeta {
    pub path: String,
    /// sha256 hex of the content.
    pub hash: String,
    pub size: u64,
    /// Unix seconds.
    pub mtime: i64,
}

/// One chunk to store for a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewChunk {
    /// 1-based, inclusive.
    pub start_line: u32,
    pub end_line: u32,
    /// sha256 hex of the embedded text: the embedding cache key.
    pub hash: String,
    pub text: String,
}

/// A stored chunk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChunkRow {
    pub id: i64,
    pub path: String,
    pub start_line: u32,
    pub end_line: u32,
    pub text: String,
}

/// What [`MemoryDb::replace_file`] changed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct FileChange {
    pub added: usize,
    pub removed: usize,
    /// Chunks whose text was unchanged: they keep their id (and embedding).
    pub kept: usize,
}

/// A chunk text that has no embedding for the model yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnembeddedChunk {
    pub hash: String,
    pub path: String,
    pub text: String,
}

/// Counts for `agentd index --status`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct IndexStatus {
    pub files: u64,
    pub chunks: u64,
    /// Chunks with an embedding of the configured model (0 without one).
    pub embedded_chunks: u64,
    /// Unix seconds of the newest indexed file, if any.
    pub last_indexed_at: Option<i64>,
    pub generation: i64,
    pub facts: u64,
    pub episodes: u64,
    pub open_commitments: u64,
}

pub(super) fn bump_generation(tx: &Transaction<'_>) -> rusqlite::Result<()> {
    tx.execute(
        "UPDATE meta SET value = CAST(value AS INTEGER) + 1 WHERE key = 'index_generation'",
        [],
    )?;
    Ok(())
}

pub(super) fn generation(conn: &rusqlite::Connection) -> rusqlite::Result<i64> {
    conn.query_row(
        "SELECT CAST(value AS INTEGER) FROM meta WHERE key = 'index_generation'",
        [],
        |r| r.get(0),
    )
}

pub(super) fn chunk_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<ChunkRow> {
    Ok(ChunkRow {
        id: r.get(0)?,
        path: r.get(1)?,
        start_line: r.get(2)?,
        end_line: r.get(3)?,
        text: r.get(4)?,
    })
}

impl MemoryDb {
    /// Every indexed file and its content hash.
    pub async fn file_hashes(&self) -> Result<HashMap<String, String>, StoreError> {
        self.actor
            .call(|c| {
                let mut st = c.prepare("SELECT path, hash FROM files")?;
                st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?.collect()
            })
            .await
    }

    /// The indexed file at `path`, if any.
    pub async fn file_meta(&self, path: &str) -> Result<Option<FileMeta>, StoreError> {
        let path = path.to_owned();
        self.actor
            .call(move |c| {
                c.query_row(
                    "SELECT path, hash, size, mtime FROM files WHERE path = ?1",
                    [&path],
                    |r| {
                        Ok(FileMeta {
                            path: r.get(0)?,
                            hash: r.get(1)?,
                            size: r.get::<_, i64>(2)?.max(0) as u64,
                            mtime: r.get(3)?,
                        })
                    },
                )
                .optional()
            })
            .await
    }

    /// Record `meta` and make `chunks` the file's chunks, in one transaction. A chunk whose
    /// hash is already stored for this file keeps its row (only its line numbers move); other
    /// old chunks are deleted and new ones inserted.
    pub async fn replace_file(
        &self,
        meta: FileMeta,
        chunks: Vec<NewChunk>,
    ) -> Result<FileChange, StoreError> {
        self.actor
            .call(move |c| {
                let tx = c.transaction()?;
                let change = replace_file_tx(&tx, &meta, &chunks)?;
                if change.added > 0 || change.removed > 0 {
                    bump_generation(&tx)?;
                }
                tx.commit()?;
                Ok(change)
            })
            .await
    }

    /// Forget files that are no longer part of the workspace index. Returns the number of
    /// chunks removed.
    pub async fn remove_files(&self, paths: Vec<String>) -> Result<usize, StoreError> {
        if paths.is_empty() {
            return Ok(0);
        }
        self.actor
            .call(move |c| {
                let tx = c.transaction()?;
                let mut removed = 0;
                for p in &paths {
                    removed += tx.execute("DELETE FROM chunks WHERE path = ?1", [p])?;
                    tx.execute("DELETE FROM files WHERE path = ?1", [p])?;
                }
                bump_generation(&tx)?;
                tx.commit()?;
                Ok(removed)
            })
            .await
    }

    /// Up to `limit` distinct chunk texts without an embedding of `model`.
    pub async fn unembedded_chunks(
        &self,
        model: &str,
        limit: usize,
    ) -> Result<Vec<UnembeddedChunk>, StoreError> {
        let model = model.to_owned();
        self.actor
            .call(move |c| {
                let mut st = c.prepare_cached(
                    "SELECT c.hash, min(c.path), min(c.text) FROM chunks c \
                     WHERE NOT EXISTS (SELECT 1 FROM embedding_cache e \
                                       WHERE e.model = ?1 AND e.hash = c.hash) \
                     GROUP BY c.hash ORDER BY min(c.id) LIMIT ?2",
                )?;
                st.query_map(params![model, limit as i64], |r| {
                    Ok(UnembeddedChunk {
                        hash: r.get(0)?,
                        path: r.get(1)?,
                        text: r.get(2)?,
                    })
                })?
                .collect()
            })
            .await
    }

    /// Distinct chunk texts without an embedding of `model`.
    pub async fn count_unembedded(&self, model: &str) -> Result<u64, StoreError> {
        let model = model.to_owned();
        self.actor
            .call(move |c| {
                c.query_row(
                    "SELECT count(DISTINCT c.hash) FROM chunks c \
                     WHERE NOT EXISTS (SELECT 1 FROM embedding_cache e \
                                       WHERE e.model = ?1 AND e.hash = c.hash)",
                    [&model],
                    |r| r.get::<_, i64>(0),
                )
                .map(|n| n.max(0) as u64)
            })
            .await
    }

    /// Counts of the index and of structured memory. `model` = the embeddings model's API id.
    pub async fn index_status(&self, model: Option<&str>) -> Result<IndexStatus, StoreError> {
        let model = model.map(str::to_owned);
        self.actor
            .call(move |c| {
                let count = |sql: &str| {
                    c.query_row(sql, [], |r| r.get::<_, i64>(0))
                        .map(|n| n.max(0) as u64)
                };
                let embedded = match &model {
                    Some(m) => c
                        .query_row(
                            "SELECT count(*) FROM chunks c JOIN embedding_cache e \
                             ON e.model = ?1 AND e.hash = c.hash",
                            [m],
                            |r| r.get::<_, i64>(0),
                        )?
                        .max(0) as u64,
                    None => 0,
                };
                Ok(IndexStatus {
                    files: count("SELECT count(*) FROM files")?,
                    chunks: count("SELECT count(*) FROM chunks")?,
                    embedded_chunks: embedded,
                    last_indexed_at: c
                        .query_row("SELECT max(indexed_at) FROM files", [], |r| r.get(0))?,
                    generation: generation(c)?,
                    facts: count("SELECT count(*) FROM facts WHERE invalidated_at IS NULL")?,
                    episodes: count("SELECT count(*) FROM episodes WHERE invalidated_at IS NULL")?,
                    open_commitments: count(
                        "SELECT count(*) FROM commitments WHERE status = 'open'",
                    )?,
                })
            })
            .await
    }

    /// The chunks with these ids (missing ids are skipped), in the order given.
    pub async fn chunks_by_id(&self, ids: Vec<i64>) -> Result<Vec<ChunkRow>, StoreError> {
        self.actor
            .call(move |c| {
                let mut st = c.prepare_cached(
                    "SELECT id, path, start_line, end_line, text FROM chunks WHERE id = ?1",
                )?;
                let mut out = Vec::with_capacity(ids.len());
                for id in ids {
                    if let Some(row) = st.query_row([id], chunk_row).optional()? {
                        out.push(row);
                    }
                }
                Ok(out)
            })
            .await
    }

    /// The stored chunks of one file, in line order.
    pub async fn chunks_of(&self, path: &str) -> Result<Vec<ChunkRow>, StoreError> {
        let path = path.to_owned();
        self.actor
            .call(move |c| {
                let mut st = c.prepare_cached(
                    "SELECT id, path, start_line, end_line, text FROM chunks \
                     WHERE path = ?1 ORDER BY start_line, id",
                )?;
                st.query_map([&path], chunk_row)?.collect()
            })
            .await
    }
}

fn replace_file_tx(
    tx: &Transaction<'_>,
    meta: &FileMeta,
    chunks: &[NewChunk],
) -> rusqlite::Result<FileChange> {
    tx.execute(
        "INSERT INTO files (path, hash, size, mtime, indexed_at) VALUES (?1, ?2, ?3, ?4, ?5) \
         ON CONFLICT (path) DO UPDATE SET hash = excluded.hash, size = excluded.size, \
         mtime = excluded.mtime, indexed_at = excluded.indexed_at",
        params![meta.path, meta.hash, meta.size as i64, meta.mtime, now()],
    )?;
    // Existing chunks by hash (a text may repeat within a file).
    let mut existing: HashMap<String, Vec<(i64, u32, u32)>> = HashMap::new();
    {
        let mut st = tx.prepare_cached(
            "SELECT id, hash, start_line, end_line FROM chunks WHERE path = ?1 ORDER BY id DESC",
        )?;
        let rows = st.query_map([&meta.path], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, String>(1)?,
                r.get(2)?,
                r.get(3)?,
            ))
        })?;
        for row in rows {
            let (id, hash, start, end) = row?;
            existing.entry(hash).or_default().push((id, start, end));
        }
    }
    let mut change = FileChange::default();
    for chunk in chunks {
        match existing.get_mut(&chunk.hash).and_then(Vec::pop) {
            Some((id, start, end)) => {
                if (start, end) != (chunk.start_line, chunk.end_line) {
                    tx.execute(
                        "UPDATE chunks SET start_line = ?2, end_line = ?3 WHERE id = ?1",
                        params![id, chunk.start_line, chunk.end_line],
                    )?;
                }
                change.kept += 1;
            }
            None => {
                tx.execute(
                    "INSERT INTO chunks (path, start_line, end_line, hash, text) \
                     VALUES (?1, ?2, ?3, ?4, ?5)",
                    params![
                        meta.path,
                        chunk.start_line,
                        chunk.end_line,
                        chunk.hash,
                        chunk.text
                    ],
                )?;
                change.added += 1;
            }
        }
    }
    for (id, _, _) in existing.into_values().flatten() {
        tx.execute("DELETE FROM chunks WHERE id = ?1", [id])?;
        change.removed += 1;
    }
    Ok(change)
}

#[cfg(test)]
mod tests {
    use super::super::tests::temp_db;
    use super::*;

    fn meta(path: &str, hash: &str) -> FileMeta {
        FileMeta {
            path: path.into(),
            hash: hash.into(),
            size: 1,
            mtime: 0,
        }
    }

    fn chunk(start: u32, end: u32, text: &str) -> NewChunk {
        NewChunk {
            start_line: start,
            end_line: end,
            hash: format!("h-{text}"),
            text: text.into(),
        }
    }

    #[tokio::test]
    async fn unchanged_chunks_keep_their_ids_and_moved_ones_their_text() {
        let (_d, db) = temp_db();
        let g0 = db.index_status(None).await.unwrap().generation;
        let c = db
            .replace_file(
                meta("a.md", "1"),
                vec![chunk(1, 2, "alpha"), chunk(3, 4, "beta")],
            )
            .await
            .unwrap();
        assert_eq!((c.added, c.removed, c.kept), (2, 0, 0));
        let before = db.chunks_of("a.md").await.unwrap();
        let g1 = db.index_status(None).await.unwrap().generation;
        assert!(g1 > g0);

        // A line inserted at the top: alpha and beta move, gamma is new.
        let c = db
            .replace_file(
                meta("a.md", "2"),
                vec![
                    chunk(1, 1, "gamma"),
                    chunk(2, 3, "alpha"),
                    chunk(4, 5, "beta"),
                ],
            )
            .await
            .unwrap();
        assert_eq!((c.added, c.removed, c.kept), (1, 0, 2));
        let after = db.chunks_of("a.md").await.unwrap();
        let id_of = |rows: &[ChunkRow], t: &str| rows.iter().find(|r| r.text == t).unwrap().id;
        assert_eq!(id_of(&before, "alpha"), id_of(&after, "alpha"));
        assert_eq!(id_of(&before, "beta"), id_of(&after, "beta"));
        let alpha = after.iter().find(|r| r.text == "alpha").unwrap();
        assert_eq!((alpha.start_line, alpha.end_line), (2, 3));

        // Same chunks again: nothing changes, the generation stays.
        let c = db
            .replace_file(
                meta("a.md", "2"),
                vec![
                    chunk(1, 1, "gamma"),
                    chunk(2, 3, "alpha"),
                    chunk(4, 5, "beta"),
                ],
            )
            .await
            .unwrap();
        assert_eq!((c.added, c.removed, c.kept), (0, 0, 3));
        let g2 = db.index_status(None).await.unwrap().generation;
        let c = db
            .replace_file(meta("a.md", "2"), vec![chunk(1, 1, "gamma")])
            .await
            .unwrap();
        assert_eq!((c.added, c.removed, c.kept), (0, 2, 1));
        assert!(db.index_status(None).await.unwrap().generation > g2);
    }

    #[tokio::test]
    async fn removed_files_take_their_chunks_and_fts_rows() {
        let (_d, db) = temp_db();
        db.replace_file(meta("a.md", "1"), vec![chunk(1, 1, "zebra crossing")])
            .await
            .unwrap();
        db.replace_file(meta("b.md", "1"), vec![chunk(1, 1, "zebra stripes")])
            .await
            .unwrap();
        assert_eq!(
            db.fts_chunks("\"zebra\"".into(), 10).await.unwrap().len(),
            2
        );
        assert_eq!(db.remove_files(vec!["a.md".into()]).await.unwrap(), 1);
        let hits = db.fts_chunks("\"zebra\"".into(), 10).await.unwrap();
        assert_eq!(hits.len(), 1);
        assert_eq!(hits[0].0.path, "b.md");
        let status = db.index_status(None).await.unwrap();
        assert_eq!((status.files, status.chunks), (1, 1));
        assert_eq!(db.file_hashes().await.unwrap().len(), 1);
    }

    #[tokio::test]
    async fn unembedded_lists_each_text_once_until_embedded() {
        let (_d, db) = temp_db();
        db.replace_file(
            meta("a.md", "1"),
            vec![
                chunk(1, 1, "same"),
                chunk(2, 2, "same"),
                chunk(3, 3, "other"),
            ],
        )
        .await
        .unwrap();
        assert_eq!(db.count_unembedded("m").await.unwrap(), 2);
        let todo = db.unembedded_chunks("m", 10).await.unwrap();
        assert_eq!(todo.len(), 2);
        db.put_embeddings("m", vec![(todo[0].hash.clone(), vec![1.0, 0.0])], true)
            .await
            .unwrap();
        assert_eq!(db.count_unembedded("m").await.unwrap(), 1);
        assert_eq!(db.count_unembedded("other-model").await.unwrap(), 2);
        let s = db.index_status(Some("m")).await.unwrap();
        assert_eq!(
            s.embedded_chunks,
            if todo[0].text == "same" { 2 } else { 1 }
        );
    }
}
