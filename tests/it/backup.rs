//! `agentd backup`, `backup verify` and `restore` (SPEC §24) against the real binary: a backup
//! under load restored and run again, the problems `verify` names, a backup killed or out of
//! space, and the backup before a database migration.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::Semaphore;

use crate::battery::disk_full::PrivateTmpfs;
use crate::battery::{free_port, http, outcome_text};
use crate::memory::{ask, index, last_tool_result, memory_daemon, memory_toml};
use crate::support::daemon::{TestDaemon, parse_jsonl};
use crate::support::e2e::{
    agentd_toml, daemon_with, db_rows, fifo_write, provider_toml, telegram_daemon_unstarted,
    wait_outcome,
};
use crate::support::fake_embed::FakeEmbed;
use crate::support::fake_llm::{FakeLlm, Reply, Wire, last_user_text};
use crate::support::fake_telegram::FakeTelegram;
use crate::support::wait_until;

const WAIT: Duration = Duration::from_secs(120);
const TOKEN: &str = "123456:TEST-backup-token";

fn run(cmd: &mut std::process::Command) -> Output {
    cmd.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .expect("run agentd")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The `--state-dir` argument of `restore`.
fn state_dir(dir: &Path) -> String {
    format!("--state-dir={}", dir.display())
}

/// `agentd backup --to <to> --json` for `d`; panics unless it succeeded.
fn backup(d: &TestDaemon, to: &Path) -> Value {
    let out = run(&mut d.agentd(&["backup", "--json", "--to", &to.to_string_lossy()]));
    assert!(out.status.success(), "backup failed: {}", text(&out));
    serde_json::from_slice(&out.stdout).expect("one JSON document")
}

/// Every trail line of every session under `sessions`, live ones only.
fn all_lines(sessions: &Path) -> Vec<Value> {
    let mut names: Vec<PathBuf> = fs::read_dir(sessions)
        .map(|rd| rd.map(|e| e.unwrap().path()).collect())
        .unwrap_or_default();
    names.sort();
    names
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
        .flat_map(|p| parse_jsonl(&p.to_string_lossy(), &fs::read_to_string(p).unwrap()))
        .collect()
}

/// Intake id → its reply text, for every intake of `lines` (`None`: no ending yet).
fn replies(lines: &[Value]) -> BTreeMap<String, Option<String>> {
    let mut out = BTreeMap::new();
    for l in lines {
        if l["type"] == "intake" {
            out.entry(l["id"].as_str().unwrap().to_owned())
                .or_insert(None);
        }
    }
    for l in lines {
        if l["final"] == true || l["type"] == "failure" {
            for id in l["reply_to"].as_array().unwrap() {
                out.insert(id.as_str().unwrap().to_owned(), Some(outcome_text(l)));
            }
        }
    }
    out
}

/// 20 Telegram chats send while `agentd backup` runs. The backup, restored into a new state
/// directory and run by a new daemon: every message acknowledged before the backup is there
/// with its reply or named as in flight, the ledger is the original's up to the backup, the
/// scheduled messages are there, and no reply in the backup is sent again.
#[test]
fn a_backup_under_load_restores_every_acknowledged_message_once() {
    let users: Vec<i64> = (1001..=1020).collect();
    let llm = FakeLlm::spawn(Wire::OpenAi);
    let tg = FakeTelegram::spawn(TOKEN);
    let mut d = telegram_daemon_unstarted(&llm, &tg, TOKEN, &users, "", "", "debounce_ms = 0");
    d.start();
    for u in &users {
        tg.push_text(*u, *u, &format!("first from {u}"));
    }
    wait_until(WAIT, "20 first replies", || {
        (tg.sent().len() >= users.len()).then_some(())
    });
    // A one-shot scheduled message, written as the schedule_message tool would.
    let conn = rusqlite::Connection::open(d.state_dir.join("agentd.db")).unwrap();
    conn.execute(
        "INSERT INTO scheduled (id, target, text, due_at, created_at, created_by) \
         VALUES ('s-1', 'alice', 'water the plants', 4102444800, 0, 'alice')",
        [],
    )
    .unwrap();
    drop(conn);
    // One second message is held at the model while the backup runs (it is in flight for
    // sure, and answered after the backup); the others arrive during it.
    let gate = Arc::new(Semaphore::new(0));
    let held = gate.clone();
    llm.set_responder(move |body| {
        last_user_text(body)
            .contains("second from 1001")
            .then(|| Reply::text("held answer").gated(&held))
    });
    let held_update = tg.push_text(1001, 1001, "second from 1001");
    let held_id = format!("tg-{}-{}", tg.bot_id(), held_update.update_id);
    wait_until(WAIT, "the held message at the model", || {
        (llm.requests().iter())
            .any(|b| last_user_text(b).contains("second from 1001"))
            .then_some(())
    });
    let file = d.dir.path().join("load.tar.zst");
    let report = std::thread::scope(|s| {
        s.spawn(|| {
            for u in &users[1..] {
                tg.push_text(*u, *u, &format!("second from {u}"));
            }
        });
        backup(&d, &file)
    });
    gate.add_permits(1);
    wait_until(WAIT, "40 replies", || {
        (tg.sent().len() >= 2 * users.len()).then_some(())
    });
    let ledger_after = db_rows(&d.state_dir);
    d.sigterm();

    let verify = run(&mut d.agentd(&["backup", "verify", &file.to_string_lossy()]));
    assert!(verify.status.success(), "{}", text(&verify));

    // Restore into the state directory of a second daemon, on new fakes.
    let llm2 = FakeLlm::spawn(Wire::OpenAi);
    let tg2 = FakeTelegram::spawn(TOKEN);
    tg2.start_update_ids_at(1_000_000);
    let mut d2 = telegram_daemon_unstarted(&llm2, &tg2, TOKEN, &users, "", "", "debounce_ms = 0");
    let out = run(&mut d2.agentd(&[
        "restore",
        &file.to_string_lossy(),
        &state_dir(&d2.state_dir),
    ]));
    assert!(out.status.success(), "restore failed: {}", text(&out));

    let restored = all_lines(&d2.sessions_dir());
    let in_flight: BTreeSet<String> = report["in_flight"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["intake_id"].as_str().unwrap().to_owned())
        .collect();
    let restored_replies = replies(&restored);
    // Every first message (answered before the backup started) is there with its reply.
    assert!(
        restored_replies.len() >= users.len(),
        "{restored_replies:?}"
    );
    for (id, reply) in &restored_replies {
        assert!(
            reply.is_some() || in_flight.contains(id),
            "intake {id} is in the backup without its reply and not named in flight ({in_flight:?})"
        );
    }
    let firsts = restored_replies
        .values()
        .filter(|r| r.as_deref().is_some_and(|r| r.contains("first from")))
        .count();
    assert_eq!(firsts, users.len(), "{restored_replies:?}");
    // The ledger is the original's as it was at backup time: its first rows, one per reply.
    let ledger = db_rows(&d2.state_dir);
    let answered = restored.iter().filter(|l| l["final"] == true).count();
    assert!(
        ledger.len() >= answered,
        "{} rows, {answered} replies",
        ledger.len()
    );
    assert_eq!(ledger[..], ledger_after[..ledger.len()]);
    let conn = rusqlite::Connection::open(d2.state_dir.join("agentd.db")).unwrap();
    let scheduled: String = conn
        .query_row("SELECT text FROM scheduled WHERE id = 's-1'", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(scheduled, "water the plants");
    drop(conn);

    // What was in flight at backup time may have been answered after it (the held message
    // was): the restore closed it, so the restored daemon answers only new messages and sends
    // nothing of the backup again.
    assert!(in_flight.contains(&held_id), "{in_flight:?}");
    for id in &in_flight {
        let ending = restored_replies
            .get(id)
            .cloned()
            .flatten()
            .unwrap_or_default();
        assert!(ending.contains("send it again"), "{id}: {ending:?}");
    }
    d2.start();
    let probe = tg2.push_text(1001, 1001, "after the restore");
    let probe_id = format!("tg-{}-{}", tg2.bot_id(), probe.update_id);
    wait_until(WAIT, "the probe answered", || {
        replies(&all_lines(&d2.sessions_dir()))
            .get(&probe_id)
            .cloned()
            .flatten()
    });
    wait_until(WAIT, "the probe's reply sent", || {
        (!tg2.sent().is_empty()).then_some(())
    });
    // A graceful stop finishes whatever was queued: anything re-answered would show now.
    assert!(d2.sigterm().success());
    let asked: Vec<String> = llm2.requests().iter().map(last_user_text).collect();
    assert!(
        asked.len() == 1 && asked[0].contains("after the restore"),
        "only the new message reached the model: {asked:?}"
    );
    let sent_again: Vec<String> = tg2.sent().into_iter().map(|m| m.plain).collect();
    assert_eq!(
        sent_again.len(),
        1,
        "only the probe's reply: {sent_again:?}"
    );
    let endings = all_lines(&d2.sessions_dir())
        .into_iter()
        .filter(|l| l["final"] == true || l["type"] == "failure")
        .flat_map(|l| l["reply_to"].as_array().cloned().unwrap_or_default())
        .filter(|id| in_flight.contains(id.as_str().unwrap_or_default()))
        .count();
    assert_eq!(endings, in_flight.len(), "one ending per message in flight");
}

/// Memory search after a restore returns what it returned before the backup: the notes'
/// chunks and embeddings (memory.db, copied online) and a fact written by the tool, searched
/// by the restored daemon over the restored workspace.
#[test]
fn memory_search_finds_the_same_after_a_restore() {
    let call = |name: &str, args: Value| Reply::ToolCalls {
        text: None,
        calls: vec![(format!("c-{name}"), name.to_string(), args)],
        usage: Default::default(),
    };
    let searches = [
        json!({"query": "washing machine"}),
        json!({"query": "when is Mum's birthday?"}),
    ];
    let embed = FakeEmbed::spawn();
    let llm = FakeLlm::spawn(Wire::Anthropic);
    let mut d = memory_daemon(&llm, Some(&embed), "");
    index(&d);
    d.start();
    llm.push(call(
        "memory_write",
        json!({"entity": "Anna Schmidt", "attribute": "birthday", "value": "4 May", "aliases": ["Mum"]}),
    ));
    for q in &searches {
        llm.push(call("memory_search", q.clone()));
    }
    llm.push(Reply::text("noted"));
    let reqs = ask(&d, &llm, "look things up", 4);
    let before = [last_tool_result(&reqs[2]), last_tool_result(&reqs[3])];
    assert!(before[0].contains("washing-machine.md"), "{}", before[0]);
    assert!(before[1].contains("4 May"), "{}", before[1]);
    let file = d.dir.path().join("memory.tar.zst");
    backup(&d, &file);
    assert!(d.sigterm().success());

    let llm2 = FakeLlm::spawn(Wire::Anthropic);
    let config = format!("{}{}", agentd_toml("fake"), memory_toml(Some(&embed), ""));
    let mut d2 = TestDaemon::new(
        &config,
        &[("fake", &provider_toml("anthropic", &llm2.base_url()))],
    );
    let _ = fs::remove_dir_all(d2.workspace());
    let out = run(&mut d2.agentd(&[
        "restore",
        &file.to_string_lossy(),
        &state_dir(&d2.state_dir),
        &format!("--workspace={}", d2.workspace().display()),
    ]));
    assert!(out.status.success(), "restore failed: {}", text(&out));
    d2.start();
    for q in &searches {
        llm2.push(call("memory_search", q.clone()));
    }
    llm2.push(Reply::text("found"));
    let reqs = ask(&d2, &llm2, "look them up again", 3);
    let after = [last_tool_result(&reqs[1]), last_tool_result(&reqs[2])];
    assert_eq!(after, before, "the same hits, sources and facts");
    assert!(d2.sigterm().success());
}

/// A state with one answered message, backed up while the daemon is stopped.
fn backed_up_state() -> (TestDaemon, FakeLlm, PathBuf) {
    let fake = FakeLlm::spawn(Wire::OpenAi);
    let mut d = daemon_with(&fake, "openai");
    fifo_write(
        &d,
        r#"{"id":"b1","type":"user","text":"remember this","sender":"bob"}"#,
    );
    wait_outcome(&d, "bob", "b1");
    d.sigterm();
    let file = d.dir.path().join("state.tar.zst");
    backup(&d, &file);
    (d, fake, file)
}

/// Rewrite the archive `from` into `to` through `edit` (entry path, bytes → new bytes, or
/// `None` to leave the entry out).
fn rewrite(from: &Path, to: &Path, edit: impl Fn(&str, Vec<u8>) -> Option<Vec<u8>>) {
    let mut archive = tar::Archive::new(zstd::Decoder::new(fs::File::open(from).unwrap()).unwrap());
    let out = zstd::Encoder::new(fs::File::create(to).unwrap(), 3).unwrap();
    let mut builder = tar::Builder::new(out);
    for entry in archive.entries().unwrap() {
        let mut entry = entry.unwrap();
        let path = entry.path().unwrap().to_string_lossy().into_owned();
        let mut bytes = Vec::new();
        entry.read_to_end(&mut bytes).unwrap();
        if let Some(bytes) = edit(&path, bytes) {
            let mut h = tar::Header::new_gnu();
            h.set_size(bytes.len() as u64);
            h.set_mode(0o600);
            builder.append_data(&mut h, &path, &bytes[..]).unwrap();
        }
    }
    builder.into_inner().unwrap().finish().unwrap();
}

/// `verify` passes a whole backup and names a trail with a flipped byte, a truncated database
/// and a missing file, each by its path, with exit code 1; `restore` refuses such a backup.
#[test]
fn verify_names_a_flipped_byte_a_truncated_database_and_a_missing_file() {
    let (d, _fake, file) = backed_up_state();
    let ok = run(&mut d.agentd(&["backup", "verify", &file.to_string_lossy()]));
    assert!(ok.status.success(), "{}", text(&ok));
    assert!(text(&ok).contains(": OK"), "{}", text(&ok));

    let bad = d.dir.path().join("bad.tar.zst");
    let trail = std::cell::RefCell::new(String::new());
    rewrite(&file, &bad, |path, mut bytes| {
        if path.ends_with(".jsonl") && trail.borrow().is_empty() {
            *trail.borrow_mut() = path.to_owned();
            bytes[10] ^= 0x01;
        } else if path == "state/agentd.db" {
            bytes.truncate(bytes.len() / 2);
        } else if path == "config/agentd.toml" {
            return None;
        }
        Some(bytes)
    });
    let out = run(&mut d.agentd(&["backup", "verify", &bad.to_string_lossy()]));
    let report = text(&out);
    assert_eq!(out.status.code(), Some(1), "{report}");
    let trail = trail.into_inner();
    assert!(
        report.contains(&format!("{trail}: SHA-256 differs")),
        "{report}"
    );
    assert!(report.contains("state/agentd.db: size"), "{report}");
    assert!(
        report.contains("state/agentd.db: not a readable database")
            || report.contains("state/agentd.db: integrity check"),
        "{report}"
    );
    assert!(report.contains("config/agentd.toml: missing"), "{report}");

    let target = d.dir.path().join("restored");
    let out = run(&mut d.agentd(&["restore", &bad.to_string_lossy(), &state_dir(&target)]));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        !target.exists(),
        "a refused restore wrote {}",
        target.display()
    );
}

/// `restore` refuses a non-empty directory, and `--force` moves it aside, never deleting it.
#[test]
fn restore_refuses_a_non_empty_directory_and_force_moves_it_aside() {
    let (d, _fake, file) = backed_up_state();
    let target = d.dir.path().join("taken");
    fs::create_dir_all(&target).unwrap();
    fs::write(target.join("keep.txt"), "mine").unwrap();
    let out = run(&mut d.agentd(&["restore", &file.to_string_lossy(), &state_dir(&target)]));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("--force"), "{}", text(&out));
    let out = run(&mut d.agentd(&[
        "restore",
        &file.to_string_lossy(),
        "--force",
        &state_dir(&target),
    ]));
    assert!(out.status.success(), "{}", text(&out));
    assert!(target.join("agentd.db").is_file());
    let aside: Vec<PathBuf> = fs::read_dir(d.dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().contains("taken.before-restore-"))
        .collect();
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert_eq!(
        fs::read_to_string(aside[0].join("keep.txt")).unwrap(),
        "mine"
    );
}

