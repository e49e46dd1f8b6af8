//! What one MCP server may send (docs/security.md, "A hostile MCP server"): the size of each
//! tool definition and of a server's whole list, the nesting depth of a message, and how fast
//! messages and bytes may arrive. Pure: the clock is passed in.

use std::borrow::Cow;
use std::time::{Duration, Instant};

/// A tool's name on the server, in bytes (the exposed name is cut to 64 anyway).
pub const MAX_NAME_BYTES: usize = 128;
/// A tool's description and its input schema (serialised), in bytes: the bounds every tool
/// definition from outside shares (a compatible endpoint's client tools too).
pub use crate::llm::schema::{MAX_DESCRIPTION_BYTES, MAX_SCHEMA_BYTES};
/// All of one server's offered tools together (names, descriptions, schemas), in bytes; the
/// tools past it (in name order) are refused.
pub const MAX_SERVER_BYTES: usize = 128 * 1024;

/// Containers in one message nested deeper than this are replaced by [`PRUNED`] before the
/// message is parsed: serde_json refuses a document nested more than 128 levels, which would
/// drop the whole message (a `tools/list` answer: every tool of the server) for one bad tool.
/// A schema still this deep is refused by `tools::arg_schema` (64 levels), that tool alone.
pub const MAX_MESSAGE_DEPTH: usize = 100;
/// What replaces a container nested deeper than [`MAX_MESSAGE_DEPTH`].
pub const PRUNED: &str = r#"{"$agentd":"nested too deep"}"#;

/// Whether a parsed value holds a container [`prune_deep`] replaced.
pub fn holds_pruned(map: &serde_json::Map<String, serde_json::Value>) -> bool {
    fn walk(v: &serde_json::Value) -> bool {
        match v {
            serde_json::Value::Object(m) => holds_pruned(m),
            serde_json::Value::Array(a) => a.iter().any(walk),
            _ => false,
        }
    }
    map.contains_key(PRUNED_KEY) || map.values().any(walk)
}

/// The key of [`PRUNED`].
const PRUNED_KEY: &str = "$agentd";

/// The size of one listed tool: `Err` says which part is over its limit.
pub fn check_tool(name: &str, description: &str, schema_bytes: usize) -> Result<usize, String> {
    if name.len() > MAX_NAME_BYTES {
        return Err(format!(
            "its name is {} bytes long (at most {MAX_NAME_BYTES})",
            name.len()
        ));
    }
    if description.len() > MAX_DESCRIPTION_BYTES {
        return Err(format!(
            "its description is {} bytes long (at most {MAX_DESCRIPTION_BYTES})",
            description.len()
        ));
    }
    if schema_bytes > MAX_SCHEMA_BYTES {
        return Err(format!(
            "its input schema is {schema_bytes} bytes long (at most {MAX_SCHEMA_BYTES})"
        ));
    }
    Ok(name.len() + description.len() + schema_bytes)
}

/// `line` (one JSON text) with every object or array that starts deeper than `max` levels
/// replaced by [`PRUNED`]; borrowed when nothing is that deep. Strings are skipped with their
/// escapes, so brackets inside them do not count. Text that is not JSON stays text that is not
/// JSON (the parser after this refuses it as before).
pub fn prune_deep(line: &[u8], max: usize) -> Cow<'_, [u8]> {
    if depth_of(line) <= max {
        return Cow::Borrowed(line);
    }
    let mut out = Vec::with_capacity(line.len().min(1 << 20));
    let mut scan = Scanner::default();
    let mut skip_until: Option<usize> = None;
    for &b in line {
        let before = scan.depth;
        let structural = scan.step(b);
        match skip_until {
            Some(level) => {
                if structural && scan.depth == level {
                    skip_until = None;
                }
            }
            None if structural && scan.depth > max && scan.depth > before => {
                out.extend_from_slice(PRUNED.as_bytes());
                skip_until = Some(before);
            }
            None => out.push(b),
        }
    }
    Cow::Owned(out)
}

/// The deepest nesting of objects and arrays in `line`.
fn depth_of(line: &[u8]) -> usize {
    let mut scan = Scanner::default();
    let mut max = 0;
    for &b in line {
        scan.step(b);
        max = max.max(scan.depth);
    }
    max
}

/// Bracket depth outside strings.
#[derive(Default)]
struct Scanner {
    depth: usize,
    in_string: bool,
    escaped: bool,
}

impl Scanner {
    /// Take one byte; true when it opened or closed a container.
    fn step(&mut self, b: u8) -> bool {
        if self.in_string {
            match (self.escaped, b) {
                (true, _) => self.escaped = false,
                (false, b'\\') => self.escaped = true,
                (false, b'"') => self.in_string = false,
                _ => {}
            }
            return false;
        }
        match b {
            b'"' => {
                self.in_string = true;
                false
            }
            b'{' | b'[' => {
                self.depth += 1;
                true
            }
            b'}' | b']' => {
                self.depth = self.depth.saturating_sub(1);
                true
            }
            _ => false,
        }
    }
}

/// A token bucket: `capacity` at most, refilled at `per_second`; `take` says whether `n` more
/// fit. A server that sends faster than this for longer than the bucket lasts is cut off.
#[derive(Debug, Clone)]
pub struct Bucket {
    capacity: f64,
    per_second: f64,
    level: f64,
    at: Instant,
}

impl Bucket {
    pub fn new(capacity: u64, per_second: u64, now: Instant) -> Bucket {
        Bucket {
            capacity: capacity as f64,
            per_second: per_second as f64,
            level: capacity as f64,
            at: now,
        }
    }

