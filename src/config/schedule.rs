//! `[[schedule]]` entries (SPEC §14): when (`cron` or `every`) and what (`system`,
//! `message` + `to`, or `job`).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::keys::tools::{
    SCHEDULE_CRON, SCHEDULE_EVERY, SCHEDULE_JOB, SCHEDULE_MESSAGE, SCHEDULE_NAME,
    SCHEDULE_PRECHECK, SCHEDULE_PRECHECK_TIMEOUT, SCHEDULE_SYSTEM, SCHEDULE_TO,
};
use super::types::{Precheck, ScheduleAction, ScheduleEntry, ScheduleWhen};
use super::walker::Section;

/// All `[[schedule]]` entries. `contacts` are the Telegram contact names `to` may use.
pub fn schedules(root: &mut Section<'_>, contacts: &BTreeMap<String, i64>) -> Vec<ScheduleEntry> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for mut s in root.tables("schedule") {
        let name = s.read_required(&SCHEDULE_NAME);
        if let Some(n) = &name
            && !seen.insert(n.clone())
        {
            s.problem(
                "name",
                format!("duplicate schedule name {n:?}; names must be unique"),
            );
        }
        let when = when(&mut s);
        let action = action(&mut s, contacts);
        let precheck = precheck(&mut s, action.as_ref());
        if let (Some(name), Some(when), Some(action), Some(precheck)) =
            (name, when, action, precheck)
        {
            out.push(ScheduleEntry {
                name,
                when,
                action,
                precheck,
            });
        }
    }
    out
}

fn when(s: &mut Section<'_>) -> Option<ScheduleWhen> {
    let (has_cron, has_every) = (s.has("cron"), s.has("every"));
    let cron = s.read_opt(&SCHEDULE_CRON);
    let every = s.read_opt(&SCHEDULE_EVERY);
    match (has_cron, has_every) {
        (true, false) => cron.map(ScheduleWhen::Cron),
        (false, true) => every.map(ScheduleWhen::Every),
        (true, true) => {
            s.problem("every", "give either cron or every, not both");
            None
        }
        (false, false) => {
            s.problem(
                "cron",
                "required: cron = \"0 9 * * *\" (5 fields) or every = \"15m\"",
            );
            None
        }
    }
}

fn action(s: &mut Section<'_>, contacts: &BTreeMap<String, i64>) -> Option<ScheduleAction> {
    let system = s.read_opt(&SCHEDULE_SYSTEM);
    let message = s.read_opt(&SCHEDULE_MESSAGE);
    let to = s.read_opt(&SCHEDULE_TO);
    let job = s.read_opt(&SCHEDULE_JOB);
    let given = [system.is_some(), message.is_some(), job.is_some()]
        .iter()
        .filter(|b| **b)
        .count();
    if given != 1 {
        s.problem(
            "system",
            "give exactly one of system = \"text\", message = \"text\" (with to = \"contact\"), or job = \"index\" | \"consolidate\"",
        );
        return None;
    }
    if message.is_none() && to.is_some() {
        s.problem("to", "only valid with message; remove it");
        return None;
    }
    if let Some(text) = system {
        return Some(ScheduleAction::System(text));
    }
    if let Some(job) = job {
        return Some(ScheduleAction::Job(job));
    }
    let text = message?;
    let Some(to) = to else {
        s.problem(
            "to",
            "required with message; name a contact of [channel.telegram] contacts",
        );
        return None;
    };
    if !contacts.contains_key(&to) {
        s.problem(
            "to",
            format!(
                "unknown contact {to:?}; add it to [channel.telegram] contacts as {to} = <chat id>"
            ),
        );
        return None;
    }
    Some(ScheduleAction::Message { text, to })
}

