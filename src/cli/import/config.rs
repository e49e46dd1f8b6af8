//! What becomes configuration, printed for the user to add and never written: OpenClaw's cron
//! jobs (`cron/jobs.json`) as `[[schedule]]` entries, and its Telegram allow-list (the pairing
//! store `credentials/telegram*-allowFrom.json` and `channels.telegram.allowFrom` of
//! `openclaw.json`) as `[channel.telegram] allow_from`.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::Path;

use serde_json::Value;

use super::source::Source;
use super::{Report, Section};

/// A JSON file of configuration larger than this is not read.
const MAX_JSON_BYTES: u64 = 4 * 1024 * 1024;
/// Cron jobs printed at most.
const MAX_JOBS: usize = 1_000;
/// Files of `credentials/` looked at, at most.
const MAX_CREDENTIAL_FILES: usize = 1_000;

fn read_json(src: &Source, rel: &str, section: Section, r: &mut Report) -> Option<Value> {
    match src.read_text(Path::new(rel), MAX_JSON_BYTES) {
        Ok(Some(t)) => match serde_json::from_str(&t) {
            Ok(v) => Some(v),
            Err(e) => {
                r.skip(
                    section,
                    rel,
                    format!("not plain JSON ({e}); copy what you need by hand"),
                );
                None
            }
        },
        Ok(None) => None,
        Err(why) => {
            r.skip(section, rel, why);
            None
        }
    }
}

/// `cron/jobs.json` → `[[schedule]]` text.
pub fn cron(src: &Source, r: &mut Report) {
    let Some(store) = read_json(src, "cron/jobs.json", Section::Schedules, r) else {
        return;
    };
    let jobs = store["jobs"].as_array().cloned().unwrap_or_default();
    let mut names = BTreeSet::new();
    for (i, job) in jobs.iter().enumerate() {
        let label = job["name"].as_str().unwrap_or("").trim();
        let shown = format!(
            "cron job {:?}",
            if label.is_empty() { "(no name)" } else { label }
        );
        if i == MAX_JOBS {
            r.skip(
                Section::Schedules,
                "cron/jobs.json",
                format!("more than {MAX_JOBS} jobs; the rest are left out"),
            );
            break;
        }
        match schedule_entry(job, &mut names) {
            Ok(text) => {
                r.config.push_str(&text);
                r.add(super::Item::printed(Section::Schedules, shown));
            }
            Err(why) => r.skip(Section::Schedules, &shown, why),
        }
    }
}

/// One job as a `[[schedule]]` entry; `names` keeps the names unique.
fn schedule_entry(job: &Value, names: &mut BTreeSet<String>) -> Result<String, String> {
    if job["enabled"] == Value::Bool(false) {
        return Err("disabled".into());
    }
    let payload = &job["payload"];
    let text = match payload["kind"].as_str() {
        Some("agentTurn") => payload["message"].as_str(),
        Some("systemEvent") => payload["text"].as_str(),
        _ => None,
    };
    let text = text
        .filter(|t| !t.trim().is_empty())
        .ok_or("no message in its payload")?;
    let s = &job["schedule"];
    let (when, note) = match s["kind"].as_str() {
        Some("cron") => {
            let expr = s["expr"].as_str().ok_or("a cron schedule without `expr`")?;
            let tz = s["tz"].as_str().map(|tz| format!("  # OpenClaw's time zone was {tz}; agentd uses [agent] timezone"));
            (format!("cron = {}", toml_str(expr)), tz.unwrap_or_default())
        }
        Some("every") => {
            let ms = s["everyMs"].as_u64().filter(|ms| *ms > 0).ok_or("an `every` schedule without `everyMs`")?;
            (format!("every = \"{}\"", every(ms)), String::new())
        }
        Some("at") => return Err("a one-shot (`at`) job: ask the agent to schedule it again (the schedule tool), [[schedule]] entries repeat".into()),
        _ => return Err("unknown schedule kind".into()),
    };
    let base = slug(job["name"].as_str().unwrap_or("openclaw"));
    let mut name = base.clone();
    let mut n = 1;
    while !names.insert(name.clone()) {
        n += 1;
        name = format!("{base}-{n}");
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n[[schedule]]\nname = {}\n{when}{note}",
        toml_str(&name)
    );
    let _ = writeln!(out, "system = {}", toml_str(text));
    Ok(out)
}

fn toml_str(s: &str) -> String {
    crate::config::keys::codec::q(s)
}

/// An interval as agentd writes it: whole hours, minutes or seconds (at least 1 s).
fn every(ms: u64) -> String {
    match ms {
        ms if ms % 3_600_000 == 0 => format!("{}h", ms / 3_600_000),
        ms if ms % 60_000 == 0 => format!("{}m", ms / 60_000),
        ms => format!("{}s", ms.div_ceil(1000)),
    }
}

