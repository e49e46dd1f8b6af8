//! Start-up repair of `sessions.json` from the trails. The index is written in the background
//! (`IndexWriter`), so a `kill -9` can fall between a new session's `session` event (fsynced
//! before its first intake was acknowledged) and the index write that names it; and a reset
//! writes the index before it moves the session's files, so a kill can fall between the two.
//! Both leave files of a session the index does not name. `repair_index` reads only those
//! sessions, and of each only the first line of its first trail file and the last line of its
//! newest one.

use std::collections::{BTreeMap, HashSet};
use std::io;
use std::path::{Path, PathBuf};

use super::event::{Event, TrailLine};
use super::index::{Index, IndexEntry};
use super::{ARCHIVE_DIR, move_to_archive, session_of, trail};

/// Brings `index` in line with the trails of `dir` (SPEC §7: the trail is the record). For
/// every session id with files in `dir` that the index does not name, in id order (UUIDv7:
/// creation order):
/// - its last event is a `reset`, or `.archive/` already holds files of it: an archive that a
///   crash interrupted after its index write; the move into `.archive/` is finished;
/// - else its first line is its `session` event, whose key the index does not name: the entry
///   is added back;
/// - else that key names another session: the greater id (the newer session) keeps the key,
///   with a warning naming both; the other's files stay where they are;
/// - files without a readable `session` event are left alone, with a warning.
///
/// Returns whether `index` changed (the caller writes it).
pub(super) fn repair_index(dir: &Path, index: &mut Index) -> io::Result<bool> {
    let unindexed = unindexed_sessions(dir, index)?;
    if unindexed.is_empty() {
        return Ok(false);
    }
    let archived = session_ids(&dir.join(ARCHIVE_DIR))?;
    let mut changed = false;
    for (id, trails) in unindexed {
        if archived.contains(&id) || is_reset(&trails)? {
            move_to_archive(dir, &id)?;
            tracing::info!(session = %id, "finished archiving a session whose reset a stop interrupted");
            continue;
        }
        let first = match trails.first() {
            Some(f) => trail::first_line(f)?,
            None => {
                tracing::debug!(session = %id, "files of a session without a trail, which the index does not name: left alone");
                continue;
            }
        };
        let Some((key, created_at)) = first.as_ref().and_then(|l| session_event_of(l, &id)) else {
            tracing::warn!(
                session = %id,
                file = %trails[0].display(),
                "the trail of a session the index does not name has no readable `session` event: left alone"
            );
            continue;
        };
        let entry = IndexEntry {
            session_id: id.clone(),
            created_at,
        };
        match index.get(&key) {
            None => {
                tracing::info!(session_key = %key, session = %id, "session index repaired");
                index.insert(key, entry);
                changed = true;
            }
            Some(other) if other.session_id < id => {
                tracing::warn!(
                    session_key = %key,
                    kept = %id,
                    left = %other.session_id,
                    "two sessions claim one key; the newer keeps it, the other's files stay where they are"
                );
                index.insert(key, entry);
                changed = true;
            }
            Some(other) => tracing::warn!(
                session_key = %key,
                kept = %other.session_id,
                left = %id,
                "two sessions claim one key; the newer keeps it, the other's files stay where they are"
            ),
        }
    }
    Ok(changed)
}

/// The newest session in `dir` that `index` does not name whose trail starts with its
/// `session` event for `key`: the session of `key` while the daemon's index write (in the
/// background, a moment after the session's first intake) has not landed, or could not (a full
/// disk). For readers that follow a key, such as `agent-send` waiting for its intake record.
/// Reads the directory and the first line of each such session, newest first.
pub fn unindexed_session_of(dir: &Path, index: &Index, key: &str) -> io::Result<Option<String>> {
    let unindexed = match unindexed_sessions(dir, index) {
        Ok(u) => u,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    for (id, trails) in unindexed.into_iter().rev() {
        let Some(first) = trails.first() else {
            continue;
        };
        let line = match trail::first_line(first) {
            Ok(l) => l,
            // Moved to the archive meanwhile (a reset): not the key's session any more.
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        if line
            .as_ref()
            .and_then(|l| session_event_of(l, &id))
            .is_some_and(|(k, _)| k == key)
        {
            return Ok(Some(id));
        }
    }
    Ok(None)
}

/// The sessions with files in `dir` that `index` does not name, by id (ascending), each with
/// its trail files, oldest first (possibly none). One directory scan.
fn unindexed_sessions(dir: &Path, index: &Index) -> io::Result<BTreeMap<String, Vec<PathBuf>>> {
    let indexed: HashSet<&str> = index.values().map(|e| e.session_id.as_str()).collect();
    let mut out: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(id) = session_of(&name) else {
            continue;
        };
        if indexed.contains(id) {
            continue;
        }
        let trails = out.entry(id.to_string()).or_default();
        // Named as `trail::trail_files` names them: `<id>.<YYYY-MM-DD>.jsonl`.
        if name[id.len() + 1..]
            .strip_suffix(".jsonl")
            .is_some_and(|date| date.len() == 10)
        {
            trails.push(e.path());
        }
    }
    for trails in out.values_mut() {
        trails.sort();
    }
    Ok(out)
}

/// The ids of the sessions with files in `dir` (the archive); none if it does not exist.
fn session_ids(dir: &Path) -> io::Result<HashSet<String>> {
    let mut out = HashSet::new();
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e),
    };
    for e in rd {
        let name = e?.file_name().to_string_lossy().into_owned();
        if let Some(id) = session_of(&name) {
            out.insert(id.to_string());
        }
    }
    Ok(out)
}

