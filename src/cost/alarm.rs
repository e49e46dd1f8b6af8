//! The cache alarm (SPEC §20): after every model call, the hit ratio of the last 20 calls
//! against the last 7 days. An episode starts when, with at least 20 calls, the recent ratio is
//! below half the baseline: a warning in the log, an entry in the monitor's `alerts`, and one
//! notice (to `[alerts] telegram_chat`, sent by the daemon through the outbox). It ends when the
//! recent ratio is back above 0.75 of the baseline; a later episode notifies again.

use std::sync::{Arc, Mutex};

use serde_json::json;

use crate::monitor::Monitor;
use crate::store::{CacheRatios, Db, RECENT_CALLS};

/// The baseline period: the last 7 days.
pub const BASELINE_SECS: i64 = 7 * 86_400;
/// Once the baseline has [`RECENT_CALLS`] calls behind it, it is read again at most this often:
/// it sums every call of the week (a scan that grows with the daemon's use, after every call),
/// and a minute does not move a 7-day ratio. Before that, after every call, so an early
/// baseline of a call or two (a first call only writes the cache) is not kept for a minute.
pub const BASELINE_REFRESH_SECS: i64 = 60;
/// An episode starts below this share of the baseline …
pub const START_BELOW: f64 = 0.5;
/// … and ends above this one.
pub const END_ABOVE: f64 = 0.75;

/// What an observation changed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Transition {
    Started { recent: f64, baseline: f64 },
    Ended { recent: f64, baseline: f64 },
}

/// The episode rule, pure: whether an episode is open, and what a new observation does to it.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Episode {
    pub open: bool,
}

impl Episode {
    pub fn observe(&mut self, r: &CacheRatios) -> Option<Transition> {
        let (Some(recent), Some(baseline)) = (r.hit_ratio_recent, r.hit_ratio_baseline) else {
            return None;
        };
        if !self.open
            && r.recent_calls >= u64::from(RECENT_CALLS)
            && recent < START_BELOW * baseline
        {
            self.open = true;
            return Some(Transition::Started { recent, baseline });
        }
        if self.open && recent > END_ABOVE * baseline {
            self.open = false;
            return Some(Transition::Ended { recent, baseline });
        }
        None
    }
}

/// Sends an episode's one notice (the daemon: Telegram through the outbox).
pub type Notify = Arc<dyn Fn(String) + Send + Sync>;

/// The alarm the ledger runs after each recorded model call.
pub struct CacheWatch {
    episode: Mutex<Episode>,
    /// The last baseline read and when (Unix seconds).
    baseline: Mutex<Option<(i64, Option<f64>)>>,
    monitor: Arc<Monitor>,
    notify: Option<Notify>,
}

impl std::fmt::Debug for CacheWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CacheWatch")
            .field("episode", &self.episode)
            .finish_non_exhaustive()
    }
}

impl CacheWatch {
    pub fn new(monitor: Arc<Monitor>, notify: Option<Notify>) -> CacheWatch {
        CacheWatch {
            episode: Mutex::new(Episode::default()),
            baseline: Mutex::new(None),
            monitor,
            notify,
        }
    }

