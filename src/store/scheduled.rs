//! Scheduled one-shot messages and the `[[schedule]]` run log (SPEC §14), in `agentd.db`.

use rusqlite::OptionalExtension;
use serde::Serialize;

use super::{Db, StoreError};

/// One scheduled message.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Scheduled {
    pub id: String,
    pub target: String,
    pub text: String,
    /// Unix seconds.
    pub due_at: i64,
    pub created_at: i64,
    pub created_by: String,
    pub status: String,
}

/// `at` as RFC 3339 → Unix seconds, a message's `due_at` (the `at` of `schedule_message`).
pub fn parse_due_at(at: &str) -> Result<i64, String> {
    chrono::DateTime::parse_from_rfc3339(at)
        .map(|t| t.timestamp())
        .map_err(|e| format!("`at` must be an RFC 3339 time like 2026-11-24T09:00:00+01:00: {e}"))
}

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Scheduled> {
    Ok(Scheduled {
        id: r.get(0)?,
        target: r.get(1)?,
        text: r.get(2)?,
        due_at: r.get(3)?,
        created_at: r.get(4)?,
        created_by: r.get(5)?,
        status: r.get(6)?,
    })
}

const COLS: &str = "id, target, text, due_at, created_at, created_by, status";

impl Db {
    pub async fn schedule_insert(&self, s: Scheduled) -> Result<(), StoreError> {
        self.actor
            .call(move |c| {
                c.execute(
                    "INSERT INTO scheduled (id, target, text, due_at, created_at, created_by, status) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'pending')",
                    rusqlite::params![s.id, s.target, s.text, s.due_at, s.created_at, s.created_by],
                )?;
                Ok(())
            })
            .await
    }

    /// Pending messages, soonest first.
    pub async fn schedule_pending(&self) -> Result<Vec<Scheduled>, StoreError> {
        self.actor
            .call(|c| {
                c.prepare_cached(&format!(
                    "SELECT {COLS} FROM scheduled WHERE status = 'pending' ORDER BY due_at, id"
                ))?
                .query_map([], row)?
                .collect()
            })
            .await
    }

    /// Set a pending message's status (`done` or `cancelled`); false when it was not pending.
    pub async fn schedule_finish(&self, id: &str, status: &str) -> Result<bool, StoreError> {
        let (id, status) = (id.to_owned(), status.to_owned());
        self.actor
            .call(move |c| {
                Ok(c.execute(
                    "UPDATE scheduled SET status = ?2 WHERE id = ?1 AND status = 'pending'",
                    [&id, &status],
                )? == 1)
            })
            .await
    }

    /// Delete done and cancelled messages that were due before `before` (Unix seconds); the
    /// pending ones stay (SPEC §16.3). Returns how many rows went.
    pub async fn schedule_prune(&self, before: i64) -> Result<usize, StoreError> {
        self.actor
            .call(move |c| {
                c.execute(
                    "DELETE FROM scheduled WHERE status IN ('done', 'cancelled') AND due_at < ?1",
                    [before],
                )
            })
            .await
    }

    pub async fn schedule_pending_count(&self) -> Result<u32, StoreError> {
        self.actor
            .call(|c| {
                c.query_row(
                    "SELECT COUNT(*) FROM scheduled WHERE status = 'pending'",
                    [],
                    |r| r.get(0),
                )
            })
            .await
    }

    pub async fn schedule_last_run(&self, name: &str) -> Result<Option<i64>, StoreError> {
        let name = name.to_owned();
        self.actor
            .call(move |c| {
                c.query_row(
                    "SELECT last_run_at FROM schedule_runs WHERE name = ?1",
                    [&name],
                    |r| r.get(0),
                )
                .optional()
            })
            .await
    }

    pub async fn schedule_set_run(&self, name: &str, at: i64) -> Result<(), StoreError> {
        let name = name.to_owned();
        self.actor
            .call(move |c| {
                c.execute(
                    "INSERT INTO schedule_runs (name, last_run_at) VALUES (?1, ?2) \
                     ON CONFLICT (name) DO UPDATE SET last_run_at = excluded.last_run_at",
                    rusqlite::params![name, at],
                )?;
                Ok(())
            })
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn insert_list_finish_and_runs() {
        let d = tempfile::tempdir().unwrap();
        let db = Db::open(&d.path().join("a.db")).unwrap();
        for (id, due) in [("b", 20), ("a", 10)] {
            db.schedule_insert(Scheduled {
                id: id.into(),
                target: "Alice".into(),
                text: "t".into(),
                due_at: due,
                created_at: 1,
                created_by: "x".into(),
                status: String::new(),
            })
            .await
            .unwrap();
        }
        let p = db.schedule_pending().await.unwrap();
        assert_eq!(
            p.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(),
            ["a", "b"]
        );
        assert!(db.schedule_finish("a", "done").await.unwrap());
        assert!(!db.schedule_finish("a", "cancelled").await.unwrap());
        assert_eq!(db.schedule_pending_count().await.unwrap(), 1);
        assert_eq!(db.schedule_last_run("hb").await.unwrap(), None);
        db.schedule_set_run("hb", 5).await.unwrap();
        db.schedule_set_run("hb", 7).await.unwrap();
        assert_eq!(db.schedule_last_run("hb").await.unwrap(), Some(7));
    }

    #[tokio::test]
    async fn prune_drops_only_finished_rows_due_before_the_cut() {
        let d = tempfile::tempdir().unwrap();
        let db = Db::open(&d.path().join("a.db")).unwrap();
        for (id, due) in [
            ("done-old", 10),
            ("cancelled-old", 10),
            ("done-new", 100),
            ("pending-old", 10),
        ] {
            db.schedule_insert(Scheduled {
                id: id.into(),
                target: "Alice".into(),
                text: "t".into(),
                due_at: due,
                created_at: 1,
                created_by: "x".into(),
                status: String::new(),
            })
            .await
            .unwrap();
        }
        db.schedule_finish("done-old", "done").await.unwrap();
        db.schedule_finish("cancelled-old", "cancelled")
            .await
            .unwrap();
        db.schedule_finish("done-new", "done").await.unwrap();
        assert_eq!(db.schedule_prune(50).await.unwrap(), 2);
        assert_eq!(db.schedule_prune(50).await.unwrap(), 0);
        let pending = db.schedule_pending().await.unwrap();
        assert_eq!(pending.len(), 1);
        assert_eq!(pending[0].id, "pending-old");
        assert_eq!(db.schedule_prune(1000).await.unwrap(), 1, "done-new");
    }

    #[test]
    fn at_parsing() {
        assert!(parse_due_at("2026-11-24T09:00:00+01:00").is_ok());
        assert!(parse_due_at("tomorrow").is_err());
    }
}