/// A backup killed with SIGKILL while it writes leaves no file under its name (only a hidden
/// temp file, which `verify` does not take for a backup).
#[test]
fn kill9_during_a_backup_leaves_no_complete_looking_file() {
    let (d, _fake, _) = backed_up_state();
    // Enough incompressible bytes that the backup is still writing when it is killed.
    let mut noise = vec![0u8; 48 << 20];
    rand::RngCore::fill_bytes(&mut rand::rng(), &mut noise);
    fs::write(d.workspace().join("noise.bin"), &noise).unwrap();
    let dir = d.dir.path().join("out");
    fs::create_dir_all(&dir).unwrap();
    let to = dir.join("killed.tar.zst");
    let mut child = d
        .agentd(&["backup", "--to", &to.to_string_lossy()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let temp = wait_until(WAIT, "the backup's temp file", || {
        fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| {
                let name = p.file_name().unwrap().to_string_lossy();
                name.starts_with(".killed.tar.zst.tmp.") && p.metadata().is_ok_and(|m| m.len() > 0)
            })
    });
    child.kill().unwrap();
    let status = child.wait().unwrap();
    assert!(
        !status.success(),
        "the backup finished before it was killed"
    );
    assert!(!to.exists(), "a killed backup left {}", to.display());
    let name = temp.file_name().unwrap().to_string_lossy().into_owned();
    assert!(name.starts_with(".killed.tar.zst.tmp."), "{name}");
    let out = run(&mut d.agentd(&["backup", "verify", &temp.to_string_lossy()]));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
}

/// A backup onto a full disk fails with an error that says so and leaves no file; the daemon,
/// running meanwhile, keeps answering.
#[test]
fn a_full_disk_fails_the_backup_clearly_and_the_daemon_keeps_answering() {
    let fake = FakeLlm::spawn(Wire::OpenAi);
    let d = daemon_with(&fake, "openai");
    fifo_write(
        &d,
        r#"{"id":"f1","type":"user","text":"before","sender":"fay"}"#,
    );
    wait_outcome(&d, "fay", "f1");
    let mut noise = vec![0u8; 3 << 20];
    rand::RngCore::fill_bytes(&mut rand::rng(), &mut noise);
    fs::write(d.workspace().join("noise.bin"), &noise).unwrap();
    let mount = d.dir.path().join("small");
    let tmpfs = PrivateTmpfs::mount(&mount, "1m");
    let to = mount.join("full.tar.zst");
    let ns = tmpfs.nsenter();
    let cmd = d.agentd(&["backup", "--to", &to.to_string_lossy()]);
    let program = cmd.get_program().to_owned();
    let args: Vec<_> = cmd.get_args().map(ToOwned::to_owned).collect();
    let envs: Vec<_> = cmd
        .get_envs()
        .map(|(k, v)| (k.to_owned(), v.map(ToOwned::to_owned)))
        .collect();
    let mut wrapped = std::process::Command::new(&ns[0]);
    wrapped.args(&ns[1..]).arg(program).args(args);
    for (k, v) in envs {
        match v {
            Some(v) => wrapped.env(k, v),
            None => wrapped.env_remove(k),
        };
    }
    let out = run(&mut wrapped);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).to_lowercase().contains("no space left"),
        "{}",
        text(&out)
    );
    let left: Vec<_> = fs::read_dir(tmpfs.view(&mount)).unwrap().collect();
    assert!(left.is_empty(), "the failed backup left {left:?}");
    fifo_write(
        &d,
        r#"{"id":"f2","type":"user","text":"after","sender":"fay"}"#,
    );
    wait_outcome(&d, "fay", "f2");
}

