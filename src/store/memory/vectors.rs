//! The embedding cache (`embedding_cache`, keyed by model and sha256 of the embedded text) and
//! the chunk vectors search scans. Vectors are stored as little-endian f32.

use rusqlite::{OptionalExtension, params};

use super::index::{bump_generation, generation};
use super::{MemoryDb, now};
use crate::store::StoreError;

/// Every embedded chunk of one model, flat: row `i` is `data[i*dims .. (i+1)*dims]` and belongs
/// to chunk `ids[i]`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct VectorSet {
    /// `meta.index_generation` when loaded.
    pub generation: i64,
    pub dims: usize,
    pub ids: Vec<i64>,
    pub data: Vec<f32>,
}

impl VectorSet {
    pub fn len(&self) -> usize {
        self.ids.len()
    }
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }
    /// The vector of row `i`.
    pub fn row(&self, i: usize) -> &[f32] {
        &self.data[i * self.dims..(i + 1) * self.dims]
    }
}

fn to_blob(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn from_blob(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

impl MemoryDb {
    /// The cached embedding of the text with this hash, if any.
    pub async fn cached_embedding(
        &self,
        model: &str,
        hash: &str,
    ) -> Result<Option<Vec<f32>>, StoreError> {
        let (model, hash) = (model.to_owned(), hash.to_owned());
        self.actor
            .call(move |c| {
                c.prepare_cached(
                    "SELECT embedding FROM embedding_cache WHERE model = ?1 AND hash = ?2",
                )?
                .query_row([&model, &hash], |r| r.get::<_, Vec<u8>>(0))
                .optional()
                .map(|b| b.map(|b| from_blob(&b)))
            })
            .await
    }

    /// Store embeddings by text hash. `chunks` = they belong to indexed chunks (the generation
    /// moves, so in-memory vector sets reload); a query embedding does not move it.
    pub async fn put_embeddings(
        &self,
        model: &str,
        rows: Vec<(String, Vec<f32>)>,
        chunks: bool,
    ) -> Result<(), StoreError> {
        let model = model.to_owned();
        self.actor
            .call(move |c| {
                let tx = c.transaction()?;
                {
                    let mut st = tx.prepare_cached(
                        "INSERT INTO embedding_cache (model, hash, dims, embedding, created_at) \
                         VALUES (?1, ?2, ?3, ?4, ?5) \
                         ON CONFLICT (model, hash) DO UPDATE SET dims = excluded.dims, \
                         embedding = excluded.embedding, created_at = excluded.created_at",
                    )?;
                    let ts = now();
                    for (hash, v) in &rows {
                        st.execute(params![model, hash, v.len() as i64, to_blob(v), ts])?;
                    }
                }
                if chunks {
                    bump_generation(&tx)?;
                }
                tx.commit()
            })
            .await
    }

    /// `meta.index_generation`: grows with every change to chunks or chunk embeddings.
    pub async fn generation(&self) -> Result<i64, StoreError> {
        self.actor.call(|c| generation(c)).await
    }

    /// Every chunk that has an embedding of `model` with `dims` dimensions (rows of another
    /// size, e.g. from before a model change, are skipped).
    pub async fn chunk_vectors(&self, model: &str) -> Result<VectorSet, StoreError> {
        let model = model.to_owned();
        self.actor
            .call(move |c| {
                let tx = c.transaction()?;
                let mut set = VectorSet {
                    generation: generation(&tx)?,
                    ..VectorSet::default()
                };
                {
                    let mut st = tx.prepare(
                        "SELECT c.id, e.embedding FROM chunks c JOIN embedding_cache e \
                         ON e.model = ?1 AND e.hash = c.hash ORDER BY c.id",
                    )?;
                    let mut rows = st.query([&model])?;
                    while let Some(r) = rows.next()? {
                        let id: i64 = r.get(0)?;
                        let blob = r.get_ref(1)?.as_blob()?;
                        let dims = blob.len() / 4;
                        if set.dims == 0 {
                            set.dims = dims;
                        }
                        if dims != set.dims || dims == 0 {
                            continue;
                        }
                        set.ids.push(id);
                        set.data.extend(
                            blob.chunks_exact(4)
                                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
                        );
                    }
                }
                tx.finish()?;
                Ok(set)
            })
            .await
    }

    /// Drop cached embeddings of `model` that no chunk uses and that are older than
    /// `older_than` (Unix seconds): old query embeddings and texts that left the index.
    pub async fn prune_embeddings(
        &self,
        model: &str,
        older_than: i64,
    ) -> Result<usize, StoreError> {
        let model = model.to_owned();
        self.actor
            .call(move |c| {
                c.execute(
                    "DELETE FROM embedding_cache WHERE model = ?1 AND created_at < ?2 \
                     AND NOT EXISTS (SELECT 1 FROM chunks WHERE chunks.hash = embedding_cache.hash)",
                    params![model, older_than],
                )
            })
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::temp_db;
    use super::super::{FileMeta, NewChunk};
    use super::*;

    #[test]
    fn blobs_round_trip() {
        let v = vec![0.0, -1.5, f32::MIN_POSITIVE, 3.25e7];
        assert_eq!(from_blob(&to_blob(&v)), v);
    }

    #[tokio::test]
    async fn chunk_vectors_join_by_hash_and_skip_other_sizes() {
        let (_d, db) = temp_db();
        let chunks = ["a", "b", "c"]
            .iter()
            .enumerate()
            .map(|(i, t)| NewChunk {
                start_line: i as u32 + 1,
                end_line: i as u32 + 1,
                hash: format!("h{t}"),
                text: t.to_string(),
            })
            .collect();
        let meta = FileMeta {
            path: "f.md".into(),
            hash: "x".into(),
            size: 3,
            mtime: 0,
        };
        db.replace_file(meta, chunks).await.unwrap();
        let g = db.generation().await.unwrap();
        db.put_embeddings(
            "m",
            vec![
                ("ha".into(), vec![1.0, 0.0]),
                ("hb".into(), vec![0.0, 1.0]),
                ("hc".into(), vec![1.0, 1.0, 1.0]),
            ],
            true,
        )
        .await
        .unwrap();
        let set = db.chunk_vectors("m").await.unwrap();
        assert!(set.generation > g);
        assert_eq!(set.dims, 2);
        assert_eq!(set.len(), 2);
        assert_eq!(set.row(1), &[0.0, 1.0]);
        assert!(db.chunk_vectors("other").await.unwrap().is_empty());

        // A query embedding: cached, no generation move, pruned once old and unused.
        db.put_embeddings("m", vec![("q".into(), vec![0.5, 0.5])], false)
            .await
            .unwrap();
        assert_eq!(db.generation().await.unwrap(), set.generation);
        assert_eq!(
            db.cached_embedding("m", "q").await.unwrap(),
            Some(vec![0.5, 0.5])
        );
        assert_eq!(db.prune_embeddings("m", now() + 10).await.unwrap(), 1);
        assert_eq!(db.cached_embedding("m", "q").await.unwrap(), None);
        assert!(db.cached_embedding("m", "ha").await.unwrap().is_some());
    }
}
