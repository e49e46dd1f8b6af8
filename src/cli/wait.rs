//! Following the daemon's files after a send: the intake record of a message (SPEC §5.2), its
//! outcome (`--wait`), and the end of a reset. Everything polls files every
//! [`POLL_INTERVAL`]; a trail is parsed again only when its files changed.

use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::CliError;
use crate::report::read_index;
use crate::session::ARCHIVE_DIR;
use crate::session::event::{Event, TrailLine};
use crate::session::{self, Outcome, index, outcome_of, trail};

/// How often the session files are checked.
pub const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// Call `check` every `interval` until it returns `Some` or `timeout` has passed (`None`). The
/// last check happens at the deadline, so a result that arrives in time is never missed.
pub fn poll<T>(
    timeout: Duration,
    interval: Duration,
    mut check: impl FnMut() -> Result<Option<T>, CliError>,
) -> Result<Option<T>, CliError> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check()? {
            return Ok(Some(v));
        }
        let now = Instant::now();
        if now >= deadline {
            return Ok(None);
        }
        std::thread::sleep(interval.min(deadline - now));
    }
}

/// Re-reads one session's trail in one directory only when its files changed (names or sizes).
#[derive(Debug)]
pub struct TrailWatcher {
    dir: PathBuf,
    session_id: String,
    signature: Option<Vec<(PathBuf, u64)>>,
}

impl TrailWatcher {
    /// Watch the trail of `session_id` in `dir`.
    pub fn new(dir: &Path, session_id: &str) -> TrailWatcher {
        TrailWatcher {
            dir: dir.to_path_buf(),
            session_id: session_id.to_string(),
            signature: None,
        }
    }

    /// The session this watcher follows.
    pub fn session_id(&self) -> &str {
        &self.session_id
    }

    /// The trail's lines if its files changed since the last call (always on the first call);
    /// `None` when unchanged. Files that vanish mid-read (moved to the archive) read as absent.
    pub fn changed_lines(&mut self) -> Result<Option<Vec<TrailLine>>, CliError> {
        let sig = self.current_signature()?;
        if self.signature.as_ref() == Some(&sig) {
            return Ok(None);
        }
        let lines = match trail::read_trail(&self.dir, &self.session_id) {
            Ok(l) => l,
            // A file moved between listing and opening: treat as unchanged, look again later.
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(self.io_error(e)),
        };
        self.signature = Some(sig);
        Ok(Some(lines))
    }

    fn current_signature(&self) -> Result<Vec<(PathBuf, u64)>, CliError> {
        let files =
            trail::trail_files(&self.dir, &self.session_id).map_err(|e| self.io_error(e))?;
        let mut sig = Vec::with_capacity(files.len());
        for f in files {
            match std::fs::metadata(&f) {
                Ok(md) => sig.push((f, md.len())),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(self.io_error(e)),
            }
        }
        Ok(sig)
    }

    fn io_error(&self, e: io::Error) -> CliError {
        CliError::io(
            format!(
                "read the trail of session {} in {}",
                self.session_id,
                self.dir.display()
            ),
            e,
        )
    }
}

/// Whether `lines` hold the record of client id `id`: its intake, or the `session_model` /
/// `session_skill` event of a settings line (SPEC §18.2).
pub fn has_intake(lines: &[TrailLine], id: &str) -> bool {
    lines.iter().any(|l| match &l.event {
        Event::Intake(i) => i.id == id,
        Event::SessionModel(m) => m.id.as_deref() == Some(id),
        Event::SessionSkill(k) => k.id.as_deref() == Some(id),
        _ => false,
    })
}

/// Follows `sessions.json` and the trail of one session key until the intake of `id` shows.
#[derive(Debug)]
pub struct IntakeWatch {
    sessions_dir: PathBuf,
    key: String,
    id: String,
    live: Option<TrailWatcher>,
    archived: Option<TrailWatcher>,
}

impl IntakeWatch {
    /// Watch for the intake of client id `id` in the session of `key`.
    pub fn new(sessions_dir: &Path, key: &str, id: &str) -> IntakeWatch {
        IntakeWatch {
            sessions_dir: sessions_dir.to_path_buf(),
            key: key.to_string(),
            id: id.to_string(),
            live: None,
            archived: None,
        }
    }