/// An `agentd.db` at schema version 4 (as the release before the cost spool left it).
fn old_database(path: &Path, break_migration: bool) {
    let conn = rusqlite::Connection::open(path).unwrap();
    for sql in [
        include_str!("../../src/store/migrations/0001_init.sql"),
        include_str!("../../src/store/migrations/0002_scheduled.sql"),
        include_str!("../../src/store/migrations/0003_fallback.sql"),
        include_str!("../../src/store/migrations/0004_cost_autopilot.sql"),
    ] {
        conn.execute_batch(sql).unwrap();
    }
    conn.execute_batch("PRAGMA user_version = 4; PRAGMA journal_mode = WAL;")
        .unwrap();
    conn.execute("INSERT INTO kv (key, value) VALUES ('old', 'value')", [])
        .unwrap();
    if break_migration {
        // Version 5 creates this table: the migration fails on it.
        conn.execute_batch("CREATE TABLE cost_spool_applied (x)")
            .unwrap();
    }
}

fn sha(path: &Path) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(fs::read(path).unwrap());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// Before it migrates an older `agentd.db`, the daemon writes a backup and names it in the
/// log; the backup verifies and holds the database as it was.
#[test]
fn an_older_database_is_backed_up_before_its_migration() {
    let fake = FakeLlm::spawn(Wire::OpenAi);
    let mut d = TestDaemon::new(
        &agentd_toml("fake"),
        &[("fake", &provider_toml("openai", &fake.base_url()))],
    );
    fs::create_dir_all(&d.state_dir).unwrap();
    old_database(&d.state_dir.join("agentd.db"), false);
    d.start();
    d.wait_log("wrote a backup before migrating the databases");
    let backups: Vec<PathBuf> = fs::read_dir(d.state_dir.join("backups"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(backups.len(), 1, "{backups:?}");
    let name = backups[0].to_string_lossy().into_owned();
    assert!(d.log().contains(&name), "the log does not name {name}");
    let out = run(&mut d.agentd(&["backup", "verify", "--json", &name]));
    assert!(out.status.success(), "{}", text(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["manifest"]["schemas"]["agentd_db"], 4);
    d.sigterm();
}

/// A migration that fails leaves the database file as it was, and the daemon exits with a
/// message naming the backup written before it.
#[test]
fn a_failed_migration_leaves_the_files_as_they_were_and_names_the_backup() {
    let fake = FakeLlm::spawn(Wire::OpenAi);
    let d = TestDaemon::new(
        &agentd_toml("fake"),
        &[("fake", &provider_toml("openai", &fake.base_url()))],
    );
    fs::create_dir_all(&d.state_dir).unwrap();
    let db = d.state_dir.join("agentd.db");
    old_database(&db, true);
    let before = sha(&db);
    let out = run(&mut d.agentd(&["run"]));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = text(&out);
    assert!(err.contains("as they were before"), "{err}");
    let backups: Vec<PathBuf> = fs::read_dir(d.state_dir.join("backups"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(backups.len(), 1, "{backups:?}");
    assert!(err.contains(&*backups[0].to_string_lossy()), "{err}");
    assert_eq!(sha(&db), before, "the failed migration changed agentd.db");
    let conn = rusqlite::Connection::open(&db).unwrap();
    let version: i64 = conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .unwrap();
    assert_eq!(version, 4);
}

/// `agentd_backups_total{result}` of the daemon's `/metrics`.
fn backups_counted(port: u16, token: &str, result: &str) -> u64 {
    let (_, text) = http(port, "GET", "/metrics", Some(token), None).unwrap_or_default();
    let series = format!("agentd_backups_total{{result=\"{result}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&series))
        .and_then(|n| n.trim().parse::<f64>().ok())
        .map_or(0, |n| n as u64)
}

fn monitor(d: &TestDaemon) -> Value {
    fs::read_to_string(d.state_dir.join("monitor.json"))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(Value::Null)
}

fn scheduled_backups(dir: &Path) -> usize {
    fs::read_dir(dir).map_or(0, |rd| {
        rd.filter(|e| {
            let name = e
                .as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .into_owned();
            name.starts_with("agentd-backup-") && name.ends_with(".tar.zst")
        })
        .count()
    })
}

/// `[backup] every` writes backups in the daemon, keeps the newest `keep`, counts them in
/// `/metrics` and shows the last in `monitor.json`; a failed one is an alert in the monitor
/// (and the log) while the daemon keeps answering, and the next good one ends it.
#[test]
fn scheduled_backups_are_kept_counted_shown_and_a_failure_alerts() {
    const TOKEN: &str = "backup-http-token";
    let fake = FakeLlm::spawn(Wire::OpenAi);
    let port = free_port();
    let mut d = TestDaemon::new(
        &format!(
            "{}\n[http]\nenabled = true\nport = {port}\n\n[backup]\nevery = \"1s\"\nkeep = 2\ndir = \"../backups\"\n",
            agentd_toml("fake")
        ),
        &[("fake", &provider_toml("openai", &fake.base_url()))],
    );
    d.set_env("AGENTD_HTTP_TOKEN", TOKEN);
    d.start();
    let dir = d.dir.path().join("backups");
    wait_until(WAIT, "three scheduled backups", || {
        (backups_counted(port, TOKEN, "ok") >= 3).then_some(())
    });
    wait_until(WAIT, "two backups kept", || {
        (scheduled_backups(&dir) == 2).then_some(())
    });
    assert_eq!(monitor(&d)["backup"]["ok"], true, "{}", monitor(&d));

    // The directory becomes a file: the next backups fail.
    fs::remove_dir_all(&dir).unwrap();
    fs::write(&dir, "in the way").unwrap();
    wait_until(WAIT, "a failed backup counted", || {
        (backups_counted(port, TOKEN, "failed") >= 1).then_some(())
    });
    let alerts = wait_until(WAIT, "the backup alert", || {
        let m = monitor(&d);
        let alerts = m["alerts"].as_array().cloned().unwrap_or_default();
        alerts.into_iter().find(|a| a["kind"] == "backup")
    });
    assert!(
        alerts["message"].as_str().unwrap().contains("backups"),
        "{alerts}"
    );
    d.wait_log("scheduled backup into");
    fifo_write(
        &d,
        r#"{"id":"s1","type":"user","text":"still there?","sender":"sam"}"#,
    );
    wait_outcome(&d, "sam", "s1");

    fs::remove_file(&dir).unwrap();
    wait_until(WAIT, "the alert over", || {
        let m = monitor(&d);
        let open = m["alerts"]
            .as_array()
            .is_some_and(|a| a.iter().any(|a| a["kind"] == "backup"));
        (!open && m["backup"]["ok"] == true).then_some(())
    });
    d.sigterm();
}
