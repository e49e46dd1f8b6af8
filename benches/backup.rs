//! backup: `agentd backup` of a state directory of 1,000 sessions and 100,000 trail lines (time
//! and size), and the daemon's own time per message while backups run (SPEC §24).

use std::fs;
use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

use anyhow::{Result, bail};

use crate::client::{Chat, runtime};
use crate::launch::{Daemon, Setup};
use crate::runs::{Opts, echo_provider, report, subtract};
use crate::stats::ms;

const SESSIONS: usize = 1_000;
const LINES_PER_SESSION: usize = 100;

pub fn backup(o: &Opts) -> Result<()> {
    let fake = echo_provider()?;
    let mut d = Daemon::new(
        &o.agentd,
        &o.dir,
        &Setup {
            provider_url: fake.base_url(),
            ..Setup::default()
        },
    )?;
    let sessions = d.state_dir.join("sessions");
    fill(&sessions)?;
    println!(
        "backup: {SESSIONS} sessions, {} trail lines",
        SESSIONS * LINES_PER_SESSION
    );
    let to = d.root.join("bench.tar.zst");
    let t = Instant::now();
    run_backup(&o.agentd, &d, &to)?;
    let took = t.elapsed();
    println!(
        "  agentd backup (daemon stopped): {} ms, {:.1} MB (state {:.1} MB)",
        ms(took),
        fs::metadata(&to)?.len() as f64 / 1e6,
        dir_size(&d.state_dir) as f64 / 1e6
    );
    d.start()?;
    let chat = Chat::new(&d.base_url())?;
    let rt = runtime()?;
    let mut next = 1u64;
    rt.block_on(async {
        for _ in 0..20 {
            chat.send("warm", &format!("BENCHID={next} warm-up"))
                .await?;
            next += 1;
        }
        Ok::<_, anyhow::Error>(())
    })?;
    fake.take_spans();
    // Backups one after another in a thread while one session sends.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (agentd, state, config, root) = (
        o.agentd.clone(),
        d.state_dir.clone(),
        d.config_path.clone(),
        d.root.clone(),
    );
    let stop_flag = stop.clone();
    let backups = std::thread::spawn(move || -> Result<usize> {
        let mut n = 0;
        while !stop_flag.load(std::sync::atomic::Ordering::Relaxed) {
            let to = root.join("live.tar.zst");
            backup_command(&agentd, &state, &config, &to)?;
            n += 1;
        }
        Ok(n)
    });
    let n = o.messages;
    let (mut totals, mut tags) = (Vec::with_capacity(n), Vec::with_capacity(n));
    let wall = Instant::now();
    rt.block_on(async {
        for _ in 0..n {
            let (t, _) = chat
                .send("seq", &format!("BENCHID={next} how are you?"))
                .await?;
            totals.push(t);
            tags.push(next);
            next += 1;
        }
        Ok::<_, anyhow::Error>(())
    })?;
    let wall = wall.elapsed();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let count = backups
        .join()
        .map_err(|_| anyhow::anyhow!("backup thread panicked"))??;
    let added = subtract(&totals, &tags, &fake.take_spans())?;
    println!("  {n} messages while {count} backup(s) ran:");
    report(&totals, &added, n, wall);
    d.stop()?;
    Ok(())
}

fn run_backup(agentd: &Path, d: &Daemon, to: &Path) -> Result<()> {
    backup_command(agentd, &d.state_dir, &d.config_path, to)
}

fn backup_command(agentd: &Path, state: &Path, config: &Path, to: &Path) -> Result<()> {
    let out = Command::new(agentd)
        .args(["backup", "--json", "--to"])
        .arg(to)
        .arg("-c")
        .arg(config)
        .env("AGENTD_STATE_DIR", state)
        .output()?;
    if !out.status.success() {
        bail!(
            "agentd backup failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// Write `SESSIONS` trails of `LINES_PER_SESSION` lines each and their index.
fn fill(dir: &Path) -> Result<()> {
    use agentd::session::{Event, TrailLine};
    fs::create_dir_all(dir)?;
    let mut index = agentd::session::Index::new();
    let ts = "2026-12-01T12:00:00+00:00".to_string();
    for s in 0..SESSIONS {
        let id = format!("0000bench-{s:06}");
        let key = format!("bench-{s}");
        let mut f = fs::File::create(dir.join(format!("{id}.2026-12-01.jsonl")))?;
        let mut line = |seq: u64, event: Event| -> Result<()> {
            let l = TrailLine {
                v: 1,
                seq,
                ts: ts.clone(),
                event,
            };
            writeln!(f, "{}", serde_json::to_string(&l)?)?;
            Ok(())
        };
        line(
            1,
            Event::Session {
                session_id: id.clone(),
                key: key.clone(),
                model: "primary".into(),
            },
        )?;
        for seq in 2..=LINES_PER_SESSION as u64 {
            line(seq, Event::Failure {
                reply_to: vec![format!("{key}-{seq}")],
                error: "bench".into(),
                reply: "A reply of about the length of a short answer in a chat, to give the trail a realistic size per line.".into(),
            })?;
        }
        index.insert(
            key,
            agentd::session::IndexEntry {
                session_id: id,
                created_at: 1_764_590_400,
            },
        );
    }
    agentd::session::index::write_index(dir, &index)?;
    Ok(())
}

fn dir_size(dir: &Path) -> u64 {
    let Ok(rd) = fs::read_dir(dir) else { return 0 };
    rd.filter_map(Result::ok)
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_size(&e.path()),
            _ => e.metadata().map_or(0, |m| m.len()),
        })
        .sum()
}