    /// One check: the session id once its trail holds the intake record. A session that was
    /// archived right after the intake (a reset) is found in `.archive/`. The session of the
    /// key is the index's, or, while the index does not name the key, the newest trail whose
    /// `session` event does: the daemon writes the index in the background, after it recorded
    /// (and so acknowledged) a new session's first intake, and on a full disk it may not
    /// manage to write it until space returns.
    pub fn check(&mut self) -> Result<Option<String>, CliError> {
        let index = read_index(&self.sessions_dir)?;
        let current = match index.get(&self.key) {
            Some(entry) => Some(entry.session_id.clone()),
            None => session::unindexed_session_of(&self.sessions_dir, &index, &self.key).map_err(
                |e| {
                    CliError::io(
                        format!(
                            "look for the session of {} in {}",
                            self.key,
                            self.sessions_dir.display()
                        ),
                        e,
                    )
                },
            )?,
        };
        if let Some(id) = &current
            && self.live.as_ref().map(TrailWatcher::session_id) != Some(id)
        {
            if let Some(old) = self.live.take() {
                self.archived = Some(TrailWatcher::new(
                    &self.sessions_dir.join(ARCHIVE_DIR),
                    old.session_id(),
                ));
            }
            self.live = Some(TrailWatcher::new(&self.sessions_dir, id));
        }
        for w in [self.live.as_mut(), self.archived.as_mut()]
            .into_iter()
            .flatten()
        {
            if let Some(lines) = w.changed_lines()?
                && has_intake(&lines, &self.id)
            {
                return Ok(Some(w.session_id().to_string()));
            }
        }
        // The key vanished after we saw its session: look for it in the archive next time.
        if current.is_none()
            && let Some(old) = self.live.take()
        {
            self.archived = Some(TrailWatcher::new(
                &self.sessions_dir.join(ARCHIVE_DIR),
                old.session_id(),
            ));
        }
        Ok(None)
    }
}

/// Wait up to `timeout` for the daemon's intake record of `id` in the session of `key`; returns
/// the session id, or [`CliError::IntakeTimeout`].
pub fn wait_intake(
    sessions_dir: &Path,
    key: &str,
    id: &str,
    timeout: Duration,
) -> Result<String, CliError> {
    let mut watch = IntakeWatch::new(sessions_dir, key, id);
    poll(timeout, POLL_INTERVAL, || watch.check())?.ok_or_else(|| CliError::IntakeTimeout {
        id: id.to_string(),
        seconds: timeout.as_secs(),
    })
}

/// Wait up to `timeout` for the daemon to record session setting `id` (`--session KEY
/// --model|--skill`): the session id once its trail holds the event, or
/// [`CliError::Refused`] with the daemon's reason as soon as the monitor in `state_dir` lists
/// the id as refused (its config differs from the one this client read), or
/// [`CliError::IntakeTimeout`].
pub fn wait_setting(
    state_dir: &Path,
    sessions_dir: &Path,
    key: &str,
    id: &str,
    timeout: Duration,
) -> Result<String, CliError> {
    let mut watch = IntakeWatch::new(sessions_dir, key, id);
    let found = poll(timeout, POLL_INTERVAL, || {
        if let Some(session_id) = watch.check()? {
            return Ok(Some(session_id));
        }
        match refusal(state_dir, id) {
            Some(reason) => Err(CliError::Refused(reason)),
            None => Ok(None),
        }
    })?;
    found.ok_or_else(|| CliError::IntakeTimeout {
        id: id.to_string(),
        seconds: timeout.as_secs(),
    })
}

/// The daemon's reason for refusing control line `id`, from the monitor's `refused` list
/// (`monitor::Monitor::refused`). A monitor that is missing or being replaced reads as none.
pub fn refusal(state_dir: &Path, id: &str) -> Option<String> {
    let (_, monitor) = super::status::read_monitor(state_dir).ok()?;
    monitor
        .get("refused")?
        .as_array()?
        .iter()
        .rev()
        .find(|r| r.get("id").and_then(serde_json::Value::as_str) == Some(id))
        .map(|r| {
            r.get("error")
                .and_then(serde_json::Value::as_str)
                .unwrap_or("no reason given")
                .to_string()
        })
}