/// A schedule name from a job's: lower-case letters, digits and dashes.
fn slug(name: &str) -> String {
    let s: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    let s: Vec<&str> = s.split('-').filter(|p| !p.is_empty()).collect();
    let s = s.join("-");
    let s: String = s.chars().take(48).collect();
    if s.is_empty() {
        "openclaw".into()
    } else {
        format!("openclaw-{s}")
    }
}

/// The Telegram allow-list → `[channel.telegram] allow_from`.
pub fn telegram(src: &Source, r: &mut Report) {
    let mut raw: Vec<(String, Value)> = Vec::new();
    let creds = src
        .list(Path::new("credentials"), MAX_CREDENTIAL_FILES)
        .unwrap_or_default();
    for e in creds {
        if e.name.starts_with("telegram") && e.name.ends_with("allowFrom.json") {
            let rel = format!("credentials/{}", e.name);
            if let Some(v) = read_json(src, &rel, Section::Telegram, r) {
                raw.extend(entries(&v["allowFrom"]).map(|x| (rel.clone(), x)));
            }
        }
    }
    if let Some(v) = read_json(src, "openclaw.json", Section::Telegram, r) {
        let list = &v["channels"]["telegram"]["allowFrom"];
        raw.extend(entries(list).map(|x| ("openclaw.json".to_string(), x)));
    }
    let mut ids = BTreeSet::new();
    for (from, v) in raw {
        let s = match &v {
            Value::String(s) => s.trim().to_string(),
            other => other.to_string(),
        };
        let bare = s.trim_start_matches("telegram:").trim_start_matches("tg:");
        match bare.parse::<i64>() {
            Ok(id) => {
                ids.insert(id);
            }
            Err(_) if s == "*" => r.skip(
                Section::Telegram,
                &from,
                "\"*\" (anyone): agentd's allow_from lists user ids only",
            ),
            Err(_) => r.skip(
                Section::Telegram,
                &from,
                format!("{s:?} is not a numeric user id (allow_from takes ids)"),
            ),
        }
    }
    if ids.is_empty() {
        return;
    }
    let list: Vec<String> = ids.iter().map(i64::to_string).collect();
    let _ = write!(
        r.config,
        "\n[channel.telegram]\nallow_from = [{}]\n",
        list.join(", ")
    );
    r.add(super::Item::printed(
        Section::Telegram,
        format!("allow-list of {} user id(s)", ids.len()),
    ));
}

fn entries(v: &Value) -> impl Iterator<Item = Value> + '_ {
    v.as_array().into_iter().flatten().cloned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn cron_jobs_become_schedule_entries_that_load() {
        let mut names = BTreeSet::new();
        let job = json!({"name": "Morning brief", "schedule": {"kind": "cron", "expr": "0 7 * * *", "tz": "Europe/Rome"},
            "payload": {"kind": "agentTurn", "message": "Summarize \"overnight\" updates."}});
        let a = schedule_entry(&job, &mut names).unwrap();
        let b = schedule_entry(&job, &mut names).unwrap();
        let every = json!({"name": "x", "schedule": {"kind": "every", "everyMs": 90_000},
            "payload": {"kind": "systemEvent", "text": "check"}});
        let c = schedule_entry(&every, &mut names).unwrap();
        let parsed: toml::Table = format!("{a}{b}{c}").parse().unwrap();
        let entries = parsed["schedule"].as_array().unwrap();
        assert_eq!(entries[0]["name"].as_str(), Some("openclaw-morning-brief"));
        assert_eq!(
            entries[1]["name"].as_str(),
            Some("openclaw-morning-brief-2")
        );
        assert_eq!(entries[0]["cron"].as_str(), Some("0 7 * * *"));
        assert_eq!(
            entries[0]["system"].as_str(),
            Some("Summarize \"overnight\" updates.")
        );
        assert!(a.contains("# OpenClaw's time zone was Europe/Rome"), "{a}");
        assert_eq!(entries[2]["every"].as_str(), Some("90s"));
        let at = json!({"name": "r", "schedule": {"kind": "at", "at": "2026-02-01T16:00:00Z"},
            "payload": {"kind": "systemEvent", "text": "x"}});
        assert!(
            schedule_entry(&at, &mut names)
                .unwrap_err()
                .contains("one-shot")
        );
    }

    #[test]
    fn intervals_are_written_in_the_largest_whole_unit() {
        assert_eq!(every(1_800_000), "30m");
        assert_eq!(every(7_200_000), "2h");
        assert_eq!(every(1_500), "2s");
    }
}
