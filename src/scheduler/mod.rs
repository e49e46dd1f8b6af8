//! The scheduler (SPEC §14): one-shot messages from `schedule_message` (in `agentd.db`) and
//! the `[[schedule]]` entries (`cron` in `agent.timezone`, or `every`). Everything it fires goes
//! through durable intake, so it is ordered with the session's other messages, recorded in the
//! trail, and never delivered twice (intake ids are idempotent: `sched-<id>`,
//! `schedule-<name>-<slot>`). A run missed while the daemon was down runs once at start.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use chrono::{TimeZone, Utc};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::channels::intake::IntakeSink;
use crate::config::{Live, Precheck, ScheduleAction, ScheduleEntry, ScheduleWhen};
use crate::session::Intake;
use crate::session::event::{PrecheckEvent, PrecheckOutcome};
use crate::store::Db;

mod precheck;
pub use precheck::PrecheckRecorder;

/// Longest sleep between checks (config changes and clock jumps are picked up within it).
const MAX_SLEEP: Duration = Duration::from_secs(60);

pub struct Scheduler {
    /// The running config: `[[schedule]]` entries are read from it on every pass, so a SIGHUP
    /// that changes them applies at once (SPEC §16.5).
    pub cfg: Live,
    pub db: Db,
    pub intake: Arc<dyn IntakeSink>,
    /// Woken when a one-shot message is added or cancelled.
    pub wake: Arc<Notify>,
    /// `job = "index" | "consolidate"`; `None` when memory is disabled.
    pub memory_jobs: Option<crate::memory::MemoryJobs>,
    /// Intake ids fired whose run could not be recorded (`schedule_finish`,
    /// `schedule_set_run` failed): not fired again, only the record is retried. Intake dedup
    /// alone does not hold them off, as it remembers the last ids of a session only, and none
    /// across a reset. Holds only ids whose record is failing.
    pub unrecorded: FiredIds,
    /// Where the outcome of a `precheck` goes (SPEC §20): the session's trail and the
    /// monitor. `None` (unit tests): prechecks run, nothing is recorded.
    pub prechecks: Option<PrecheckRecorder>,
}

/// See [`Scheduler::unrecorded`].
pub type FiredIds = std::sync::Mutex<std::collections::HashSet<String>>;

/// Log each entry whose cron expression does not parse (it never fires).
fn warn_invalid_cron(entries: &[ScheduleEntry]) {
    for e in entries {
        if let ScheduleWhen::Cron(expr) = &e.when
            && croner::Cron::from_str(expr).is_err()
        {
            tracing::error!(schedule = %e.name, cron = %expr, "invalid cron expression; entry ignored (fix [[schedule]] cron)");
        }
    }
}

/// The next time `entry` fires strictly after `after` (Unix seconds).
pub fn next_after(entry: &ScheduleEntry, after: i64, tz: &crate::zone::Zone) -> Option<i64> {
    match &entry.when {
        ScheduleWhen::Every(d) => Some(after + d.as_secs().max(1) as i64),
        ScheduleWhen::Cron(expr) => {
            let cron = croner::Cron::from_str(expr).ok()?;
            let start = tz.timestamp_opt(after, 0).single()?;
            cron.find_next_occurrence(&start, false)
                .ok()
                .map(|t| t.timestamp())
        }
    }
}

