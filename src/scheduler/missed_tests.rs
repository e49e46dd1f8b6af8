//! "A run missed while the daemon was down runs once at start" (SPEC §14): an entry whose
//! several slots passed while the daemon was down fires once, for its first missed slot, and
//! not once per slot; a first start with a new entry fires nothing.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::Notify;

use super::Scheduler;
use crate::channels::intake::{AcceptError, Accepted, Completion, IntakeSink};
use crate::config::{ScheduleAction, ScheduleEntry, ScheduleWhen};
use crate::session::Intake;
use crate::store::Db;

/// Records every accepted intake as `(key, id)`.
#[derive(Default)]
struct Recorder(Mutex<Vec<(String, String)>>);

impl IntakeSink for Recorder {
    fn accept<'a>(
        &'a self,
        key: &'a str,
        intake: Intake,
    ) -> BoxFuture<'a, Result<Accepted, AcceptError>> {
        self.0.lock().unwrap().push((key.to_string(), intake.id));
        Box::pin(async { Ok(Accepted::default()) })
    }

    fn ask<'a>(
        &'a self,
        _key: &'a str,
        _intake: Intake,
    ) -> BoxFuture<'a, Result<Option<Completion>, AcceptError>> {
        unreachable!("the scheduler never waits for an answer")
    }
}

struct Fixture {
    _dir: tempfile::TempDir,
    sched: Scheduler,
    fired: Arc<Recorder>,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir_all(root.join("providers.d")).unwrap();
    std::fs::write(
        root.join("providers.d/anthropic.toml"),
        "type = \"anthropic\"\napi_key_env = \"K\"\n[models.primary]\nmodel = \"m\"\n",
    )
    .unwrap();
    std::fs::write(
        root.join("agentd.toml"),
        "[paths]\nstate_dir = \"state\"\n[agent]\nname = \"t\"\nworkspace = \"ws\"\ntimezone = \"UTC\"\n[providers]\ndir = \"providers.d\"\n",
    )
    .unwrap();
    let env = std::collections::BTreeMap::from([
        ("K".to_string(), "sk-test".to_string()),
        ("HOME".to_string(), root.display().to_string()),
    ]);
    let cfg = crate::config::load_with_env(&root.join("agentd.toml"), env).unwrap();
    let fired = Arc::new(Recorder::default());
    let sched = Scheduler {
        cfg: crate::config::Live::new(Arc::new(cfg)),
        db: Db::open(&root.join("agentd.db")).unwrap(),
        intake: fired.clone(),
        wake: Arc::new(Notify::new()),
        memory_jobs: None,
        unrecorded: Default::default(),
        prechecks: None,
    };
    Fixture {
        _dir: dir,
        sched,
        fired,
    }
}

fn entry(name: &str, when: ScheduleWhen) -> ScheduleEntry {
    ScheduleEntry {
        name: name.into(),
        when,
        action: ScheduleAction::System("Execute HEARTBEAT.md".into()),
        precheck: None,
    }
}

fn fired(f: &Fixture) -> Vec<(String, String)> {
    f.fired.0.lock().unwrap().clone()
}

/// Ten `every = "60s"` slots were missed: one run, for the first missed slot, then the next
/// slot is a full period after the run; a second check at the same moment fires nothing.
#[tokio::test]
async fn ten_missed_every_slots_run_once() {
    let f = fixture();
    let beat = entry("beat", ScheduleWhen::Every(Duration::from_secs(60)));
    let now = 1_800_000_000;
    let last = now - 600;
    f.sched.db.schedule_set_run("beat", last).await.unwrap();
    let next = f.sched.check_entry(&beat, now).await;
    assert_eq!(
        fired(&f),
        vec![("system".to_string(), format!("schedule-beat-{}", last + 60))]
    );
    assert_eq!(next, Some(now + 60), "the next slot counts from the run");
    assert_eq!(
        f.sched.db.schedule_last_run("beat").await.unwrap(),
        Some(now)
    );
    // Checked again (the scheduler loops): the other nine missed slots never fire.
    assert_eq!(f.sched.check_entry(&beat, now).await, Some(now + 60));
    assert_eq!(f.sched.check_entry(&beat, now + 30).await, Some(now + 60));
    assert_eq!(fired(&f).len(), 1, "{:?}", fired(&f));
    // The next slot fires normally.
    f.sched.check_entry(&beat, now + 60).await;
    assert_eq!(fired(&f).len(), 2);
}

