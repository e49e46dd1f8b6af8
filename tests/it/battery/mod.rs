//! The reliability battery (issue 6; the plan is in docs/reliability.md): crash cycles, a full
//! disk, cost rows across a crash while the database fails, and provider faults against the
//! real binaries. The property tests for the parsers of
//! outside input live next to their parsers in `src/` (listed in docs/reliability.md).
//!
//! `cargo test --locked --test it battery::` runs this part alone. Randomised tests print their
//! seed; `BATTERY_SEED=<n>` replays one, `BATTERY_CYCLES=<n>` changes the number of crash cycles.

mod cost_spool;
pub(crate) mod disk_full;
mod kill9;
mod provider_faults;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use crate::support::daemon::parse_jsonl;

/// The seed of a randomised test: `BATTERY_SEED` when set, otherwise a fresh one. Printed either
/// way so that a failing run can be replayed.
pub fn seed(test: &str) -> u64 {
    let seed = match std::env::var("BATTERY_SEED") {
        Ok(s) => s
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("BATTERY_SEED must be a number, not {s:?}")),
        Err(_) => rand::random::<u64>(),
    };
    eprintln!("{test}: seed {seed} (replay with BATTERY_SEED={seed})");
    seed
}

pub use crate::support::free_port;

/// One HTTP/1.1 request to 127.0.0.1 (`Connection: close`), without a client library so that
/// plain threads can fire it: returns the status and the body, or the transport error (the
/// daemon was killed, refused the connection, …).
pub fn http(
    port: u16,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&Value>,
) -> Result<(u16, String), String> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(|e| e.to_string())?;
    let body = body.map(Value::to_string).unwrap_or_default();
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if let Some(t) = token {
        req.push_str(&format!("Authorization: Bearer {t}\r\n"));
    }
    if !body.is_empty() {
        req.push_str("Content-Type: application/json\r\n");
    }
    req.push_str("\r\n");
    req.push_str(&body);
    s.write_all(req.as_bytes()).map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("no HTTP status line in {text:?}"))?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

/// Every file below `dir` (recursively), sorted.
pub fn files_below(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(files_below(&p));
        } else {
            out.push(p);
        }
    }
    out.sort();
    out
}

/// What a check of the state directory found.
pub struct StateFiles {
    /// Every trail line of every session (also archived ones), file by file in name order.
    pub lines: Vec<Value>,
    /// Temporary files of atomic replaces left in `sessions/` or the state directory.
    pub temp_files: Vec<PathBuf>,
}

/// Parses every file agentd writes in `state_dir` the way a reader must find them after any
/// crash: every `*.jsonl` line is JSON (only a torn last line may be incomplete, see
/// `parse_jsonl`), `sessions.json`, every `*.state.json` and `monitor.json` are whole JSON
/// documents. Panics naming the file otherwise.
pub fn check_state_files(state_dir: &Path) -> StateFiles {
    let mut lines = Vec::new();
    let mut temp_files = Vec::new();
    for p in files_below(state_dir) {
        let name = p
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if name.contains(".tmp.") {
            temp_files.push(p);
            continue;
        }
        let json_doc =
            name == "sessions.json" || name == "monitor.json" || name.ends_with(".state.json");
        if name.ends_with(".jsonl") {
            let bytes =
                std::fs::read(&p).unwrap_or_else(|e| panic!("cannot read {}: {e}", p.display()));
            let text = String::from_utf8(bytes)
                .unwrap_or_else(|e| panic!("{} is not UTF-8: {e}", p.display()));
            lines.extend(parse_jsonl(&p.display().to_string(), &text));
        } else if json_doc {
            let bytes =
                std::fs::read(&p).unwrap_or_else(|e| panic!("cannot read {}: {e}", p.display()));
            let v: Value = serde_json::from_slice(&bytes).unwrap_or_else(|e| {
                panic!(
                    "{} is not a whole JSON document ({e}): {:?}",
                    p.display(),
                    String::from_utf8_lossy(&bytes)
                )
            });
            assert!(v.is_object(), "{} is not a JSON object: {v}", p.display());
        }
    }
    StateFiles { lines, temp_files }
}

/// `PRAGMA integrity_check` of the SQLite file `db` (skipped when it does not exist) must say
/// `ok`. Open while no daemon runs, this is the state a crash left (plus SQLite's own recovery
/// of its WAL, which any next opener runs).
pub fn assert_db_intact(db: &Path) {
    if !db.exists() {
        return;
    }
    let conn = rusqlite::Connection::open(db)
        .unwrap_or_else(|e| panic!("cannot open {}: {e}", db.display()));
    let rows: Vec<String> = conn
        .prepare("PRAGMA integrity_check")
        .and_then(|mut st| {
            st.query_map([], |r| r.get::<_, String>(0))?
                .collect::<Result<Vec<_>, _>>()
        })
        .unwrap_or_else(|e| panic!("integrity_check of {} failed to run: {e}", db.display()));
    assert_eq!(rows, ["ok"], "PRAGMA integrity_check of {}", db.display());
}

/// Whether a trail line completes intake `id`: a final assistant message or a failure that
/// lists it in `reply_to` (SPEC §5.2).
pub fn completes(line: &Value, id: &str) -> bool {
    lists(line, id) && (line["final"] == true || line["type"] == "failure")
}

/// Whether `line["reply_to"]` contains `id`.
pub fn lists(line: &Value, id: &str) -> bool {
    line["reply_to"]
        .as_array()
        .is_some_and(|a| a.iter().any(|r| r == id))
}

/// The user-visible text of an outcome line: the reply of a final message, the `reply` of a
/// failure.
pub fn outcome_text(line: &Value) -> String {
    if line["type"] == "failure" {
        line["reply"].as_str().unwrap_or_default().to_string()
    } else {
        line["text"].as_str().unwrap_or_default().to_string()
    }
}

/// Rows of the `costs` table as `(model, call_type)` pairs with their count.
pub fn cost_rows(db: &Path) -> BTreeMap<(String, String), usize> {
    let conn = rusqlite::Connection::open(db)
        .unwrap_or_else(|e| panic!("cannot open {}: {e}", db.display()));
    let mut st = conn
        .prepare("SELECT model, call_type FROM costs ORDER BY id")
        .expect("costs table");
    let mut out = BTreeMap::new();
    for row in st
        .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))
        .expect("query costs")
    {
        *out.entry(row.expect("cost row")).or_insert(0) += 1;
    }
    out
}