    /// Take `n` if the bucket holds them now.
    pub fn take(&mut self, n: u64, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.at);
        self.at = now;
        self.level = (self.level + elapsed.as_secs_f64() * self.per_second).min(self.capacity);
        if self.level >= n as f64 {
            self.level -= n as f64;
            true
        } else {
            false
        }
    }
}

/// Messages one server may send: a burst of this many, then [`MESSAGES_PER_SECOND`].
pub const MESSAGE_BURST: u64 = 2_000;
pub const MESSAGES_PER_SECOND: u64 = 200;
/// Bytes one stdio server may write to its stdout: a burst, then a rate.
pub const STDOUT_BURST: u64 = 64 * 1024 * 1024;
pub const STDOUT_PER_SECOND: u64 = 8 * 1024 * 1024;
/// Answers to one server that may wait for it to read them; one more, and the server is
/// restarted (it does not read what it asked for).
pub const MAX_PENDING_SENDS: usize = 64;
/// One answer that waits this long for the server to read it restarts the server.
pub const SEND_STALL: Duration = Duration::from_secs(30);
/// Bytes of one server's stderr logged per [`LOG_WINDOW`]; the rest is counted and summarised
/// in one line at the end of the window.
pub const LOG_BYTES_PER_WINDOW: usize = 1024 * 1024;
pub const LOG_WINDOW: Duration = Duration::from_secs(60);
/// Stderr read from one server per second at most, logged or not (the daemon's CPU): a server
/// that writes faster blocks on its own stderr.
pub const STDERR_BYTES_PER_SECOND: u64 = 1024 * 1024;

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn nested(n: usize) -> String {
        let mut s = "1".to_string();
        for _ in 0..n {
            s = format!("{{\"a\":[{s}]}}");
        }
        s
    }

    #[test]
    fn shallow_text_is_borrowed_unchanged() {
        let line = br#"{"a":[1,{"b":"[[[{{{"}],"c":"\"]"}"#;
        assert!(matches!(prune_deep(line, 3), Cow::Borrowed(_)));
        assert_eq!(depth_of(line), 3);
    }

    #[test]
    fn deep_containers_become_the_marker_and_stay_json() {
        let line = nested(150);
        let pruned = prune_deep(line.as_bytes(), MAX_MESSAGE_DEPTH);
        let v: serde_json::Value = serde_json::from_slice(&pruned).expect("valid JSON");
        assert!(depth_of(&pruned) <= MAX_MESSAGE_DEPTH + 1);
        assert!(String::from_utf8_lossy(&pruned).contains("nested too deep"));
        assert!(holds_pruned(v.as_object().unwrap()));
        let shallow: serde_json::Value = serde_json::from_str(&nested(3)).unwrap();
        assert!(!holds_pruned(shallow.as_object().unwrap()));
        // The part above the limit is kept as it was.
        assert!(v["a"][0]["a"][0]["a"].is_array());
    }

    #[test]
    fn siblings_after_a_pruned_container_are_kept() {
        let deep = nested(10);
        let line =
            format!(r#"{{"tools":[{{"name":"deep","s":{deep}}},{{"name":"ok","s":{{}}}}]}}"#);
        let pruned = prune_deep(line.as_bytes(), 6);
        let v: serde_json::Value = serde_json::from_slice(&pruned).expect("valid JSON");
        assert_eq!(v["tools"][1]["name"], "ok");
        assert_eq!(v["tools"][0]["name"], "deep");
    }

    #[test]
    fn tool_sizes_are_checked_part_by_part() {
        assert_eq!(check_tool("t", "d", 10), Ok(12));
        assert!(
            check_tool(&"n".repeat(129), "", 1)
                .unwrap_err()
                .contains("name")
        );
        let e = check_tool("t", &"d".repeat(20_000), 1).unwrap_err();
        assert!(e.contains("description is 20000 bytes"), "{e}");
        assert!(
            check_tool("t", "", 10_000_000)
                .unwrap_err()
                .contains("schema")
        );
    }

    #[test]
    fn a_bucket_allows_its_burst_then_its_rate() {
        let t0 = Instant::now();
        let mut b = Bucket::new(10, 5, t0);
        assert!((0..10).all(|_| b.take(1, t0)));
        assert!(!b.take(1, t0));
        assert!(b.take(5, t0 + Duration::from_secs(1)));
        assert!(!b.take(1, t0 + Duration::from_secs(1)));
        // Never more than the capacity, however long it rested.
        assert!(!b.take(11, t0 + Duration::from_secs(100)));
        assert!(b.take(10, t0 + Duration::from_secs(100)));
    }

    proptest! {
        /// Any JSON value comes out as JSON no deeper than the limit (plus the marker's own
        /// level), and unchanged when it was not deeper.
        #[test]
        fn pruned_json_parses_and_is_bounded(v in crate::proptest_json::any_json(), max in 1usize..6) {
            let text = serde_json::to_vec(&v).unwrap();
            let out = prune_deep(&text, max);
            let parsed: serde_json::Value = serde_json::from_slice(&out).expect("still JSON");
            prop_assert!(depth_of(&out) <= max + 1);
            if depth_of(&text) <= max {
                prop_assert_eq!(parsed, v);
            }
        }

        /// Arbitrary bytes never panic.
        #[test]
        fn any_bytes_are_safe(bytes in proptest::collection::vec(any::<u8>(), 0..300), max in 0usize..5) {
            let _ = prune_deep(&bytes, max);
        }
    }
}
