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

/// What [`Db::schedule_insert`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScheduleInsert {
    Inserted,
    /// Not inserted: `pending` messages are pending, the limit or more.
    Full {
        pending: u32,
    },
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
    /// Insert `s` as pending unless `max` messages are pending already: the count and the
    /// insert are one `IMMEDIATE` transaction, so parallel calls cannot pass the limit
    /// together (the actor runs one job at a time too; the transaction also holds off a
    /// second writer such as another process on the same file).
    pub async fn schedule_insert(
        &self,
        s: Scheduled,
        max: u32,
    ) -> Result<ScheduleInsert, StoreError> {
        self.actor
            .call(move |c| {
                let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
                let pending: u32 = tx.query_row(
                    "SELECT COUNT(*) FROM scheduled WHERE status = 'pending'",
                    [],
                    |r| r.get(0),
                )?;
                if pending >= max {
                    return Ok(ScheduleInsert::Full { pending });
                }
                tx.execute(
                    "INSERT INTO scheduled (id, target, text, due_at, created_at, created_by, status) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'pending')",
                    rusqlite::params![s.id, s.target, s.text, s.due_at, s.created_at, s.created_by],
                )?;
                tx.commit()?;
                Ok(ScheduleInsert::Inserted)
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

    /// Pending messages that session `created_by` scheduled, soonest first (what
    /// `list_scheduled` shows that session).
    pub async fn schedule_pending_of(
        &self,
        created_by: &str,
    ) -> Result<Vec<Scheduled>, StoreError> {
        let by = created_by.to_owned();
        self.actor
            .call(move |c| {
                c.prepare_cached(&format!(
                    "SELECT {COLS} FROM scheduled WHERE status = 'pending' AND created_by = ?1 \
                     ORDER BY due_at, id"
                ))?
                .query_map([&by], row)?
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

    /// Cancel the pending message `id` if session `created_by` scheduled it; false otherwise
    /// (no such pending message, or another session's: the two are not told apart).
    pub async fn schedule_cancel(&self, id: &str, created_by: &str) -> Result<bool, StoreError> {
        let (id, by) = (id.to_owned(), created_by.to_owned());
        self.actor
            .call(move |c| {
                Ok(c.execute(
                    "UPDATE scheduled SET status = 'cancelled' \
                     WHERE id = ?1 AND status = 'pending' AND created_by = ?2",
                    [&id, &by],
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
            db.schedule_insert(
                Scheduled {
                    id: id.into(),
                    target: "Alice".into(),
                    text: "t".into(),
                    due_at: due,
                    created_at: 1,
                    created_by: "x".into(),
                    status: String::new(),
                },
                u32::MAX,
            )
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
        assert_eq!(db.schedule_pending().await.unwrap().len(), 1);
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
            db.schedule_insert(
                Scheduled {
                    id: id.into(),
                    target: "Alice".into(),
                    text: "t".into(),
                    due_at: due,
                    created_at: 1,
                    created_by: "x".into(),
                    status: String::new(),
                },
                u32::MAX,
            )
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

    fn row_of(id: &str, by: &str) -> Scheduled {
        Scheduled {
            id: id.into(),
            target: by.into(),
            text: format!("text of {id}"),
            due_at: 10,
            created_at: 1,
            created_by: by.into(),
            status: String::new(),
        }
    }

    /// A session lists and cancels only what it scheduled; the scheduler still sees all.
    #[tokio::test]
    async fn rows_belong_to_the_session_that_made_them() {
        let d = tempfile::tempdir().unwrap();
        let db = Db::open(&d.path().join("a.db")).unwrap();
        for (id, by) in [("a1", "alice"), ("b1", "bob")] {
            let r = db.schedule_insert(row_of(id, by), 10).await.unwrap();
            assert_eq!(r, ScheduleInsert::Inserted);
        }
        let of = |v: Vec<Scheduled>| v.into_iter().map(|s| s.id).collect::<Vec<_>>();
        assert_eq!(of(db.schedule_pending_of("bob").await.unwrap()), ["b1"]);
        assert_eq!(of(db.schedule_pending_of("eve").await.unwrap()), [""; 0]);
        assert!(!db.schedule_cancel("a1", "bob").await.unwrap());
        assert!(db.schedule_cancel("a1", "alice").await.unwrap());
        assert!(!db.schedule_cancel("a1", "alice").await.unwrap(), "once");
        assert_eq!(of(db.schedule_pending().await.unwrap()), ["b1"]);
    }

    #[tokio::test]
    async fn insert_refuses_at_the_limit() {
        let d = tempfile::tempdir().unwrap();
        let db = Db::open(&d.path().join("a.db")).unwrap();
        for id in ["1", "2"] {
            let r = db.schedule_insert(row_of(id, "x"), 2).await.unwrap();
            assert_eq!(r, ScheduleInsert::Inserted);
        }
        let r = db.schedule_insert(row_of("3", "x"), 2).await.unwrap();
        assert_eq!(r, ScheduleInsert::Full { pending: 2 });
        assert_eq!(db.schedule_pending().await.unwrap().len(), 2);
    }

    #[test]
    fn at_parsing() {
        assert!(parse_due_at("2026-11-24T09:00:00+01:00").is_ok());
        assert!(parse_due_at("tomorrow").is_err());
    }
}
