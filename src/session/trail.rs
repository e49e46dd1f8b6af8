//! Append-only daily JSONL trail files `<id>.<YYYY-MM-DD>.jsonl` (SPEC §7): every event is one
//! line written with a single write and fsynced before the caller moves on. Reading tolerates a
//! torn last line (a crash mid-write); the writer truncates such a tail before appending.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, BufReader, Read, Seek, SeekFrom};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::zone::Zone;
use chrono::{DateTime, SecondsFormat, Utc};

use super::event::{Event, TRAIL_VERSION, TrailLine};
use crate::fsutil;

/// Writer of one session's trail. Not shared between threads by itself: `SessionHandle` wraps
/// it in a mutex.
#[derive(Debug)]
pub struct TrailWriter {
    dir: PathBuf,
    id: String,
    tz: Zone,
    current: Option<(String, File)>,
    next_seq: u64,
}

impl TrailWriter {
    /// Open the trail of session `id` in `dir`: find the last sequence number and repair a torn
    /// tail of the newest file.
    pub fn open(dir: &Path, id: &str, tz: Zone) -> io::Result<TrailWriter> {
        let files = trail_files(dir, id)?;
        if let Some(last) = files.last() {
            truncate_torn_tail(last)?;
        }
        // The newest file may be empty (a crash during the first write of a new day, a full
        // disk): walk back until a line is found, so `seq` never goes backwards.
        let mut next_seq = 1;
        for f in files.iter().rev() {
            if let Some(line) = last_line(f)? {
                next_seq = line.seq + 1;
                break;
            }
        }
        Ok(TrailWriter {
            dir: dir.to_path_buf(),
            id: id.to_string(),
            tz,
            current: None,
            next_seq,
        })
    }

    /// Append `event` (durably) and return the line as written.
    pub fn append(&mut self, event: Event) -> io::Result<TrailLine> {
        self.append_at(event, Utc::now())
    }

    pub fn append_at(&mut self, event: Event, now: DateTime<Utc>) -> io::Result<TrailLine> {
        let local = now.with_timezone(&self.tz);
        let line = TrailLine {
            v: TRAIL_VERSION,
            seq: self.next_seq,
            ts: local.to_rfc3339_opts(SecondsFormat::Millis, false),
            event,
        };
        let bytes = serde_json::to_vec(&line).map_err(io::Error::other)?;
        let date = local.format("%Y-%m-%d").to_string();
        let file = self.file_for(&date)?;
        if let Err(e) = fsutil::append_line_fsync(file, &bytes) {
            // The failed line was cut back (best effort); reopening repairs the tail if that
            // failed too, so the next line never lands on half of this one. A file left empty
            // (the first line of a session or of a day, refused on a full disk) is removed:
            // each retry would otherwise leave one more behind.
            if file.metadata().is_ok_and(|m| m.len() == 0)
                && let Some((date, _)) = self.current.take()
            {
                let path = self.dir.join(format!("{}.{}.jsonl", self.id, date));
                if fs::remove_file(path).is_ok() {
                    let _ = fsutil::fsync_dir(&self.dir);
                }
            }
            self.current = None;
            return Err(e);
        }
        self.next_seq += 1;
        Ok(line)
    }

    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    fn file_for(&mut self, date: &str) -> io::Result<&mut File> {
        let stale = !matches!(&self.current, Some((d, _)) if d == date);
        if stale {
            let path = self.dir.join(format!("{}.{}.jsonl", self.id, date));
            let existed = path.exists();
            if existed {
                truncate_torn_tail(&path)?;
            }
            let f = OpenOptions::new()
                .create(true)
                .append(true)
                .mode(0o600)
                .open(&path)?;
            if !existed {
                fsutil::fsync_dir(&self.dir)?;
            }
            self.current = Some((date.to_string(), f));
        }
        Ok(&mut self.current.as_mut().expect("just set").1)
    }
}

