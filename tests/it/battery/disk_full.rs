//! A full disk: the state directory on a small tmpfs that the test fills to the last byte and
//! then frees again.
//!
//! Mounting needs no privileges: the tmpfs lives in a private mount namespace of an
//! unprivileged user namespace (`unshare --user --map-root-user --mount`, util-linux), held
//! open by a `sleep` process. The daemon and `agent-send` run inside it through `nsenter`;
//! the test reads and fills the files through `/proc/<holder>/root/…`, the holder's view of
//! the same mount. SQLite files are copied out before `PRAGMA integrity_check`, because SQLite
//! resolves the `/proc/<pid>/root` link to the host's (empty) directory.

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::sync::Semaphore;

use super::{assert_db_intact, check_state_files, completes, free_port, http, outcome_text};
use crate::support::daemon::TestDaemon;
use crate::support::e2e::{agentd_toml, provider_toml};
use crate::support::fake_llm::{FakeLlm, Reply, Wire, last_user_text};
use crate::support::fake_telegram::FakeTelegram;
use crate::support::wait_until;

const TG_TOKEN: &str = "123456:TEST-diskfull-token";
const HTTP_TOKEN: &str = "diskfull-http-token";
const ALICE: i64 = 1001;
const WAIT: Duration = Duration::from_secs(60);
/// The size of the state directory's filesystem.
const TMPFS_SIZE: &str = "8m";

/// A tmpfs mounted in a private mount namespace, held by a `sleep` process (killed on drop,
/// which unmounts it).
pub(crate) struct PrivateTmpfs {
    holder: Child,
    /// The mount point as the processes inside see it (a directory on the host that stays
    /// empty there).
    inner: PathBuf,
}