/// Follows one session's trail, live and archived, for the outcome of intake `id`.
#[derive(Debug)]
pub struct OutcomeWatch {
    id: String,
    live: TrailWatcher,
    archived: TrailWatcher,
}

impl OutcomeWatch {
    /// Watch session `session_id` in `sessions_dir` (and its `.archive/`) for the outcome of `id`.
    pub fn new(sessions_dir: &Path, session_id: &str, id: &str) -> OutcomeWatch {
        OutcomeWatch {
            id: id.to_string(),
            live: TrailWatcher::new(sessions_dir, session_id),
            archived: TrailWatcher::new(&sessions_dir.join(ARCHIVE_DIR), session_id),
        }
    }

    /// One check: the outcome, if the trail has one yet.
    pub fn check(&mut self) -> Result<Option<Outcome>, CliError> {
        for w in [&mut self.live, &mut self.archived] {
            if let Some(lines) = w.changed_lines()?
                && let Some(o) = outcome_of(&lines, &self.id)
            {
                return Ok(Some(o));
            }
        }
        Ok(None)
    }
}

/// Wait up to `timeout` for the outcome of intake `id` in session `session_id`, or
/// [`CliError::ReplyTimeout`].
pub fn wait_outcome(
    sessions_dir: &Path,
    session_id: &str,
    id: &str,
    timeout: Duration,
) -> Result<Outcome, CliError> {
    let mut watch = OutcomeWatch::new(sessions_dir, session_id, id);
    poll(timeout, POLL_INTERVAL, || watch.check())?.ok_or_else(|| CliError::ReplyTimeout {
        id: id.to_string(),
        session_id: session_id.to_string(),
        seconds: timeout.as_secs(),
    })
}

/// The session ids a reset of `target` (`all`, a key or an id) affects, per the current index.
pub fn reset_targets(index: &index::Index, target: &str) -> Vec<String> {
    if target == "all" {
        return index.values().map(|e| e.session_id.clone()).collect();
    }
    index::lookup(index, target)
        .map(|(_, e)| vec![e.session_id.clone()])
        .unwrap_or_default()
}

/// Whether none of `session_ids` is in the index any more (a key may already have a new
/// session: that counts as done).
pub fn reset_done(index: &index::Index, session_ids: &[String]) -> bool {
    !index.values().any(|e| session_ids.contains(&e.session_id))
}

/// The session ids a reset of `target` will remove, read from `sessions.json` now (before the
/// line is sent).
pub fn sessions_before_reset(sessions_dir: &Path, target: &str) -> Result<Vec<String>, CliError> {
    Ok(reset_targets(&read_index(sessions_dir)?, target))
}