/// Trail files of a session, oldest first.
pub fn trail_files(dir: &Path, id: &str) -> io::Result<Vec<PathBuf>> {
    let prefix = format!("{id}.");
    let mut out = Vec::new();
    let rd = match fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e),
    };
    for entry in rd {
        let entry = entry?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if let Some(rest) = name.strip_prefix(&prefix)
            && let Some(date) = rest.strip_suffix(".jsonl")
            && date.len() == 10
        {
            out.push(entry.path());
        }
    }
    out.sort();
    Ok(out)
}

impl super::SessionStore {
    /// Session `id`'s trail, live or archived, and its key while it is live; `None` when no
    /// trail of that id exists. `id` must be a session id (a UUID), never outside text.
    pub fn trail_by_id(&self, id: &str) -> io::Result<Option<(Option<String>, Vec<TrailLine>)>> {
        if uuid::Uuid::parse_str(id).is_err() {
            return Ok(None);
        }
        let key = (self.lock().index.iter())
            .find(|(_, e)| e.session_id == id)
            .map(|(k, _)| k.clone());
        // Live, then archived, then live again: an archive moving the files between the first
        // two reads finds them in one of the three.
        let archive = self.dir.join(super::ARCHIVE_DIR);
        for dir in [&self.dir, &archive, &self.dir] {
            let lines = read_trail(dir, id)?;
            if !lines.is_empty() {
                return Ok(Some((key, lines)));
            }
        }
        Ok(None)
    }
}

/// Every readable line of the session's trail, oldest first. Lines that do not parse (a torn
/// last line, or damage) are skipped with a warning; they never stop the read.
pub fn read_trail(dir: &Path, id: &str) -> io::Result<Vec<TrailLine>> {
    let mut out = Vec::new();
    for f in trail_files(dir, id)? {
        read_file_into(&f, &mut out)?;
    }
    Ok(out)
}

/// Lines with `seq > after`. Only the files that can hold them are read: walking back from
/// the newest, up to the first whose first line is at or below `after + 1` (`seq` increases
/// across files, oldest first). Lines at or below `after` are only probed for their `seq`, not
/// built: loading a session whose snapshot is recent costs about a day's file, not a parse of
/// its whole history.
pub fn read_trail_after(dir: &Path, id: &str, after: u64) -> io::Result<Vec<TrailLine>> {
    let files = trail_files(dir, id)?;
    let mut start = 0;
    for (i, f) in files.iter().enumerate().rev() {
        if first_seq(f)?.is_some_and(|seq| seq <= after.saturating_add(1)) {
            start = i;
            break;
        }
    }
    let mut out = Vec::new();
    for f in &files[start..] {
        let mut newer = false;
        for_each_line(f, |n, line| {
            // Once a line is newer, every later one is too: parse without probing. A line
            // that cannot be probed (damage) proves nothing and is left to `push_parsed`.
            if !newer {
                match serde_json::from_slice::<Probe>(line) {
                    Ok(p) if p.seq <= after => return,
                    Ok(_) => newer = true,
                    Err(_) => {}
                }
            }
            push_parsed(f, n, line, &mut out);
        })?;
    }
    Ok(out)
}

/// The `seq` of the first non-blank line of `path`; `None` for an empty file or an unreadable
/// first line (the caller then reads further back).
fn first_seq(path: &Path) -> io::Result<Option<u64>> {
    Ok(first_nonblank(path, u64::MAX)?
        .and_then(|line| serde_json::from_slice::<Probe>(&line).ok())
        .map(|p| p.seq))
}

/// The first non-blank line of `path` within its first `max` bytes (`None`: none there).
fn first_nonblank(path: &Path, max: u64) -> io::Result<Option<Vec<u8>>> {
    let mut reader = BufReader::new(File::open(path)?.take(max));
    let mut line = Vec::new();
    loop {
        line.clear();
        if reader.read_until(b'\n', &mut line)? == 0 {
            return Ok(None);
        }
        if !line.iter().all(u8::is_ascii_whitespace) {
            return Ok(Some(line));
        }
    }
}

/// The ids of the session's `intake` events (for idempotent intake), without building the
/// other events.
pub fn intake_ids(dir: &Path, id: &str) -> io::Result<std::collections::HashSet<String>> {
    let mut out = std::collections::HashSet::new();
    for f in trail_files(dir, id)? {
        intake_ids_of(&f, &mut |id| {
            out.insert(id);
        })?;
    }
    Ok(out)
}

