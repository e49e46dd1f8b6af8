//! `format_monitor`: `monitor.json` as text for `agent-send --monitor`.

use std::fmt::Write as _;

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::MONITOR_VERSION;

/// A non-idle state not updated for longer than this is flagged "possibly stuck".
const STUCK_AFTER_SECONDS: i64 = 60;

/// "5s", "2m 05s", "1h 02m", "3d 04h".
pub(super) fn human_duration(secs: i64) -> String {
    let s = secs.max(0);
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m {:02}s", s / 60, s % 60),
        3600..86400 => format!("{}h {:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d {:02}h", s / 86400, s % 86400 / 3600),
    }
}

fn str_field<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}

fn time_field(v: &Value, key: &str) -> Option<DateTime<Utc>> {
    str_field(v, key)
        .and_then(|s| DateTime::parse_from_rfc3339(s).ok())
        .map(|t| t.with_timezone(&Utc))
}

/// "12s ago" for a timestamp field, or `None` when absent or unparsable.
fn ago(v: &Value, key: &str, now: DateTime<Utc>) -> Option<String> {
    time_field(v, key).map(|t| format!("{} ago", human_duration((now - t).num_seconds())))
}

fn string_list(v: &Value, key: &str) -> Vec<String> {
    v.get(key)
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .map(|x| match x {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The "possibly stuck" note for a message object, if it applies: a non-idle state whose
/// `updated_at` is more than 60 s before `now`.
fn stuck_note(m: &Value, now: DateTime<Utc>) -> Option<String> {
    let state = str_field(m, "state").unwrap_or("idle");
    if state == "idle" {
        return None;
    }
    let age = (now - time_field(m, "updated_at")?).num_seconds();
    (age > STUCK_AFTER_SECONDS)
        .then(|| format!("POSSIBLY STUCK: no update for {}", human_duration(age)))
}

/// One-line description of a message object: "tg-1 (alice), thinking, turn 3, updated 2s ago".
fn message_line(m: &Value, now: DateTime<Utc>) -> String {
    let mut line = format!(
        "{} ({}), {}, turn {}",
        str_field(m, "session_id").unwrap_or("?"),
        str_field(m, "contact").unwrap_or("?"),
        str_field(m, "state").unwrap_or("?"),
        m.get("turn").and_then(Value::as_u64).unwrap_or(0),
    );
    if let Some(model) = str_field(m, "model") {
        let _ = write!(line, ", {model}");
    }
    if let Some(a) = ago(m, "updated_at", now) {
        let _ = write!(line, ", updated {a}");
    }
    if let Some(note) = stuck_note(m, now) {
        let _ = write!(line, " — {note}");
    }
    line
}

/// Render `monitor.json` for `agent-send --monitor`. Tolerates missing or mistyped fields (the
/// file is read from disk). A non-idle state whose `updated_at` is older than 60 s is flagged
/// "POSSIBLY STUCK".
pub fn format_monitor(v: &Value, now: DateTime<Utc>) -> String {
    let mut out = String::new();
    if !v.is_object() {
        return "monitor.json does not hold a JSON object\n".to_owned();
    }
    version_note(&mut out, v);
    format_current(&mut out, v, now);
    format_active(&mut out, v, now);
    format_cache(&mut out, v);
    format_prechecks(&mut out, v, now);
    format_channels(&mut out, v);
    out
}

/// A note when the file's format version is not the one this build reads.
fn version_note(out: &mut String, v: &Value) {
    let version = v.get("version").and_then(Value::as_u64);
    if version != Some(u64::from(MONITOR_VERSION)) {
        let shown = version.map_or("missing".to_owned(), |n| n.to_string());
        let _ = writeln!(
            out,
            "(monitor format version {shown}, this agent-send reads {MONITOR_VERSION}; fields may be missing)"
        );
    }
}

/// The state, and the message in flight (or the last one finished) with its turns.
fn format_current(out: &mut String, v: &Value, now: DateTime<Utc>) {
    let state = str_field(v, "state").unwrap_or("unknown");
    let idle = state == "idle";
    let turn = v.get("turn").and_then(Value::as_u64).unwrap_or(0);
    if idle {
        let _ = writeln!(out, "state:      idle");
    } else {
        let _ = write!(out, "state:      {state}, turn {turn}");
        if let Some(note) = stuck_note(v, now) {
            let _ = write!(out, " — {note}");
        }
        out.push('\n');
    }
    if let Some(session) = str_field(v, "session_id") {
        let label = if idle { "last:      " } else { "session:   " };
        let contact = str_field(v, "contact").unwrap_or("?");
        let _ = writeln!(out, "{label} {session} (contact {contact})");
        if let Some(model) = str_field(v, "model") {
            let _ = writeln!(out, "model:      {model}");
        }
        if let Some(from) = str_field(v, "fallback_from") {
            let why = str_field(v, "fallback_reason").unwrap_or("?");
            let _ = writeln!(out, "fallback:   answering for {from} ({why})");
        }
        if let Some(a) = ago(v, "message_started_at", now) {
            let _ = writeln!(out, "message:    started {a}");
        }
        if idle {
            if let Some(a) = ago(v, "updated_at", now) {
                let _ = writeln!(out, "finished:   {a}, after {turn} turn(s)");
            }
        } else {
            if let Some(a) = ago(v, "turn_started_at", now) {
                let _ = writeln!(out, "turn:       started {a}");
            }
            if let Some(a) = ago(v, "updated_at", now) {
                let _ = writeln!(out, "updated:    {a}");
            }
            let tools = string_list(v, "tools_in_flight");
            if !tools.is_empty() {
                let _ = writeln!(out, "tools:      {}", tools.join(", "));
            }
        }
        format_turns(out, v);
    } else {
        let _ = writeln!(out, "no message handled since start");
    }
}

/// Every message in flight, one line each, and the queue depth.
fn format_active(out: &mut String, v: &Value, now: DateTime<Utc>) {
    let active: &[Value] = v
        .get("active")
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice);
    let _ = writeln!(out, "active:     {}", active.len());
    for m in active {
        let _ = writeln!(out, "  - {}", message_line(m, now));
    }
    let queue = v.get("queue_depth").and_then(Value::as_u64).unwrap_or(0);
    let _ = writeln!(out, "queue:      {queue}");
}

/// The prompt cache's hit ratios and the alerts raised.
fn format_cache(out: &mut String, v: &Value) {
    if let Some(cache) = v.get("cache").filter(|c| c.is_object()) {
        let ratio = |k: &str| {
            cache
                .get(k)
                .and_then(Value::as_f64)
                .map_or("-".to_owned(), |r| format!("{:.0}%", r * 100.0))
        };
        let _ = writeln!(
            out,
            "cache:      hit ratio {} recent, {} baseline",
            ratio("hit_ratio_recent"),
            ratio("hit_ratio_baseline")
        );
    }
    for alert in v
        .get("alerts")
        .and_then(Value::as_array)
        .map_or(&[][..], Vec::as_slice)
    {
        let _ = writeln!(
            out,
            "ALERT:      {}",
            str_field(alert, "message").unwrap_or("?")
        );
    }
}

/// The last outcome of each precheck.
fn format_prechecks(out: &mut String, v: &Value, now: DateTime<Utc>) {
    if let Some(prechecks) = v.get("prechecks").and_then(Value::as_object)
        && !prechecks.is_empty()
    {
        let _ = writeln!(out, "prechecks:");
        for (name, p) in prechecks {
            let when = ago(p, "at", now).unwrap_or_else(|| "?".to_owned());
            let _ = writeln!(
                out,
                "  {name}: {} {when} ({} ms)",
                str_field(p, "outcome").unwrap_or("?"),
                p.get("ms").and_then(Value::as_u64).unwrap_or(0)
            );
        }
    }
}

/// The health of each chat channel.
fn format_channels(out: &mut String, v: &Value) {
    if let Some(channels) = v.get("channels").and_then(Value::as_object)
        && !channels.is_empty()
    {
        let _ = writeln!(out, "channels:");
        for (name, health) in channels {
            let detail = match health.as_object() {
                Some(fields) => fields
                    .iter()
                    .map(|(k, x)| match x {
                        Value::String(s) => format!("{k}={s}"),
                        other => format!("{k}={other}"),
                    })
                    .collect::<Vec<_>>()
                    .join(", "),
                None => health.to_string(),
            };
            let _ = writeln!(out, "  {name}: {detail}");
        }
    }
}

/// Turns shown by `format_monitor` (the file keeps up to 50).
const TURNS_SHOWN: usize = 10;

fn format_turns(out: &mut String, v: &Value) {
    let turns: &[Value] = v
        .get("turns")
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice);
    if turns.is_empty() {
        return;
    }
    let skip = turns.len().saturating_sub(TURNS_SHOWN);
    if skip > 0 {
        let _ = writeln!(out, "turns:      last {TURNS_SHOWN} of {}", turns.len());
    } else {
        let _ = writeln!(out, "turns:");
    }
    let n = |t: &Value, k: &str| t.get(k).and_then(Value::as_u64).unwrap_or(0);
    for t in &turns[skip..] {
        let mut line = format!(
            "  {:>6} ms  in {} out {} cache-read {} cache-write {}  {}",
            n(t, "duration_ms"),
            n(t, "input_tokens"),
            n(t, "output_tokens"),
            n(t, "cache_read_tokens"),
            n(t, "cache_write_tokens"),
            str_field(t, "stop_reason").unwrap_or("?"),
        );
        let tools = string_list(t, "tools");
        if !tools.is_empty() {
            let _ = write!(line, "  [{}]", tools.join(", "));
        }
        let _ = writeln!(out, "{line}");
    }
}