/// Wait up to `timeout` until none of `session_ids` is in `sessions.json`, or
/// [`CliError::ResetTimeout`].
pub fn wait_reset(
    sessions_dir: &Path,
    target: &str,
    session_ids: &[String],
    timeout: Duration,
) -> Result<(), CliError> {
    poll(timeout, POLL_INTERVAL, || {
        Ok(reset_done(&read_index(sessions_dir)?, session_ids).then_some(()))
    })?
    .ok_or_else(|| CliError::ResetTimeout {
        target: target.to_string(),
        seconds: timeout.as_secs(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Message;
    use crate::session::event::{Intake, MessageEvent};
    use crate::session::{IndexEntry, SessionStore};
    use crate::zone::Zone;

    const ID: &str = "4a7f0d6e-1111-4c2b-8f00-000000000001";

    fn intake(id: &str) -> Event {
        Event::Intake(Intake {
            id: id.into(),
            source: crate::control::Source::User,
            from: "cli".into(),
            text: "hi".into(),
            tier: None,
            attachments: vec![],
            route: None,
            notify_meta: None,
            relayed_from: None,
        })
    }

    fn final_reply(id: &str, text: &str, silent: bool) -> Event {
        let mut m = MessageEvent::new(Message::Assistant {
            text: text.into(),
            tool_calls: vec![],
            thinking: vec![],
            usage: None,
        });
        m.is_final = true;
        m.silent = silent;
        m.reply_to = vec![id.into()];
        Event::Message(m)
    }

    fn store(dir: &Path) -> SessionStore {
        SessionStore::open(dir, Zone::utc()).unwrap()
    }

    #[test]
    fn poll_returns_early_and_times_out() {
        let mut n = 0;
        let got = poll(Duration::from_secs(5), Duration::from_millis(1), || {
            n += 1;
            Ok((n == 3).then_some(n))
        })
        .unwrap();
        assert_eq!(got, Some(3));
        let start = Instant::now();
        let none: Option<()> = poll(Duration::from_millis(60), Duration::from_millis(10), || {
            Ok(None)
        })
        .unwrap();
        assert_eq!(none, None);
        assert!(start.elapsed() >= Duration::from_millis(60));
        // Errors stop the poll at once.
        let err = poll::<()>(Duration::from_secs(5), Duration::from_millis(1), || {
            Err(CliError::NotFound("x".into()))
        });
        assert!(err.is_err());
    }

    #[test]
    fn intake_is_found_once_recorded() {
        let d = tempfile::tempdir().unwrap();
        let s = store(d.path());
        let mut watch = IntakeWatch::new(d.path(), "cli", ID);
        assert_eq!(watch.check().unwrap(), None, "no session yet");
        let h = s.get_or_create("cli", "primary").unwrap();
        s.flush_index();
        h.append(intake("someone-else")).unwrap();
        assert_eq!(watch.check().unwrap(), None, "other ids do not count");
        h.append(intake(ID)).unwrap();
        assert_eq!(watch.check().unwrap(), Some(h.id.clone()));
        // And through the timed wrapper.
        assert_eq!(
            wait_intake(d.path(), "cli", ID, Duration::from_millis(100)).unwrap(),
            h.id
        );
    }

    /// The daemon writes `sessions.json` in the background (and on a full disk may not manage
    /// to): the intake of a new session is in its trail before the index names the session.
    /// The watch finds it by the trail's `session` event, and follows the index once it names
    /// the key.
    #[test]
    fn intake_of_a_session_the_index_does_not_name_yet_is_found() {
        let d = tempfile::tempdir().unwrap();
        let s = store(d.path());
        let other = s.get_or_create("someone", "primary").unwrap();
        other.append(intake(ID)).unwrap();
        let h = s.get_or_create("cli", "primary").unwrap();
        s.flush_index();
        let written = read_index(d.path()).unwrap();
        // The moment before the index write: the trail holds no intake yet, then the intake.
        index::write_index(d.path(), &index::Index::new()).unwrap();
        let mut watch = IntakeWatch::new(d.path(), "cli", ID);
        assert_eq!(
            watch.check().unwrap(),
            None,
            "another key's intake does not count"
        );
        h.append(intake(ID)).unwrap();
        assert_eq!(watch.check().unwrap(), Some(h.id.clone()));
        index::write_index(d.path(), &written).unwrap();
        let mut watch = IntakeWatch::new(d.path(), "cli", ID);
        assert_eq!(watch.check().unwrap(), Some(h.id.clone()));
    }

    #[test]
    fn intake_of_a_session_archived_meanwhile_is_found() {
        let d = tempfile::tempdir().unwrap();
        let s = store(d.path());
        let h = s.get_or_create("cli", "primary").unwrap();
        s.flush_index();
        let mut watch = IntakeWatch::new(d.path(), "cli", ID);
        assert_eq!(watch.check().unwrap(), None);
        h.append(intake(ID)).unwrap();
        s.archive("cli", "test").unwrap();
        // First check notices the key is gone, the next one looks in the archive.
        let found = poll(Duration::from_secs(1), Duration::from_millis(1), || {
            watch.check()
        })
        .unwrap();
        assert_eq!(found, Some(h.id.clone()));
    }

    #[test]
    fn intake_timeout_names_the_id_and_exits_3() {
        let d = tempfile::tempdir().unwrap();
        let err = wait_intake(d.path(), "cli", ID, Duration::from_millis(120)).unwrap_err();
        assert!(matches!(err, CliError::IntakeTimeout { .. }));
        assert_eq!(err.exit_code(), 3);
        assert!(err.to_string().contains(ID));
    }

    #[test]
    fn outcome_reply_silent_and_failure() {
        let d = tempfile::tempdir().unwrap();
        let s = store(d.path());
        let h = s.get_or_create("cli", "primary").unwrap();
        h.append(intake("a")).unwrap();
        h.append(intake("b")).unwrap();
        h.append(intake("c")).unwrap();
        let mut wa = OutcomeWatch::new(d.path(), &h.id, "a");
        assert_eq!(wa.check().unwrap(), None);
        assert_eq!(wa.check().unwrap(), None, "unchanged trail is not re-read");
        h.append(final_reply("a", "the answer", false)).unwrap();
        assert_eq!(
            wa.check().unwrap(),
            Some(Outcome::Reply {
                text: "the answer".into(),
                silent: false
            })
        );
        h.append(final_reply("b", "NO_REPLY", true)).unwrap();
        assert_eq!(
            wait_outcome(d.path(), &h.id, "b", Duration::from_millis(100)).unwrap(),
            Outcome::Reply {
                text: "NO_REPLY".into(),
                silent: true
            }
        );
        h.append(Event::Failure {
            reply_to: vec!["c".into()],
            error: "provider down".into(),
            reply: "Sorry, something went wrong.".into(),
        })
        .unwrap();
        assert_eq!(
            wait_outcome(d.path(), &h.id, "c", Duration::from_millis(100)).unwrap(),
            Outcome::Failed {
                reply: "Sorry, something went wrong.".into(),
                error: "provider down".into()
            }
        );
    }

    #[test]
    fn outcome_in_the_archive_and_timeout() {
        let d = tempfile::tempdir().unwrap();
        let s = store(d.path());
        let h = s.get_or_create("cli", "primary").unwrap();
        h.append(intake("a")).unwrap();
        let err = wait_outcome(d.path(), &h.id, "a", Duration::from_millis(100)).unwrap_err();
        assert!(matches!(err, CliError::ReplyTimeout { .. }));
        assert_eq!(err.exit_code(), 3);
        h.append(final_reply("a", "late", false)).unwrap();
        s.archive("cli", "reset").unwrap();
        assert!(trail::trail_files(d.path(), &h.id).unwrap().is_empty());
        assert_eq!(
            wait_outcome(d.path(), &h.id, "a", Duration::from_millis(100)).unwrap(),
            Outcome::Reply {
                text: "late".into(),
                silent: false
            }
        );
    }

    #[test]
    fn reset_targets_and_completion() {
        let entry = |id: &str| IndexEntry {
            session_id: id.into(),
            created_at: 0,
        };
        let mut idx = index::Index::new();
        idx.insert("alice".into(), entry("s1"));
        idx.insert("cli".into(), entry("s2"));
        assert_eq!(reset_targets(&idx, "all"), ["s1", "s2"]);
        assert_eq!(reset_targets(&idx, "alice"), ["s1"]);
        assert_eq!(reset_targets(&idx, "s2"), ["s2"]);
        assert!(reset_targets(&idx, "nobody").is_empty());

        let before = reset_targets(&idx, "all");
        assert!(!reset_done(&idx, &before));
        idx.remove("alice");
        assert!(!reset_done(&idx, &before));
        // `cli` got a new session right after the reset: done all the same.
        idx.insert("cli".into(), entry("s3"));
        assert!(reset_done(&idx, &before));
    }

    #[test]
    fn wait_reset_follows_the_index() {
        let d = tempfile::tempdir().unwrap();
        let s = store(d.path());
        s.get_or_create("alice", "primary").unwrap();
        s.flush_index();
        let ids = sessions_before_reset(d.path(), "alice").unwrap();
        assert_eq!(ids.len(), 1);
        let err = wait_reset(d.path(), "alice", &ids, Duration::from_millis(60)).unwrap_err();
        assert!(matches!(err, CliError::ResetTimeout { .. }));
        s.archive("alice", "reset").unwrap();
        wait_reset(d.path(), "alice", &ids, Duration::from_millis(60)).unwrap();
    }
}