/// Whether the last readable line of `trails` (oldest first) is a `reset`. Walks back over
/// files without one (a crash during a day's first write leaves an empty file).
fn is_reset(trails: &[PathBuf]) -> io::Result<bool> {
    for f in trails.iter().rev() {
        if let Some(line) = trail::last_line(f)? {
            return Ok(matches!(line.event, Event::Reset { .. }));
        }
    }
    Ok(false)
}

/// The key and creation time (Unix seconds) of session `id` from its first trail line, if that
/// is its `session` event.
fn session_event_of(line: &TrailLine, id: &str) -> Option<(String, i64)> {
    let Event::Session {
        session_id, key, ..
    } = &line.event
    else {
        return None;
    };
    if session_id != id || key.is_empty() {
        return None;
    }
    let created_at = chrono::DateTime::parse_from_rfc3339(&line.ts)
        .map(|t| t.timestamp())
        .unwrap_or_else(|_| chrono::Utc::now().timestamp());
    Some((key.clone(), created_at))
}

#[cfg(test)]
mod tests {
    use super::super::{SessionStore, TrailWriter, index};
    use super::*;
    use crate::zone::Zone;

    /// Session ids in creation order (UUIDv7 shape, fixed so the order is known).
    const OLDER: &str = "01900000-0000-7000-8000-000000000001";
    const NEWER: &str = "01900000-0000-7000-8000-000000000002";

    fn intake(id: &str) -> Event {
        Event::Intake(super::super::Intake {
            id: id.into(),
            source: crate::control::Source::User,
            from: "alice".into(),
            text: format!("text {id}"),
            tier: None,
            attachments: vec![],
            route: None,
            notify_meta: None,
            relayed_from: None,
        })
    }

    /// A trail for session `id` of `key` with a `session` event and one intake, written as the
    /// daemon writes it, but not indexed.
    fn unindexed_trail(dir: &Path, id: &str, key: &str) {
        let mut w = TrailWriter::open(dir, id, Zone::utc()).unwrap();
        w.append(Event::Session {
            session_id: id.into(),
            key: key.into(),
            model: "primary".into(),
        })
        .unwrap();
        w.append(intake("i1")).unwrap();
    }

    fn on_disk(dir: &Path) -> Index {
        index::read_index(dir).unwrap()
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut n: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        n.sort();
        n
    }

    /// A kill -9 between the `session` event and the index write: the start indexes the
    /// session again, on disk, and it keeps its trail.
    #[test]
    fn an_unindexed_trail_with_its_session_event_is_indexed_again() {
        let d = tempfile::tempdir().unwrap();
        let store = SessionStore::open(d.path(), Zone::utc()).unwrap();
        let kept = store.get_or_create("bob", "primary").unwrap().id.clone();
        let lost = store.get_or_create("alice", "primary").unwrap().id.clone();
        drop(store);
        // The window: the index on disk does not name alice yet.
        let mut idx = on_disk(d.path());
        idx.remove("alice");
        index::write_index(d.path(), &idx).unwrap();

        let store = SessionStore::open(d.path(), Zone::utc()).unwrap();
        for i in [store.index(), on_disk(d.path())] {
            assert_eq!(i["alice"].session_id, lost);
            assert_eq!(i["bob"].session_id, kept);
            assert!(i["alice"].created_at > 0);
        }
        let h = store.get("alice").unwrap().unwrap();
        assert_eq!(h.id, lost);
        assert_eq!(h.read_trail().unwrap().len(), 1, "the session event");
    }