    /// Read the ratios as of `now` (Unix seconds), publish them to the monitor, and act on a
    /// transition. Errors are logged: the alarm never fails a call.
    pub async fn check(&self, db: &Db, now: i64) {
        let kept = *self.baseline.lock().unwrap_or_else(|p| p.into_inner());
        let kept = kept.filter(|(at, _)| (0..BASELINE_REFRESH_SECS).contains(&(now - at)));
        let since = kept.is_none().then_some(now - BASELINE_SECS);
        let mut ratios = match db.cache_ratios(since).await {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(error = %e, "cache alarm: cannot read the hit ratios");
                return;
            }
        };
        match kept {
            Some((_, baseline)) => ratios.hit_ratio_baseline = baseline,
            // Kept only once the recent window is full: the week then holds at least as many.
            None if ratios.recent_calls >= u64::from(RECENT_CALLS) => {
                *self.baseline.lock().unwrap_or_else(|p| p.into_inner()) =
                    Some((now, ratios.hit_ratio_baseline));
            }
            None => {}
        }
        self.monitor.set_cache(json!({
            "hit_ratio_recent": ratios.hit_ratio_recent,
            "hit_ratio_baseline": ratios.hit_ratio_baseline,
            "recent_calls": ratios.recent_calls,
        }));
        let transition = self
            .episode
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .observe(&ratios);
        match transition {
            Some(Transition::Started { recent, baseline }) => {
                let message = format!(
                    "prompt cache hit ratio fell to {:.0}% over the last {RECENT_CALLS} calls (7-day baseline {:.0}%): costs are up; see agent-send --cost --by source",
                    recent * 100.0,
                    baseline * 100.0
                );
                tracing::warn!(recent, baseline, "cache alarm: {message}");
                self.monitor.set_alert(
                    "cache",
                    Some(json!({
                        "kind": "cache",
                        "since": chrono::DateTime::from_timestamp(now, 0).map(|t| t.to_rfc3339()),
                        "message": message,
                        "hit_ratio_recent": recent,
                        "hit_ratio_baseline": baseline,
                    })),
                );
                if let Some(notify) = &self.notify {
                    notify(format!("agentd: {message}"));
                }
            }
            Some(Transition::Ended { recent, baseline }) => {
                tracing::info!(recent, baseline, "cache alarm over: the hit ratio is back");
                self.monitor.set_alert("cache", None);
            }
            None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(calls: u64, recent: f64, baseline: f64) -> CacheRatios {
        CacheRatios {
            recent_calls: calls,
            hit_ratio_recent: Some(recent),
            hit_ratio_baseline: Some(baseline),
        }
    }

    #[tokio::test]
    async fn the_baseline_is_read_after_every_call_until_the_window_is_full_then_each_minute() {
        use crate::message::Usage;
        use crate::store::{CallType, CostRow};
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("agentd.db")).unwrap();
        let monitor = Arc::new(Monitor::new(dir.path().join("monitor.json")));
        let watch = CacheWatch::new(monitor.clone(), None);
        let call = |t: i64, read: u64| CostRow {
            timestamp: t,
            session_id: "s".into(),
            model: "m".into(),
            provider: "anthropic".into(),
            call_type: CallType::Chat,
            usage: Usage {
                input_tokens: 100 - read,
                cache_read_tokens: read,
                ..Usage::default()
            },
            cost_usd: 0.0,
            fallback_from: None,
            source: None,
        };
        let baseline = || monitor.snapshot()["cache"]["hit_ratio_baseline"].as_f64();
        // A first call only writes: the baseline is 0, and is not kept.
        db.insert_cost(call(1_000, 0)).await.unwrap();
        watch.check(&db, 1_000).await;
        assert_eq!(baseline(), Some(0.0));
        for t in 1_001..1_020 {
            db.insert_cost(call(t, 100)).await.unwrap();
            watch.check(&db, t).await;
        }
        // Read after each call: 19 of 20 calls read everything.
        assert!(
            (baseline().unwrap() - 0.95).abs() < 1e-9,
            "{:?}",
            baseline()
        );
        // Full window: kept for a minute, so calls without reads move only the recent ratio …
        for t in 1_020..1_040 {
            db.insert_cost(call(t, 0)).await.unwrap();
            watch.check(&db, t).await;
        }
        assert!(
            (baseline().unwrap() - 0.95).abs() < 1e-9,
            "{:?}",
            baseline()
        );
        assert_eq!(
            monitor.snapshot()["cache"]["hit_ratio_recent"].as_f64(),
            Some(0.0)
        );
        // … and read again after it: 19 of 40 calls read.
        db.insert_cost(call(1_100, 0)).await.unwrap();
        watch.check(&db, 1_100).await;
        assert!(
            (baseline().unwrap() - 1900.0 / 4100.0).abs() < 1e-9,
            "{:?}",
            baseline()
        );
    }

    #[test]
    fn episodes_start_below_half_and_end_above_three_quarters() {
        let mut e = Episode::default();
        assert_eq!(e.observe(&r(19, 0.0, 0.8)), None, "fewer than 20 calls");
        assert_eq!(
            e.observe(&r(20, 0.4, 0.8)),
            None,
            "exactly half is not below"
        );
        assert!(matches!(
            e.observe(&r(20, 0.3, 0.8)),
            Some(Transition::Started { .. })
        ));
        assert_eq!(e.observe(&r(20, 0.1, 0.8)), None, "one notice per episode");
        assert_eq!(e.observe(&r(20, 0.6, 0.8)), None, "0.75 is not above");
        assert!(matches!(
            e.observe(&r(20, 0.7, 0.8)),
            Some(Transition::Ended { .. })
        ));
        assert!(
            matches!(
                e.observe(&r(20, 0.1, 0.8)),
                Some(Transition::Started { .. })
            ),
            "a new episode notifies again"
        );
        let mut quiet = Episode::default();
        let none = CacheRatios {
            recent_calls: 30,
            hit_ratio_recent: None,
            hit_ratio_baseline: Some(0.9),
        };
        assert_eq!(quiet.observe(&none), None);
        assert_eq!(
            quiet.observe(&r(30, 0.0, 0.0)),
            None,
            "no baseline to fall from"
        );
    }
}