impl Scheduler {
    pub async fn run(self: Arc<Self>, cancel: CancellationToken) {
        let mut reloads = self.cfg.subscribe();
        let mut checked = None;
        loop {
            let cfg = self.cfg.get();
            if checked.as_ref().is_none_or(|c| !Arc::ptr_eq(c, &cfg)) {
                warn_invalid_cron(&cfg.schedules);
                checked = Some(cfg.clone());
            }
            let now = Utc::now().timestamp();
            let mut next_wake = now + MAX_SLEEP.as_secs() as i64;
            match self.db.schedule_pending().await {
                Ok(list) => {
                    for s in list {
                        if s.due_at <= now {
                            let from = (s.created_by != s.target).then_some(s.created_by.as_str());
                            self.fire_message(&s.id, &s.target, &s.text, from).await;
                        } else {
                            next_wake = next_wake.min(s.due_at);
                        }
                    }
                }
                Err(e) => tracing::error!(error = %e, "scheduler: cannot read scheduled messages"),
            }
            for entry in &cfg.schedules {
                if let Some(at) = self.check_entry(entry, now).await {
                    next_wake = next_wake.min(at);
                }
            }
            let sleep = Duration::from_secs((next_wake - Utc::now().timestamp()).max(0) as u64)
                .min(MAX_SLEEP);
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = self.wake.notified() => {}
                // A reload: the next pass sees the new entries (a dropped sender only
                // happens at shutdown; then the sleep paces the loop).
                Ok(()) = reloads.changed() => {}
                _ = tokio::time::sleep(sleep) => {}
            }
        }
    }

    /// Fire `entry` if due (once, however many slots were missed); return its next time.
    async fn check_entry(&self, entry: &ScheduleEntry, now: i64) -> Option<i64> {
        let tz = self.cfg.get().agent.timezone.clone();
        let last = match self.db.schedule_last_run(&entry.name).await {
            Ok(Some(t)) => t,
            Ok(None) => {
                // First start with this entry: nothing was missed; count from now.
                let _ = self.db.schedule_set_run(&entry.name, now).await;
                now
            }
            Err(e) => {
                tracing::error!(schedule = %entry.name, error = %e, "scheduler: cannot read the run log");
                return None;
            }
        };
        let due = next_after(entry, last, &tz)?;
        if due > now {
            return Some(due);
        }
        let id = format!("schedule-{}-{due}", entry.name);
        if self.is_unrecorded(&id) {
            // Fired already; only its run record failed: retry that, never the action.
            return match self.db.schedule_set_run(&entry.name, now).await {
                Ok(()) => {
                    self.recorded(&id);
                    next_after(entry, now, &tz)
                }
                Err(_) => Some(now + 30),
            };
        }
        tracing::info!(schedule = %entry.name, due, "schedule fired");
        match &entry.action {
            ScheduleAction::System(text) => {
                let mut text = text.clone();
                if let Some(p) = &entry.precheck {
                    match self.precheck(entry, p, now).await {
                        Some(stdout) => text = precheck::with_output(&text, &stdout),
                        None => return self.ran(entry, &id, now, tz).await,
                    }
                }
                let intake = Intake {
                    id: id.clone(),
                    source: crate::control::Source::System,
                    from: format!("schedule:{}", entry.name),
                    text,
                    tier: None,
                    attachments: vec![],
                    route: None,
                    notify_meta: None,
                    relayed_from: None,
                };
                if let Err(e) = self.intake.accept("system", intake).await {
                    tracing::error!(schedule = %entry.name, error = %e, "scheduled system event not accepted; retrying later");
                    return Some(now + 30);
                }
            }
            ScheduleAction::Message { text, to } => {
                // The operator's own words, from the config: not relayed.
                self.fire_message(&id, to, text, None).await;
            }
            ScheduleAction::Job(job) => match &self.memory_jobs {
                // In the background: an index run or a consolidation must not hold up the
                // scheduler. Overlaps are refused by the index lock and the consolidator.
                Some(jobs) => {
                    let (jobs, job, name) = (jobs.clone(), *job, entry.name.clone());
                    tokio::spawn(async move { jobs.run(job, &name).await });
                }
                None => {
                    tracing::warn!(schedule = %entry.name, job = job.as_str(), "scheduled memory job skipped: [memory] enabled = false");
                }
            },
        }
        self.ran(entry, &id, now, tz).await
    }

    /// Record that `entry` ran (or was skipped) at `now`; its next time.
    async fn ran(
        &self,
        entry: &ScheduleEntry,
        id: &str,
        now: i64,
        tz: crate::zone::Zone,
    ) -> Option<i64> {
        if let Err(e) = self.db.schedule_set_run(&entry.name, now).await {
            tracing::error!(schedule = %entry.name, error = %e, "scheduler: cannot record the run; it will not fire again for this slot");
            self.unrecorded_lock().insert(id.to_string());
            return Some(now + 30);
        }
        next_after(entry, now, &tz)
    }

    /// Run `entry`'s precheck in the exec sandbox (SPEC §20) and record what it did.
    /// `Some(stdout)`: the job runs (exit 0: with that output; another outcome: with none, and
    /// a warning); `None`: exit 1, skipped.
    async fn precheck(&self, entry: &ScheduleEntry, p: &Precheck, now: i64) -> Option<String> {
        let cfg = self.cfg.get();
        let started = std::time::Instant::now();
        let result = precheck::run(&cfg, p).await;
        let ms = started.elapsed().as_millis().min(u128::from(u64::MAX)) as u64;
        let (exit_code, stdout) = match result {
            Ok(out) => (out.exit_code, out.stdout),
            Err(e) => {
                tracing::warn!(schedule = %entry.name, error = %e, "precheck could not run; the job runs without it (check [[schedule]] precheck and [tools] exec_sandbox)");
                (None, String::new())
            }
        };
        let outcome = PrecheckOutcome::of_exit(exit_code);
        match outcome {
            PrecheckOutcome::Skip => {
                tracing::info!(schedule = %entry.name, ms, "precheck found nothing to do; job skipped, no provider call")
            }
            PrecheckOutcome::Run => {
                tracing::info!(schedule = %entry.name, ms, "precheck passed; job runs")
            }
            PrecheckOutcome::Warn => {
                tracing::warn!(schedule = %entry.name, ms, exit_code = ?exit_code, "precheck exited neither 0 nor 1 (or timed out); the job runs anyway (fix the precheck: exit 0 = run, 1 = skip)")
            }
        }
        let event = PrecheckEvent {
            schedule: entry.name.clone(),
            outcome,
            exit_code,
            ms,
            saved_usd: None,
        };
        if let Some(rec) = &self.prechecks {
            rec.record(&cfg, "system", event, now, &self.db).await;
        }
        match outcome {
            PrecheckOutcome::Skip => None,
            PrecheckOutcome::Run => Some(stdout),
            PrecheckOutcome::Warn => Some(String::new()),
        }
    }

    /// Hand a scheduled message to the target's session (source `scheduler`: delivered as
    /// written, not sent to the model), then mark it done. Idempotent by intake id.
    /// `relayed_from`: the session that scheduled it, when that is another one than the target
    /// (also for rows stored before targets were checked): the message is delivered marked as
    /// coming from it (`agent::Agent`), never as the target's assistant's words.
    async fn fire_message(&self, id: &str, target: &str, text: &str, relayed_from: Option<&str>) {
        let one_shot = !id.starts_with("schedule-");
        if one_shot && self.is_unrecorded(id) {
            // Accepted already; only marking it done failed: retry that, never the send.
            if self.db.schedule_finish(id, "done").await.is_ok() {
                self.recorded(id);
            }
            return;
        }
        let intake = Intake {
            id: if id.starts_with("schedule-") {
                id.to_string()
            } else {
                format!("sched-{id}")
            },
            source: crate::control::Source::Scheduler,
            from: target.to_string(),
            text: text.to_string(),
            tier: None,
            attachments: vec![],
            route: None,
            notify_meta: None,
            relayed_from: relayed_from.map(str::to_string),
        };
        match self.intake.accept(target, intake).await {
            Ok(_) => {
                if one_shot && let Err(e) = self.db.schedule_finish(id, "done").await {
                    tracing::error!(id, error = %e, "cannot mark scheduled message done; it will not be sent again, marking is retried");
                    self.unrecorded_lock().insert(id.to_string());
                }
            }
            Err(e) => {
                tracing::error!(id, error = %e, "scheduled message not accepted; retrying later")
            }
        }
    }
}