    /// A kill -9 after a reset's index write, before the files moved: the start finishes the
    /// move, also when some files were moved already.
    #[test]
    fn a_trail_ending_in_reset_is_moved_to_the_archive() {
        let d = tempfile::tempdir().unwrap();
        let store = SessionStore::open(d.path(), Zone::utc()).unwrap();
        let whole = store.get_or_create("alice", "primary").unwrap();
        whole.append(intake("a")).unwrap();
        whole
            .append(Event::Reset {
                reason: "test".into(),
            })
            .unwrap();
        let half = store.get_or_create("bob", "primary").unwrap();
        half.queue_snapshot(half.load_state("primary").unwrap());
        store.flush_snapshots();
        let (whole, half) = (whole.id.clone(), half.id.clone());
        drop(store);
        // Both index entries gone (the reset's index write); bob's snapshot already moved
        // (its trail does not end in a reset: the archive holding a file of it says enough).
        index::write_index(d.path(), &Index::new()).unwrap();
        let archive = d.path().join(ARCHIVE_DIR);
        let snap = format!("{half}.state.json");
        std::fs::rename(d.path().join(&snap), archive.join(&snap)).unwrap();

        let store = SessionStore::open(d.path(), Zone::utc()).unwrap();
        assert!(store.index().is_empty());
        assert_eq!(
            names(d.path()),
            [".archive", "sessions.json"],
            "every file moved"
        );
        let lines = trail::read_trail(&archive, &whole).unwrap();
        assert!(matches!(lines.last().unwrap().event, Event::Reset { .. }));
        assert_eq!(trail::read_trail(&archive, &half).unwrap().len(), 1);
        assert!(archive.join(&snap).exists());
    }

    /// Two sessions claim one key: the newer keeps it, whichever of them the index named, and
    /// the other's files stay where they are.
    #[test]
    fn a_key_clash_is_won_by_the_newer_session() {
        for indexed in [OLDER, NEWER] {
            let d = tempfile::tempdir().unwrap();
            unindexed_trail(d.path(), OLDER, "alice");
            unindexed_trail(d.path(), NEWER, "alice");
            let mut idx = Index::new();
            idx.insert(
                "alice".into(),
                IndexEntry {
                    session_id: indexed.into(),
                    created_at: 1,
                },
            );
            index::write_index(d.path(), &idx).unwrap();

            let store = SessionStore::open(d.path(), Zone::utc()).unwrap();
            assert_eq!(
                store.index()["alice"].session_id,
                NEWER,
                "{indexed} indexed"
            );
            assert_eq!(on_disk(d.path())["alice"].session_id, NEWER);
            assert_eq!(trail::read_trail(d.path(), OLDER).unwrap().len(), 2);
            assert!(names(&d.path().join(ARCHIVE_DIR)).is_empty());
        }
    }

    /// Readers that follow a key find its session before the index names it: the newest
    /// unindexed trail whose `session` event names the key, never an indexed one.
    #[test]
    fn the_unindexed_session_of_a_key_is_the_newest_one_naming_it() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(
            unindexed_session_of(&d.path().join("none"), &Index::new(), "alice").unwrap(),
            None
        );
        unindexed_trail(d.path(), OLDER, "alice");
        unindexed_trail(d.path(), NEWER, "alice");
        let mut idx = Index::new();
        assert_eq!(
            unindexed_session_of(d.path(), &idx, "alice")
                .unwrap()
                .as_deref(),
            Some(NEWER)
        );
        assert_eq!(unindexed_session_of(d.path(), &idx, "bob").unwrap(), None);
        idx.insert(
            "x".into(),
            IndexEntry {
                session_id: NEWER.into(),
                created_at: 1,
            },
        );
        assert_eq!(
            unindexed_session_of(d.path(), &idx, "alice")
                .unwrap()
                .as_deref(),
            Some(OLDER)
        );
    }

    /// Nothing to repair: nothing is read beyond the directory listing, nothing is written.
    #[test]
    fn an_index_that_names_every_trail_is_left_as_it_is() {
        let d = tempfile::tempdir().unwrap();
        unindexed_trail(d.path(), OLDER, "alice");
        let mut idx = Index::new();
        idx.insert(
            "alice".into(),
            IndexEntry {
                session_id: OLDER.into(),
                created_at: 1,
            },
        );
        assert!(!repair_index(d.path(), &mut idx).unwrap());
        assert_eq!(idx["alice"].created_at, 1);
    }

    /// A trail that does not start with its own `session` event (damage, a file planted under
    /// another id) says nothing about whose it is: left alone, not indexed.
    #[test]
    fn a_trail_without_its_session_event_is_left_alone() {
        let d = tempfile::tempdir().unwrap();
        unindexed_trail(d.path(), NEWER, "alice");
        let f = trail::trail_files(d.path(), NEWER).unwrap().remove(0);
        let text = std::fs::read_to_string(&f).unwrap();
        // The session event names another id.
        std::fs::write(&f, text.replacen(NEWER, OLDER, 1)).unwrap();
        // And a trail whose first line is damaged.
        std::fs::write(
            d.path().join(format!("{OLDER}.2026-11-01.jsonl")),
            "{not json\n",
        )
        .unwrap();
        let mut idx = Index::new();
        assert!(!repair_index(d.path(), &mut idx).unwrap());
        assert!(idx.is_empty());
        assert_eq!(
            names(d.path()).len(),
            2,
            "nothing moved: {:?}",
            names(d.path())
        );
    }
}