/// The ids of the session's last `max` intakes, oldest first: the trail files are read from
/// the newest back only until that many are found.
pub fn recent_intake_ids(dir: &Path, id: &str, max: usize) -> io::Result<Vec<String>> {
    let mut newest_first: Vec<Vec<String>> = Vec::new();
    let mut found = 0;
    for f in trail_files(dir, id)?.iter().rev() {
        if found >= max {
            break;
        }
        let mut ids = Vec::new();
        intake_ids_of(f, &mut |id| ids.push(id))?;
        found += ids.len();
        newest_first.push(ids);
    }
    let all: Vec<String> = newest_first.into_iter().rev().flatten().collect();
    let skip = all.len().saturating_sub(max);
    Ok(all.into_iter().skip(skip).collect())
}

fn intake_ids_of(path: &Path, f: &mut impl FnMut(String)) -> io::Result<()> {
    for_each_line(path, |_, line| {
        if let Ok(Probe {
            kind: Some(kind),
            id: Some(id),
            ..
        }) = serde_json::from_slice::<Probe>(line)
            && kind == "intake"
        {
            f(id);
        }
    })
}

/// The fields the quick scans need; serde skips the rest of the line without building it.
#[derive(serde::Deserialize)]
struct Probe {
    #[serde(default)]
    seq: u64,
    #[serde(rename = "type", default)]
    kind: Option<String>,
    #[serde(default)]
    id: Option<String>,
}

/// Calls `f(line number, bytes)` for every non-blank line of `path`.
fn for_each_line(path: &Path, mut f: impl FnMut(usize, &[u8])) -> io::Result<()> {
    let mut reader = BufReader::new(File::open(path)?);
    let mut line = Vec::new();
    let mut n = 0;
    loop {
        line.clear();
        if reader.read_until(b'\n', &mut line)? == 0 {
            return Ok(());
        }
        n += 1;
        let text = line.strip_suffix(b"\n").unwrap_or(&line);
        if !text.iter().all(u8::is_ascii_whitespace) {
            f(n, text);
        }
    }
}

fn push_parsed(path: &Path, n: usize, line: &[u8], out: &mut Vec<TrailLine>) {
    match serde_json::from_slice::<TrailLine>(line) {
        Ok(l) => out.push(l),
        Err(e) => tracing::warn!(
            file = %path.display(),
            line = n,
            error = %e,
            "skipping unreadable trail line"
        ),
    }
}

fn read_file_into(path: &Path, out: &mut Vec<TrailLine>) -> io::Result<()> {
    for_each_line(path, |n, line| push_parsed(path, n, line, out))
}

/// The `seq` of the last readable line of the session's newest trail file; `None` when that
/// file holds none.
pub fn last_seq(dir: &Path, id: &str) -> io::Result<Option<u64>> {
    match trail_files(dir, id)?.last() {
        Some(newest) => Ok(last_line(newest)?.map(|l| l.seq)),
        None => Ok(None),
    }
}

/// The first read from the end of a file by [`last_line`]; each further read doubles.
const TAIL_CHUNK: u64 = 16 * 1024;

/// The last readable line of `path`, read from the end: only the bytes from its last readable
/// line on are read (opening a session's trail for appending, or the start-up repair of the
/// index, must not cost a read of the whole day). Lines that do not parse (a torn tail,
/// damage) are skipped, as a full read skips them.
pub(super) fn last_line(path: &Path) -> io::Result<Option<TrailLine>> {
    let mut f = File::open(path)?;
    // `buf` holds the file's bytes from `start`; `buf[..untried]` holds the lines not tried yet.
    let mut start = f.metadata()?.len();
    let mut buf: Vec<u8> = Vec::new();
    let mut untried = 0;
    let mut chunk = TAIL_CHUNK;
    while start > 0 {
        let n = chunk.min(start);
        start -= n;
        chunk = chunk.saturating_mul(2);
        let mut head = vec![0; usize::try_from(n).map_err(io::Error::other)?];
        f.seek(SeekFrom::Start(start))?;
        f.read_exact(&mut head)?;
        buf.truncate(untried);
        head.extend_from_slice(&buf);
        buf = head;
        untried += n as usize;
        // Every line whose start is in `buf` now, newest first.
        loop {
            let line_start = match buf[..untried].iter().rposition(|&b| b == b'\n') {
                Some(p) => p + 1,
                None if start == 0 => 0,
                None => break,
            };
            let line = &buf[line_start..untried];
            if !line.iter().all(u8::is_ascii_whitespace)
                && let Ok(l) = serde_json::from_slice::<TrailLine>(line)
            {
                return Ok(Some(l));
            }
            if line_start == 0 {
                return Ok(None);
            }
            untried = line_start - 1;
        }
    }
    Ok(None)
}