impl Scheduler {
    fn unrecorded_lock(&self) -> std::sync::MutexGuard<'_, std::collections::HashSet<String>> {
        self.unrecorded.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn is_unrecorded(&self, id: &str) -> bool {
        self.unrecorded_lock().contains(id)
    }

    fn recorded(&self, id: &str) {
        self.unrecorded_lock().remove(id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::DateTime;

    fn entry(when: ScheduleWhen) -> ScheduleEntry {
        ScheduleEntry {
            name: "e".into(),
            when,
            action: ScheduleAction::System("x".into()),
            precheck: None,
        }
    }

    #[test]
    fn next_fire_times() {
        let tz: crate::zone::Zone = "Europe/Berlin".parse().unwrap();
        let every = entry(ScheduleWhen::Every(Duration::from_secs(900)));
        assert_eq!(next_after(&every, 1000, &tz), Some(1900));
        // 09:00 Berlin on weekdays; from Sunday 2026-11-22 12:00 UTC → Monday 08:00 UTC.
        let cron = entry(ScheduleWhen::Cron("0 9 * * 1-5".into()));
        let sun = "2026-11-22T12:00:00Z"
            .parse::<DateTime<Utc>>()
            .unwrap()
            .timestamp();
        let mon = "2026-11-23T08:00:00Z"
            .parse::<DateTime<Utc>>()
            .unwrap()
            .timestamp();
        assert_eq!(next_after(&cron, sun, &tz), Some(mon));
        assert_eq!(
            next_after(&entry(ScheduleWhen::Cron("bad".into())), sun, &tz),
            None
        );
    }
}

#[cfg(test)]
mod missed_tests;