/// `precheck` and `precheck_timeout` (SPEC §20). `None`: a problem was reported;
/// `Some(None)`: no precheck.
fn precheck(s: &mut Section<'_>, action: Option<&ScheduleAction>) -> Option<Option<Precheck>> {
    let has_timeout = s.has("precheck_timeout");
    let command = s.read_opt(&SCHEDULE_PRECHECK);
    let timeout = s.read_opt(&SCHEDULE_PRECHECK_TIMEOUT);
    let Some(command) = command else {
        if has_timeout {
            s.problem("precheck_timeout", "only valid with precheck; remove it");
            return None;
        }
        return Some(None);
    };
    if command.trim().is_empty() {
        s.problem(
            "precheck",
            "must not be empty; give a shell command, e.g. \"test -s inbox/todo.txt\"",
        );
        return None;
    }
    if command.len() > Precheck::MAX_COMMAND || command.contains('\0') {
        s.problem(
            "precheck",
            format!(
                "must be at most {} bytes without NUL characters; put a longer check in a script in the workspace",
                Precheck::MAX_COMMAND
            ),
        );
        return None;
    }
    if action.is_some_and(|a| !matches!(a, ScheduleAction::System(_))) {
        s.problem(
            "precheck",
            "only valid with system = \"text\" (the only action that calls the model); remove it",
        );
        return None;
    }
    let timeout = match timeout {
        Some(t) => t,
        None if has_timeout => return None,
        None => SCHEDULE_PRECHECK_TIMEOUT.default_value(),
    };
    Some(Some(Precheck { command, timeout }))
}

/// Parse an interval such as `"30s"`, `"15m"`, `"1h"`, `"1d"` or `"1h30m"`; at least 1 s.
pub fn parse_every(s: &str) -> Result<Duration, String> {
    let bad = || {
        format!(
            "expected an interval such as \"30s\", \"15m\", \"1h\", \"1d\" or \"1h30m\", got {s:?}"
        )
    };
    let t = s.trim();
    if t.is_empty() {
        return Err(bad());
    }
    let mut total: u64 = 0;
    let mut digits = String::new();
    for c in t.chars() {
        if c.is_ascii_digit() {
            digits.push(c);
            continue;
        }
        let unit = match c {
            's' => 1,
            'm' => 60,
            'h' => 3600,
            'd' => 86_400,
            _ => return Err(bad()),
        };
        let n: u64 = digits.parse().map_err(|_| bad())?;
        digits.clear();
        total = n
            .checked_mul(unit)
            .and_then(|v| total.checked_add(v))
            .ok_or_else(bad)?;
    }
    if !digits.is_empty() || total == 0 {
        return Err(bad());
    }
    Ok(Duration::from_secs(total))
}

/// Syntactic check of a 5-field cron expression: field count and allowed characters (digits,
/// `* , - / ?`, `L W #` and month/day names). The scheduler does the full parse.
pub fn check_cron(expr: &str) -> Result<(), String> {
    let fields: Vec<&str> = expr.split_whitespace().collect();
    if fields.len() != 5 {
        return Err(format!(
            "expected 5 fields (minute hour day-of-month month day-of-week), got {} in {expr:?}",
            fields.len()
        ));
    }
    for f in &fields {
        if !f
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '*' | ',' | '-' | '/' | '?' | '#'))
        {
            return Err(format!("invalid cron field {f:?} in {expr:?}"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn every_parses_units_and_compounds() {
        assert_eq!(parse_every("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_every("15m"), Ok(Duration::from_secs(900)));
        assert_eq!(parse_every("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_every("1d"), Ok(Duration::from_secs(86_400)));
        assert_eq!(parse_every("1h30m"), Ok(Duration::from_secs(5400)));
        for bad in [
            "",
            "15",
            "m",
            "0m",
            "1x",
            "-1m",
            "1.5h",
            "99999999999999999999s",
        ] {
            assert!(parse_every(bad).is_err(), "{bad:?} should be rejected");
        }
    }

    #[test]
    fn cron_needs_five_fields() {
        assert!(check_cron("0 9 * * 1-5").is_ok());
        assert!(check_cron("*/15 * * JAN MON#2").is_ok());
        assert!(check_cron("0 9 * *").is_err());
        assert!(check_cron("0 0 9 * * *").is_err());
        assert!(check_cron("0 9 * * $").is_err());
    }

    proptest! {
        #[test]
        fn every_never_panics(s in "\\PC{0,20}") {
            if let Ok(d) = parse_every(&s) {
                prop_assert!(d.as_secs() >= 1);
            }
        }

        #[test]
        fn every_roundtrips_minutes(n in 1u64..100_000) {
            prop_assert_eq!(parse_every(&format!("{n}m")), Ok(Duration::from_secs(n * 60)));
        }
    }
}