/// A cron entry (every minute) down for a day: 1,440 missed slots, one run.
#[tokio::test]
async fn a_day_of_missed_cron_slots_runs_once() {
    let f = fixture();
    let cron = entry("minutely", ScheduleWhen::Cron("* * * * *".into()));
    let now = 1_800_000_030; // 30 s past a whole minute (1,800,000,000 is one)
    f.sched
        .db
        .schedule_set_run("minutely", now - 86_400)
        .await
        .unwrap();
    let next = f.sched.check_entry(&cron, now).await;
    assert_eq!(fired(&f).len(), 1, "{:?}", fired(&f));
    assert_eq!(next, Some(now + 30), "the next whole minute");
    f.sched.check_entry(&cron, now + 10).await;
    assert_eq!(fired(&f).len(), 1, "{:?}", fired(&f));
}

/// A new entry (no run recorded) missed nothing: the first start fires it at its first slot
/// after now, not at once.
#[tokio::test]
async fn a_new_entry_missed_nothing() {
    let f = fixture();
    let beat = entry("new", ScheduleWhen::Every(Duration::from_secs(3600)));
    let now = 1_800_000_000;
    assert_eq!(f.sched.check_entry(&beat, now).await, Some(now + 3600));
    assert!(fired(&f).is_empty());
    assert_eq!(
        f.sched.db.schedule_last_run("new").await.unwrap(),
        Some(now)
    );
}

/// A one-shot message whose `done` mark cannot be written is not sent again on the next wake:
/// only the mark is retried (intake dedup remembers a session's last ids only, and none across
/// a reset, so it cannot be what holds the message off).
#[tokio::test]
async fn a_message_whose_done_mark_fails_is_not_fired_again() {
    let mut f = fixture();
    f.sched.db = Db::without_schema_for_test(); // every write fails
    for _ in 0..3 {
        f.sched.fire_message("42", "alice", "hello", None).await;
    }
    let got = f.fired.0.lock().unwrap().clone();
    assert_eq!(got, [("alice".to_string(), "sched-42".to_string())]);
    assert!(
        f.sched.is_unrecorded("42"),
        "the mark is still to be retried"
    );
}

/// The same for a `[[schedule]]` entry whose run cannot be recorded (a full disk, simulated by
/// a trigger through a second connection): one intake for the slot however often the
/// scheduler wakes, and once the run log is writable again the entry goes on normally.
#[tokio::test]
async fn an_entry_whose_run_cannot_be_recorded_is_not_fired_again() {
    let f = fixture();
    let e = entry("tick", ScheduleWhen::Every(Duration::from_secs(60)));
    let now = chrono::Utc::now().timestamp();
    f.sched.db.schedule_set_run("tick", now - 90).await.unwrap(); // due since 30 s
    let conn = rusqlite::Connection::open(f._dir.path().join("agentd.db")).unwrap();
    conn.execute_batch(
        "CREATE TRIGGER full_i BEFORE INSERT ON schedule_runs BEGIN \
         SELECT RAISE(FAIL, 'database or disk is full'); END; \
         CREATE TRIGGER full_u BEFORE UPDATE ON schedule_runs BEGIN \
         SELECT RAISE(FAIL, 'database or disk is full'); END;",
    )
    .unwrap();
    for _ in 0..3 {
        f.sched.check_entry(&e, now).await;
    }
    assert_eq!(
        fired(&f).len(),
        1,
        "one intake for the slot: {:?}",
        fired(&f)
    );
    conn.execute_batch("DROP TRIGGER full_i; DROP TRIGGER full_u;")
        .unwrap();
    // The record goes in; the slot is not fired again, and the run log moves on.
    f.sched.check_entry(&e, now).await;
    assert_eq!(fired(&f).len(), 1);
    assert_eq!(
        f.sched.db.schedule_last_run("tick").await.unwrap(),
        Some(now)
    );
}
