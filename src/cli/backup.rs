//! `agentd backup [--to FILE] [--with-secrets] [--json]`, `agentd backup verify FILE` and
//! `agentd restore FILE --state-dir DIR` (SPEC §24): the front ends of [`crate::backup`].
//! Progress goes to stderr (a bar on a terminal); the report to stdout; each returns the exit
//! code (0 done, 1 failed or problems found).

use std::io::IsTerminal;
use std::path::PathBuf;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::json;

use crate::backup::{self, BackupError, Options, Progress, RestoreOptions, Sources};
use crate::config::Config;

/// A bar on stderr while files are copied or checked.
struct Bar(Option<ProgressBar>);

impl Bar {
    fn new(json: bool) -> Bar {
        Bar((!json && std::io::stderr().is_terminal()).then(ProgressBar::hidden))
    }
}

impl Progress for Bar {
    fn begin(&mut self, total: u64) {
        if self.0.is_none() {
            return;
        }
        let bar = if total == 0 {
            ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr())
        } else {
            ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr())
        };
        if let Ok(style) = ProgressStyle::with_template("{spinner} [{bar:30}] {pos}/{len} {msg}") {
            bar.set_style(style.progress_chars("=> "));
        }
        self.0 = Some(bar);
    }
    fn file(&mut self, path: &str) {
        if let Some(b) = &self.0 {
            b.set_message(path.to_owned());
            b.inc(1);
        }
    }
    fn end(&mut self) {
        if let Some(b) = &self.0 {
            b.finish_and_clear();
        }
    }
}

fn print_json(v: &serde_json::Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string())
    );
}

fn fail(json: bool, what: &str, e: &BackupError) -> u8 {
    if json {
        print_json(&json!({"ok": false, "error": e.to_string()}));
    }
    eprintln!("agentd: {what}: {e}");
    1
}

/// `agentd backup`.
pub fn backup(cfg: &Config, to: Option<PathBuf>, with_secrets: bool, json: bool) -> u8 {
    let to = to.unwrap_or_else(|| PathBuf::from(backup::default_name(chrono::Utc::now())));
    let opts = Options { to, with_secrets };
    let report = match backup::create(&Sources::of(cfg), &opts, &mut Bar::new(json)) {
        Ok(r) => r,
        Err(e) => return fail(json, "backup failed", &e),
    };
    if json {
        let mut v = serde_json::to_value(&report).unwrap_or_default();
        v["ok"] = json!(true);
        print_json(&v);
        return 0;
    }
    println!(
        "backup written: {} ({} bytes, {} files)",
        report.path.display(),
        report.bytes,
        report.files
    );
    println!(
        "  started {}; agentd.db schema {}, memory.db schema {}",
        report.created_at,
        shown(report.schemas.agentd_db),
        shown(report.schemas.memory_db)
    );
    if report.with_secrets {
        println!("  secrets: config/.env is in it; the file is mode 0600: keep it private");
    } else {
        println!("  secrets: not included (--with-secrets adds config/.env)");
    }
    if !report.in_flight.is_empty() {
        println!(
            "  in flight: {} message(s) acknowledged but not finished when the trails were copied (their replies are not in this backup):",
            report.in_flight.len()
        );
        for m in &report.in_flight {
            println!("    session {} intake {}", m.session_id, m.intake_id);
        }
    }
    0
}

fn shown(v: Option<i64>) -> String {
    v.map_or_else(|| "absent".to_owned(), |v| v.to_string())
}

/// `agentd backup verify FILE`: exit 0 when no problem was found.
pub fn verify(file: &std::path::Path, json: bool) -> u8 {
    let verified = match backup::verify(file, &mut Bar::new(json)) {
        Ok(v) => v,
        Err(e) => return fail(json, "verify failed", &e),
    };
    let code = u8::from(!verified.ok());
    if json {
        print_json(&json!({
            "ok": verified.ok(),
            "file": file,
            "manifest": verified.manifest,
            "problems": verified.problems,
        }));
        return code;
    }
    match (&verified.manifest, verified.ok()) {
        (Some(m), true) => println!(
            "{}: OK ({} files; agentd {}, agentd.db schema {}, memory.db schema {}; taken {})",
            file.display(),
            m.files.len(),
            m.agentd_version,
            shown(m.schemas.agentd_db),
            shown(m.schemas.memory_db),
            m.created_at
        ),
        _ => {
            println!("{}: {} problem(s)", file.display(), verified.problems.len());
            for p in &verified.problems {
                println!("  {p}");
            }
        }
    }
    code
}

/// `agentd restore FILE --state-dir DIR [--force] [--resume-deliveries]`.
/// `tz`: the user's zone (the config's, when it loads), for the trail lines written.
pub fn restore(
    tz: crate::zone::Zone,
    file: &std::path::Path,
    opts: &RestoreOptions,
    resume: bool,
    json: bool,
) -> u8 {
    let restored = match backup::restore(file, opts, &mut Bar::new(json)) {
        Ok(r) => r,
        Err(e) => return fail(json, "restore failed", &e),
    };
    let closed = if resume {
        Default::default()
    } else {
        let sessions = restored.state_dir.join("sessions");
        match crate::daemon::delivery::close_restored(&sessions, tz) {
            Ok(c) => c,
            Err(e) => {
                let e = BackupError::Refused(format!(
                    "restored into {}, but closing the open deliveries failed ({e}); start the daemon only after fixing this, or run restore again with --resume-deliveries",
                    restored.state_dir.display()
                ));
                return fail(json, "restore incomplete", &e);
            }
        }
    };
    for m in &closed.messages {
        tracing::warn!(session = %m.session_id, intake = %m.intake_id,
            "message in flight at backup time closed: it may have been answered after the backup; not answering it again");
    }
    for c in &closed.deliveries {
        tracing::warn!(session = %c.session_id, reply_to = ?c.reply_to, channel = %c.channel,
            "delivery open at backup time closed as unknown: it may have been sent after the backup; not sending it again");
    }
    if json {
        let mut v = serde_json::to_value(&restored).unwrap_or_default();
        v["ok"] = json!(true);
        v["closed_deliveries"] = json!(closed.deliveries);
        v["closed_messages"] = json!(closed.messages);
        print_json(&v);
        return 0;
    }
    println!(
        "restored {} (taken {}) into {}",
        file.display(),
        restored.manifest.created_at,
        restored.state_dir.display()
    );
    for (what, dir) in [
        ("workspace", &restored.workspace),
        ("config", &restored.config_dir),
    ] {
        if let Some(d) = dir {
            println!(
                "  {what}: {} (point the config at it, or move it where the config points)",
                d.display()
            );
        }
    }
    for d in &restored.moved_aside {
        println!("  moved aside (not deleted): {}", d.display());
    }
    for m in &closed.messages {
        println!(
            "  in flight at backup time, closed (it may have been answered after the backup; not answered again): session {} intake {}",
            m.session_id, m.intake_id
        );
    }
    for c in &closed.deliveries {
        println!(
            "  delivery closed as unknown (it may have gone out after the backup; not sent again): session {} reply to {} on {}",
            c.session_id,
            c.reply_to.join(","),
            c.channel
        );
    }
    if resume {
        println!(
            "  open deliveries are resumed and messages in flight at backup time answered when the daemon starts (--resume-deliveries)"
        );
    }
    0
}