impl PrivateTmpfs {
    pub(crate) fn mount(mount_point: &Path, size: &str) -> PrivateTmpfs {
        fs::create_dir_all(mount_point).expect("create the mount point");
        let script = "mount -t tmpfs -o size=\"$1\",mode=0700 agentd-battery \"$2\" && echo mounted && exec sleep 100000";
        let mut holder = Command::new("unshare")
            .args([
                "--user",
                "--map-root-user",
                "--mount",
                "--propagation",
                "private",
            ])
            .args(["sh", "-c", script, "sh", size])
            .arg(mount_point)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("cannot run unshare (util-linux)");
        let mut line = String::new();
        BufReader::new(holder.stdout.take().expect("piped stdout"))
            .read_line(&mut line)
            .expect("read the holder's output");
        if line.trim() != "mounted" {
            let _ = holder.kill();
            let out = holder.wait_with_output().expect("holder output");
            panic!(
                "cannot mount a tmpfs in a private user and mount namespace (the disk-full test \
                 needs unprivileged user namespaces: `unshare --user --map-root-user --mount`): {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        PrivateTmpfs {
            holder,
            inner: mount_point.to_path_buf(),
        }
    }

    /// `path` (inside the mount) as seen from the test, through the holder's root.
    pub(crate) fn view(&self, inner: &Path) -> PathBuf {
        let rel = inner.strip_prefix("/").expect("absolute path");
        PathBuf::from(format!("/proc/{}/root", self.holder.id())).join(rel)
    }

    /// The command prefix that runs a program inside the namespaces.
    pub(crate) fn nsenter(&self) -> Vec<String> {
        [
            "nsenter",
            "--target",
            &self.holder.id().to_string(),
            "--user",
            "--mount",
            "--preserve-credentials",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    }

    /// Writes a filler file until the filesystem has no free byte left; returns its path (as
    /// seen from the test) and its size.
    fn fill(&self) -> (PathBuf, u64) {
        let path = self.view(&self.inner.join("filler"));
        let mut f = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(&path)
            .expect("create the filler");
        let mut size = 0u64;
        for chunk in [1 << 16, 1 << 12, 1] {
            let buf = vec![0xA5u8; chunk];
            loop {
                match f.write(&buf) {
                    Ok(0) => break,
                    Ok(n) => size += n as u64,
                    Err(e) if e.raw_os_error() == Some(nix::libc::ENOSPC) => break,
                    Err(e) => panic!("filling the disk: {e}"),
                }
            }
        }
        (path, size)
    }
}

impl Drop for PrivateTmpfs {
    fn drop(&mut self) {
        let _ = self.holder.kill();
        let _ = self.holder.wait();
    }
}

/// `PRAGMA integrity_check` on copies of `db` and its WAL (taken while no daemon runs).
fn assert_db_copy_intact(db: &Path) {
    if !db.exists() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let name = db.file_name().expect("file name");
    for suffix in ["", "-wal"] {
        let mut from = db.as_os_str().to_owned();
        from.push(suffix);
        let mut to = dir.path().join(name).into_os_string();
        to.push(suffix);
        if Path::new(&from).exists() {
            fs::copy(&from, &to).unwrap_or_else(|e| panic!("copy {from:?}: {e}"));
        }
    }
    assert_db_intact(&dir.path().join(name));
}

/// CPU time (user + system) the process has used, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).expect("read /proc/<pid>/stat");
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .expect("stat format")
        .1
        .split_whitespace()
        .collect();
    // After the command: state is field 3, utime field 14, stime field 15.
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

fn intake_id(d: &TestDaemon, key: &str, text: &str) -> String {
    wait_until(WAIT, &format!("the intake of {text:?}"), || {
        d.trail(key)
            .iter()
            .find(|l| l["type"] == "intake" && l["text"].as_str().is_some_and(|t| t.contains(text)))
            .and_then(|l| l["id"].as_str().map(str::to_string))
    })
}

fn outcome(d: &TestDaemon, key: &str, id: &str) -> Value {
    wait_until(WAIT, &format!("the outcome of {id}"), || {
        d.trail(key).into_iter().find(|l| completes(l, id))
    })
}

#[test]
fn full_disk_is_reported_survived_and_recovered() {
    let llm = FakeLlm::spawn(Wire::OpenAi);
    let tg = FakeTelegram::spawn(TG_TOKEN);
    let port = free_port();
    let toml = agentd_toml("fake").replace(
        "[behavior]",
        &format!(
            "[channel.telegram]\nenabled = true\napi_url = \"{}\"\nallow_from = [{ALICE}]\n\
             poll_timeout_seconds = 1\nformat = \"plain\"\ncontacts = {{ Alice = {ALICE} }}\n\n\
             [http]\nenabled = true\nport = {port}\n\n[behavior]\ndebounce_ms = 0",
            tg.api_url()
        ),
    );
    let mut d = TestDaemon::new(
        &toml,
        &[("fake", &provider_toml("openai", &llm.base_url()))],
    );
    let fs_ = PrivateTmpfs::mount(&d.dir.path().join("small-disk"), TMPFS_SIZE);
    let inner_state = fs_.inner.join("state");
    d.run_through(fs_.nsenter(), inner_state.clone());
    d.state_dir = fs_.view(&inner_state);
    d.set_env("AGENTD_TELEGRAM_TOKEN", TG_TOKEN);
    d.set_env("AGENTD_HTTP_TOKEN", HTTP_TOKEN);
    d.start();
    wait_until(WAIT, "the HTTP API", || {
        matches!(
            http(port, "GET", "/api/v1/status", None, None),
            Ok((200, _))
        )
        .then_some(())
    });

    // Before: an ordinary round trip.
    let out = d.agent_send(&[
        "-m",
        "before the disk fills",
        "--from",
        "bob",
        "--wait",
        "30",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // A message acknowledged before the disk fills, its model call held open. Its answer is
    // bigger than a page, so recording it needs space the disk will not have.
    let gate = Arc::new(Semaphore::new(0));
    let big_answer = format!("the big answer {}", "x".repeat(12_000));
    llm.push(Reply::text(big_answer.clone()).gated(&gate));
    let out = d.agent_send(&["-m", "in flight while the disk fills", "--from", "bob"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let in_flight = intake_id(&d, "bob", "in flight while the disk fills");
    wait_until(WAIT, "the held model call", || {
        (llm.requests().len() == 2).then_some(())
    });

    let (filler, filled) = fs_.fill();
    eprintln!("disk full: filler of {filled} bytes");
    gate.add_permits(1);
    // The answer cannot be recorded: the message waits (it is neither dropped nor failed).
    wait_until(WAIT, "the daemon to report the full disk", || {
        d.log()
            .lines()
            .any(|l| {
                l.contains("cannot write the session trail; the message waits and retries")
                    && l.contains("No space left on device")
            })
            .then_some(())
    });

    // Failed writes can give pages back (a rolled-back SQLite transaction, a removed temp
    // file): take them too, so that no new trail line fits. A new session's first intake needs
    // one page, for its trail file (its index entry is written in the background afterwards).
    let (_, more) = fs_.fill();
    eprintln!("disk full again: {more} more bytes of filler");

    // While full: nothing new is acknowledged, and every source says so.
    let (status, body) = http(
        port,
        "POST",
        "/api/v1/notify",
        Some(HTTP_TOKEN),
        Some(&json!({"message": "notify while full", "source": "battery"})),
    )
    .expect("HTTP notify while full");
    assert_eq!(status, 503, "notify while the disk is full: {body}");
    let err: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
    assert!(
        err["error"]
            .as_str()
            .is_some_and(|e| e.contains("No space left on device")),
        "{err}"
    );
    let out = d.agent_send(&["-m", "fifo while full", "--from", "carol", "--timeout", "3"]);
    assert_eq!(
        out.status.code(),
        Some(3),
        "agent-send times out: the daemon could not record the line; stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let update = tg.push_text(ALICE, ALICE, "telegram while full");
    wait_until(WAIT, "the Telegram update to be refused", || {
        d.log()
            .lines()
            .any(|l| l.contains("NOT accepted") && l.contains(&format!("-{}", update.update_id)))
            .then_some(())
    });
    assert!(
        tg.pending_update_ids().contains(&update.update_id),
        "the offset did not move past an update that was not recorded"
    );
    // ... but it keeps serving what needs no disk, without spinning.
    let (status, body) =
        http(port, "GET", "/api/v1/status", None, None).expect("status while full");
    assert_eq!(status, 200, "{body}");
    for query in [
        &["--status", "--json"][..],
        &["--sessions", "--json"],
        &["--cost", "--json"],
    ] {
        let out = d.agent_send(query);
        assert!(
            out.status.success(),
            "agent-send {query:?} while full: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let pid = d.pid().expect("daemon pid");
    let (t0, c0) = (Instant::now(), cpu_ticks(pid));
    std::thread::sleep(Duration::from_secs(2));
    let ticks = cpu_ticks(pid) - c0;
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64;
    let cpu = ticks as f64 / hz / t0.elapsed().as_secs_f64();
    assert!(
        cpu < 0.5,
        "the daemon uses {:.0} % of a core while the disk is full",
        cpu * 100.0
    );
    assert!(d.is_running(), "the daemon is still running");
    let files = check_state_files(&d.state_dir);
    assert!(
        files.temp_files.is_empty(),
        "failed writes left temp files: {:?}",
        files.temp_files
    );
    assert!(
        !files.lines.iter().any(|l| completes(l, &in_flight)),
        "the acknowledged message was not answered yet"
    );

    // Space returns: the acknowledged message is answered, new ones are accepted again.
    fs::remove_file(&filler).expect("remove the filler");
    let fin = outcome(&d, "bob", &in_flight);
    assert_eq!(fin["type"], "message", "answered, not failed: {fin}");
    assert_eq!(outcome_text(&fin), big_answer);
    // The log is written by its own thread: it may trail the answer by a moment.
    d.wait_log("the session trail is writable again; the message continues");
    let asked = llm
        .requests()
        .iter()
        .filter(|r| last_user_text(r).contains("in flight while the disk fills"))
        .count();
    assert_eq!(
        asked, 1,
        "the model was not asked again: its answer waited in memory"
    );
    let tg_id = intake_id(&d, "Alice", "telegram while full");
    outcome(&d, "Alice", &tg_id);
    wait_until(WAIT, "the Telegram reply", || {
        (tg.sent().len() == 1).then_some(())
    });
    let out = d.agent_send(&["-m", "fifo after", "--from", "carol", "--wait", "30"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (status, body) = http(
        port,
        "POST",
        "/api/v1/notify",
        Some(HTTP_TOKEN),
        Some(&json!({"message": "notify after", "source": "battery"})),
    )
    .expect("HTTP notify after");
    assert_eq!(status, 202, "{body}");
    let notify_id = intake_id(&d, "system", "notify after");
    outcome(&d, "system", &notify_id);

    // A crash now loses nothing and repeats nothing: every file parses, the databases are
    // intact, and the restart answers nothing twice.
    d.kill9();
    let files = check_state_files(&d.state_dir);
    assert_db_copy_intact(&d.state_dir.join("agentd.db"));
    assert_db_copy_intact(&d.state_dir.join("memory.db"));
    let calls = llm.requests().len();
    d.start();
    assert!(d.sigterm().success());
    assert_eq!(llm.requests().len(), calls, "nothing was left to answer");
    assert_eq!(tg.sent().len(), 1, "the Telegram reply was sent once");
    let intakes: Vec<&Value> = files
        .lines
        .iter()
        .filter(|l| l["type"] == "intake")
        .collect();
    for i in &intakes {
        let id = i["id"].as_str().unwrap();
        let n = files.lines.iter().filter(|l| completes(l, id)).count();
        assert_eq!(n, 1, "intake {i} has {n} outcomes");
    }
    let texts: Vec<&str> = intakes.iter().filter_map(|i| i["text"].as_str()).collect();
    assert!(
        !texts
            .iter()
            .any(|t| t.contains("while full") && !t.contains("telegram")),
        "what was refused while full was not recorded: {texts:?}"
    );
    // Refused intakes of new sessions left no trail files behind: every trail belongs to a
    // session of the index.
    let index: Value = serde_json::from_slice(
        &fs::read(d.sessions_dir().join("sessions.json")).expect("sessions.json"),
    )
    .expect("sessions.json parses");
    let ids: Vec<&str> = index
        .as_object()
        .expect("index object")
        .values()
        .filter_map(|e| e["session_id"].as_str())
        .collect();
    for f in fs::read_dir(d.sessions_dir())
        .expect("sessions dir")
        .flatten()
    {
        let name = f.file_name().to_string_lossy().into_owned();
        if name.ends_with(".jsonl") {
            assert!(
                ids.iter().any(|id| name.starts_with(&format!("{id}."))),
                "{name} belongs to no session (index: {ids:?})"
            );
        }
    }
}