/// The most a [`first_line`] reads: a `session` event (ids, the key, the model) is far smaller.
const FIRST_LINE_MAX: u64 = 64 * 1024;

/// The first non-blank line of `path` if it parses and is at most [`FIRST_LINE_MAX`] bytes
/// long: the `session` event of a session's first trail file. `None` otherwise (an empty file,
/// damage, an overlong line): the caller cannot tell whose trail this is.
pub(super) fn first_line(path: &Path) -> io::Result<Option<TrailLine>> {
    Ok(first_nonblank(path, FIRST_LINE_MAX)?
        .and_then(|line| serde_json::from_slice::<TrailLine>(&line).ok()))
}

/// If the file does not end with a newline, cut it back to the last newline
/// ([`fsutil::cut_torn_tail`]): that tail is a write the crash interrupted, never acknowledged.
fn truncate_torn_tail(path: &Path) -> io::Result<()> {
    let mut f = OpenOptions::new().read(true).write(true).open(path)?;
    let dropped = fsutil::cut_torn_tail(&mut f)?;
    if dropped > 0 {
        tracing::warn!(file = %path.display(), dropped_bytes = dropped, "truncating torn trail tail");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Message;
    use crate::session::event::MessageEvent;
    use std::io::Write;

    /// The `seq`s `read_trail_after` gives for session s1.
    fn seqs_after(dir: &Path, after: u64) -> Vec<u64> {
        let lines = read_trail_after(dir, "s1", after).unwrap();
        lines.iter().map(|l| l.seq).collect()
    }

    /// The `seq`s above `after` of a full read.
    fn seqs_of(all: &[TrailLine], after: u64) -> Vec<u64> {
        all.iter().map(|l| l.seq).filter(|s| *s > after).collect()
    }

    fn ev(text: &str) -> Event {
        Event::Message(MessageEvent::new(Message::user_text(text)))
    }

    #[test]
    fn scans_agree_with_a_full_read() {
        let d = tempfile::tempdir().unwrap();
        let mut w = TrailWriter::open(d.path(), "s1", Zone::utc()).unwrap();
        for n in 0..6 {
            w.append(Event::Intake(crate::session::Intake {
                id: format!("in-{n}"),
                source: crate::control::Source::User,
                from: "alice".into(),
                text: format!("message {n}, with an \"id\": \"not-this\""),
                tier: None,
                attachments: vec![],
                route: None,
                notify_meta: None,
                relayed_from: None,
            }))
            .unwrap();
            w.append(ev(&format!("turn {n}"))).unwrap();
        }
        drop(w);
        // A damaged line in the middle is skipped by every reader.
        let f = trail_files(d.path(), "s1").unwrap().remove(0);
        let text = fs::read_to_string(&f).unwrap();
        let mut lines: Vec<&str> = text.lines().collect();
        lines.insert(5, "{not json");
        fs::write(&f, lines.join("\n") + "\n").unwrap();

        let all = read_trail(d.path(), "s1").unwrap();
        assert_eq!(all.len(), 12);
        for after in [0, 1, 5, 11, 12, 40] {
            assert_eq!(
                seqs_after(d.path(), after),
                seqs_of(&all, after),
                "after {after}"
            );
        }
        let mut ids: Vec<String> = intake_ids(d.path(), "s1").unwrap().into_iter().collect();
        ids.sort();
        assert_eq!(ids, (0..6).map(|n| format!("in-{n}")).collect::<Vec<_>>());
        assert_eq!(last_line(&f).unwrap().map(|l| l.seq), Some(12));
    }

    #[test]
    fn reading_after_a_seq_skips_older_files_and_agrees_with_a_full_read() {
        let d = tempfile::tempdir().unwrap();
        let mut w = TrailWriter::open(d.path(), "s1", Zone::utc()).unwrap();
        for (day, n) in [(1, 3), (2, 4), (4, 2)] {
            let at = chrono::DateTime::parse_from_rfc3339(&format!("2026-11-0{day}T10:00:00Z"))
                .unwrap()
                .to_utc();
            for _ in 0..n {
                w.append_at(ev("x"), at).unwrap();
            }
        }
        drop(w);
        // An empty file between days (a crash during a day's first write) changes nothing.
        fs::write(d.path().join("s1.2026-11-03.jsonl"), "").unwrap();
        let all = read_trail(d.path(), "s1").unwrap();
        assert_eq!(all.len(), 9);
        for after in 0..=10 {
            assert_eq!(
                seqs_after(d.path(), after),
                seqs_of(&all, after),
                "after {after}"
            );
        }
        // The first day's file is not read when the snapshot is past it: a line planted there
        // with a high seq would otherwise come back.
        let first = d.path().join("s1.2026-11-01.jsonl");
        let planted = TrailLine {
            v: TRAIL_VERSION,
            seq: 100,
            ts: "2026-11-01T10:00:00.000+00:00".into(),
            event: ev("planted"),
        };
        fs::write(&first, serde_json::to_string(&planted).unwrap() + "\n").unwrap();
        assert_eq!(seqs_after(d.path(), 3), [4, 5, 6, 7, 8, 9]);
    }

    #[test]
    fn appends_with_increasing_seq_and_reopens() {
        let d = tempfile::tempdir().unwrap();
        let mut w = TrailWriter::open(d.path(), "s1", Zone::utc()).unwrap();
        w.append(ev("a")).unwrap();
        w.append(ev("b")).unwrap();
        drop(w);
        let mut w = TrailWriter::open(d.path(), "s1", Zone::utc()).unwrap();
        assert_eq!(w.next_seq(), 3);
        w.append(ev("c")).unwrap();
        let lines = read_trail(d.path(), "s1").unwrap();
        assert_eq!(lines.iter().map(|l| l.seq).collect::<Vec<_>>(), [1, 2, 3]);
    }

    #[test]
    fn daily_files_use_the_configured_zone() {
        let d = tempfile::tempdir().unwrap();
        let tz: Zone = "Europe/Berlin".parse().unwrap();
        let mut w = TrailWriter::open(d.path(), "s1", tz).unwrap();
        // 23:30 UTC on Nov 3 is 00:30 on Nov 4 in Berlin.
        let t = "2026-11-03T23:30:00Z".parse::<DateTime<Utc>>().unwrap();
        w.append_at(ev("a"), t).unwrap();
        w.append_at(ev("b"), t - chrono::Duration::hours(2))
            .unwrap();
        let files = trail_files(d.path(), "s1").unwrap();
        let names: Vec<_> = files
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["s1.2026-11-03.jsonl", "s1.2026-11-04.jsonl"]);
        // Other sessions' files with a shared prefix are not picked up.
        fs::write(d.path().join("s10.2026-11-03.jsonl"), "").unwrap();
        assert_eq!(trail_files(d.path(), "s1").unwrap().len(), 2);
    }

    #[test]
    fn seq_continues_past_an_empty_newest_file() {
        let d = tempfile::tempdir().unwrap();
        let mut w = TrailWriter::open(d.path(), "s1", Zone::utc()).unwrap();
        w.append_at(ev("a"), "2026-11-03T10:00:00Z".parse().unwrap())
            .unwrap();
        w.append_at(ev("b"), "2026-11-03T10:00:01Z".parse().unwrap())
            .unwrap();
        drop(w);
        // A crash during the first write of the next day leaves an empty file.
        fs::write(d.path().join("s1.2026-11-04.jsonl"), "").unwrap();
        let w = TrailWriter::open(d.path(), "s1", Zone::utc()).unwrap();
        assert_eq!(w.next_seq(), 3);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

        /// Whatever a crash or a bad disk leaves after the last complete line — half a line,
        /// NUL bytes, invalid UTF-8, whole lines of garbage — every line written before is read
        /// back in order, and after the writer reopens (repairing a torn tail) its next line is
        /// read back too, with the next sequence number.
        #[test]
        fn damaged_tails_keep_every_complete_line(
            n in 1usize..6,
            damage in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200),
            terminated in proptest::prelude::any::<bool>(),
        ) {
            let d = tempfile::tempdir().unwrap();
            let mut w = TrailWriter::open(d.path(), "s1", Zone::utc()).unwrap();
            let written: Vec<TrailLine> = (0..n).map(|i| w.append(ev(&format!("m{i}"))).unwrap()).collect();
            drop(w);
            let f = trail_files(d.path(), "s1").unwrap().pop().unwrap();
            let mut fh = OpenOptions::new().append(true).open(&f).unwrap();
            fh.write_all(&damage).unwrap();
            if terminated {
                fh.write_all(b"\n").unwrap();
            }
            drop(fh);
            let read = read_trail(d.path(), "s1").unwrap();
            proptest::prop_assert_eq!(&read[..n], &written[..]);
            let mut w = TrailWriter::open(d.path(), "s1", Zone::utc()).unwrap();
            let after = w.append(ev("after")).unwrap();
            proptest::prop_assert_eq!(after.seq, n as u64 + 1);
            let read = read_trail(d.path(), "s1").unwrap();
            proptest::prop_assert_eq!(read.last(), Some(&after));
            proptest::prop_assert_eq!(&read[..n], &written[..]);
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(32))]

        /// Reading from the end finds the line a full read finds last, whatever the line
        /// lengths (across the first chunk and the doubled ones), damaged lines among them and
        /// whatever follows the last one.
        #[test]
        fn the_last_line_read_from_the_end_is_the_last_of_a_full_read(
            lens in proptest::collection::vec(0usize..40_000, 0..6),
            damaged in proptest::collection::vec(proptest::prelude::any::<bool>(), 6),
            tail in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..100),
        ) {
            let d = tempfile::tempdir().unwrap();
            let f = d.path().join("s1.2026-11-01.jsonl");
            let mut bytes = Vec::new();
            for (i, len) in lens.iter().enumerate() {
                if damaged[i] {
                    bytes.extend_from_slice(&vec![b'x'; *len]);
                } else {
                    let line = TrailLine {
                        v: TRAIL_VERSION,
                        seq: i as u64 + 1,
                        ts: "2026-11-01T10:00:00.000+00:00".into(),
                        event: ev(&"y".repeat(*len)),
                    };
                    bytes.extend_from_slice(&serde_json::to_vec(&line).unwrap());
                }
                bytes.push(b'\n');
            }
            bytes.extend_from_slice(&tail);
            fs::write(&f, &bytes).unwrap();
            let mut all = Vec::new();
            read_file_into(&f, &mut all).unwrap();
            proptest::prop_assert_eq!(last_line(&f).unwrap(), all.pop());
        }
    }

    #[test]
    fn the_first_line_is_read_up_to_a_bound() {
        let d = tempfile::tempdir().unwrap();
        let mut w = TrailWriter::open(d.path(), "s1", Zone::utc()).unwrap();
        let first = w.append(ev("a")).unwrap();
        w.append(ev("b")).unwrap();
        let f = trail_files(d.path(), "s1").unwrap().remove(0);
        assert_eq!(first_line(&f).unwrap(), Some(first));
        // Damage, or a first line longer than any `session` event, names nobody.
        fs::write(&f, "{not json\n").unwrap();
        assert_eq!(first_line(&f).unwrap(), None);
        let long = TrailLine {
            v: TRAIL_VERSION,
            seq: 1,
            ts: "2026-11-01T10:00:00.000+00:00".into(),
            event: ev(&"z".repeat(FIRST_LINE_MAX as usize)),
        };
        fs::write(&f, serde_json::to_string(&long).unwrap() + "\n").unwrap();
        assert_eq!(first_line(&f).unwrap(), None);
        fs::write(&f, "").unwrap();
        assert_eq!(first_line(&f).unwrap(), None);
    }

    #[test]
    fn reopening_after_a_failed_append_repairs_the_tail() {
        let d = tempfile::tempdir().unwrap();
        let mut w = TrailWriter::open(d.path(), "s1", Zone::utc()).unwrap();
        w.append(ev("a")).unwrap();
        // A failed append whose cut-back failed too leaves half a line; the writer dropped its
        // handle, so the next append reopens the file and repairs it first.
        let f = trail_files(d.path(), "s1").unwrap().pop().unwrap();
        let mut fh = OpenOptions::new().append(true).open(&f).unwrap();
        fh.write_all(br#"{"v":1,"seq":2,"ts":"x","type":"mess"#)
            .unwrap();
        w.current = None;
        w.append(ev("b")).unwrap();
        let lines = read_trail(d.path(), "s1").unwrap();
        assert_eq!(lines.iter().map(|l| l.seq).collect::<Vec<_>>(), [1, 2]);
    }

    /// Set by [`a_refused_first_line_leaves_no_empty_file`] for its child.
    const REFUSED_DIR: &str = "AGENTD_TEST_REFUSED_TRAIL_DIR";

    /// The first line of a day (or of a session) refused by a full disk leaves no empty file
    /// behind, and the line of the day before is still there.
    #[test]
    fn a_refused_first_line_leaves_no_empty_file() {
        let d = tempfile::tempdir().unwrap();
        let day1 = chrono::DateTime::parse_from_rfc3339("2026-11-01T10:00:00Z").unwrap();
        let mut w = TrailWriter::open(d.path(), "s1", Zone::utc()).unwrap();
        w.append_at(ev("a"), day1.to_utc()).unwrap();
        drop(w);
        crate::fsutil::tests::run_in_child(
            "session::trail::tests::refused_first_line_child",
            REFUSED_DIR,
            d.path(),
        );
        let files = trail_files(d.path(), "s1").unwrap();
        assert_eq!(files.len(), 1, "{files:?}");
        let lines = read_trail(d.path(), "s1").unwrap();
        assert_eq!(lines.iter().map(|l| l.seq).collect::<Vec<_>>(), [1]);
    }

    /// The child of [`a_refused_first_line_leaves_no_empty_file`]: with writes limited to the
    /// size of the existing file, the next day's first line fails.
    #[test]
    fn refused_first_line_child() {
        let Some(dir) = std::env::var_os(REFUSED_DIR) else {
            return;
        };
        let dir = Path::new(&dir);
        let day2 = chrono::DateTime::parse_from_rfc3339("2026-11-02T10:00:00Z").unwrap();
        let mut w = TrailWriter::open(dir, "s1", Zone::utc()).unwrap();
        crate::fsutil::tests::limit_file_size(10);
        w.append_at(ev("b"), day2.to_utc()).unwrap_err();
        assert_eq!(trail_files(dir, "s1").unwrap().len(), 1);
    }

    #[test]
    fn torn_last_line_is_ignored_and_repaired() {
        let d = tempfile::tempdir().unwrap();
        let mut w = TrailWriter::open(d.path(), "s1", Zone::utc()).unwrap();
        w.append(ev("a")).unwrap();
        drop(w);
        let f = trail_files(d.path(), "s1").unwrap().pop().unwrap();
        let mut fh = OpenOptions::new().append(true).open(&f).unwrap();
        fh.write_all(br#"{"v":1,"seq":2,"ts":"x","type":"mess"#)
            .unwrap();
        drop(fh);
        assert_eq!(read_trail(d.path(), "s1").unwrap().len(), 1);
        let mut w = TrailWriter::open(d.path(), "s1", Zone::utc()).unwrap();
        assert_eq!(w.next_seq(), 2);
        w.append(ev("b")).unwrap();
        let lines = read_trail(d.path(), "s1").unwrap();
        assert_eq!(lines.len(), 2);
        assert!(fs::read_to_string(&f).unwrap().ends_with("\n"));
    }
}
