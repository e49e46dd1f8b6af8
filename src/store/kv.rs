//! Small key-value state in `agentd.db` (e.g. the Telegram update offset).

use rusqlite::OptionalExtension;

use super::{Db, StoreError};

impl Db {
    /// The value stored under `key`, if any.
    pub async fn kv_get(&self, key: &str) -> Result<Option<String>, StoreError> {
        let key = key.to_owned();
        self.actor
            .call(move |conn| {
                conn.prepare_cached("SELECT value FROM kv WHERE key = ?1")?
                    .query_row([&key], |row| row.get(0))
                    .optional()
            })
            .await
    }

    /// Store `value` under `key`, replacing any previous value.
    pub async fn kv_set(&self, key: &str, value: &str) -> Result<(), StoreError> {
        let (key, value) = (key.to_owned(), value.to_owned());
        self.actor
            .call(move |conn| {
                conn.prepare_cached(
                    "INSERT INTO kv (key, value) VALUES (?1, ?2) \
                     ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                )?
                .execute([&key, &value])?;
                Ok(())
            })
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn kv_round_trip_and_overwrite() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("agentd.db")).unwrap();
        assert_eq!(db.kv_get("telegram.offset").await.unwrap(), None);
        db.kv_set("telegram.offset", "41").await.unwrap();
        assert_eq!(
            db.kv_get("telegram.offset").await.unwrap().as_deref(),
            Some("41")
        );
        db.kv_set("telegram.offset", "42").await.unwrap();
        assert_eq!(
            db.kv_get("telegram.offset").await.unwrap().as_deref(),
            Some("42")
        );
        // Keys are independent, and odd text survives unchanged.
        db.kv_set("other", "'; DROP TABLE kv; --\n✓").await.unwrap();
        assert_eq!(
            db.kv_get("other").await.unwrap().as_deref(),
            Some("'; DROP TABLE kv; --\n✓")
        );
        assert_eq!(
            db.kv_get("telegram.offset").await.unwrap().as_deref(),
            Some("42")
        );
    }
}
