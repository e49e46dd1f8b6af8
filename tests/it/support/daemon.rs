//! Launcher for the real `agentd` and `agent-send` binaries, driven the way a user drives them:
//! a temporary directory with `config/agentd.toml`, `providers.d/`, a copy of the workspace
//! template and a state directory, a daemon process with its log captured, and readers for the
//! files the daemon writes (session index, JSONL trails).
//!
//! Every method blocks (child processes, file polling). That is fine in `#[test]` functions and
//! in multi-threaded tokio tests; the fake LLM runs on its own thread and is never starved.

use std::fs;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use serde_json::Value;
use tempfile::TempDir;

/// How long `start` waits for the control FIFO.
const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// How long `sigterm` waits for the daemon to exit.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);
/// How long `agent_send` lets the client run.
const AGENT_SEND_TIMEOUT: Duration = Duration::from_secs(60);
/// Poll interval for process and file checks.
const POLL: Duration = Duration::from_millis(20);
/// Lines of log shown in panic messages.
const LOG_TAIL_LINES: usize = 80;

/// A daemon under test and its temporary directory (removed on drop).
pub struct TestDaemon {
    /// The temporary root: `config/`, `providers.d/`, `workspace/`, `state/`, `daemon.<n>.log`.
    pub dir: TempDir,
    /// `<tmp>/state`, passed as `AGENTD_STATE_DIR` (created by the daemon, not by `new`).
    pub state_dir: PathBuf,
    /// `<tmp>/config/agentd.toml`.
    pub config_path: PathBuf,
    child: Option<Child>,
    env: Vec<(String, String)>,
    starts: usize,
    /// See [`TestDaemon::run_through`].
    through: Option<Through>,
    /// See [`TestDaemon::as_unprivileged_user`].
    unprivileged: bool,
}

/// The uid and gid `as_unprivileged_user` runs the daemon under (`nobody`).
pub const UNPRIVILEGED_ID: u32 = 65534;

/// `setpriv` (util-linux) switches to [`UNPRIVILEGED_ID`] and drops every supplementary group.
const SETPRIV: &str = "/usr/bin/setpriv";

/// A command prefix the daemon and `agent-send` run through, and the state directory as they
/// see it.
struct Through {
    wrapper: Vec<String>,
    state_dir: PathBuf,
}

impl TestDaemon {
    /// Creates `<tmp>/config/agentd.toml` (exactly `agentd_toml`), `<tmp>/providers.d/<name>.toml`
    /// for each `(name, text)`, and `<tmp>/workspace` as a recursive copy of the repository's
    /// `workspace/` template (empty when the template does not exist). Does not start anything.
    ///
    /// A config written for this layout uses `workspace = "../workspace"` and
    /// `[providers] dir = "../providers.d"` (relative to the config file).
    pub fn new(agentd_toml: &str, providers: &[(&str, &str)]) -> TestDaemon {
        let dir = tempfile::Builder::new()
            .prefix("agentd-it-")
            .tempdir()
            .expect("cannot create a temporary directory");
        let root = dir.path();
        let config_dir = root.join("config");
        fs::create_dir_all(&config_dir).expect("cannot create <tmp>/config");
        let config_path = config_dir.join("agentd.toml");
        fs::write(&config_path, agentd_toml).expect("cannot write agentd.toml");

        let providers_dir = root.join("providers.d");
        fs::create_dir_all(&providers_dir).expect("cannot create <tmp>/providers.d");
        for (name, text) in providers {
            assert!(
                !name.is_empty() && !name.contains('/') && !name.ends_with(".toml"),
                "provider name {name:?} must be a bare name like \"anthropic\""
            );
            fs::write(providers_dir.join(format!("{name}.toml")), text)
                .unwrap_or_else(|e| panic!("cannot write providers.d/{name}.toml: {e}"));
        }

        let template = Path::new(env!("CARGO_MANIFEST_DIR")).join("workspace");
        let workspace = root.join("workspace");
        if template.is_dir() {
            copy_dir_recursive(&template, &workspace);
        } else {
            fs::create_dir_all(&workspace).expect("cannot create <tmp>/workspace");
        }

        TestDaemon {
            state_dir: root.join("state"),
            config_path,
            dir,
            child: None,
            env: Vec::new(),
            starts: 0,
            through: None,
            unprivileged: false,
        }
    }

    /// Runs the daemon and `agent-send` as uid/gid 65534 (`nobody`, no supplementary groups)
    /// through `setpriv`, as a real deployment runs under a dedicated user; the temporary root
    /// and everything in it is chowned to that uid before every start, so files the test adds
    /// later (`config/.env`, scripts) belong to the daemon too. CI runs as root: this needs
    /// root (to switch uid), and panics saying so otherwise.
    pub fn as_unprivileged_user(&mut self) {
        assert!(
            nix::unistd::geteuid().is_root(),
            "TestDaemon::as_unprivileged_user needs root to switch to uid {UNPRIVILEGED_ID}; \
             run this test as root (as CI does)"
        );
        assert!(
            Path::new(SETPRIV).exists(),
            "TestDaemon::as_unprivileged_user needs {SETPRIV} (util-linux)"
        );
        // The daemon must reach its own binary: every parent directory must be traversable.
        let exe = Path::new(env!("CARGO_BIN_EXE_agentd"));
        for dir in exe.ancestors().skip(1) {
            let mode = fs::metadata(dir)
                .map(|m| m.permissions().mode())
                .unwrap_or(0);
            assert!(
                mode & 0o001 != 0,
                "{} is not traversable by others (mode {mode:o}); uid {UNPRIVILEGED_ID} cannot \
                 run {}",
                dir.display(),
                exe.display()
            );
        }
        self.unprivileged = true;
        self.run_through(unprivileged_wrapper(), self.state_dir.clone());
    }

    /// Gives the whole temporary root to [`UNPRIVILEGED_ID`] (when `as_unprivileged_user`).
    fn chown_for_daemon(&self) {
        if self.unprivileged {
            chown_tree(self.dir.path(), UNPRIVILEGED_ID);
        }
    }

    /// Runs the daemon and `agent-send` as `wrapper… <binary> <args…>` (for instance `nsenter`
    /// into another mount namespace) and gives them `inner_state_dir` as their state directory,
    /// while the test keeps reading the files at `self.state_dir` (which the caller points at
    /// the same directory as seen from here, e.g. through `/proc/<pid>/root`).
    pub fn run_through(&mut self, wrapper: Vec<String>, inner_state_dir: PathBuf) {
        assert!(!wrapper.is_empty(), "run_through needs a command");
        self.through = Some(Through {
            wrapper,
            state_dir: inner_state_dir,
        });
    }

    /// The state directory as the daemon sees it.
    fn daemon_state_dir(&self) -> &Path {
        self.through
            .as_ref()
            .map_or(&self.state_dir, |t| &t.state_dir)
    }

    /// `<tmp>/workspace`.
    pub fn workspace(&self) -> PathBuf {
        self.dir.path().join("workspace")
    }

    /// Sets an environment variable for every later `start` and `agent_send` (replacing an
    /// earlier value of the same name). Variables set here win over the defaults.
    pub fn set_env(&mut self, k: &str, v: &str) {
        self.env.retain(|(name, _)| name != k);
        self.env.push((k.to_string(), v.to_string()));
    }

    /// Spawns `agentd run -c <config>` with `AGENTD_STATE_DIR=<state>`, `AGENTD_LOG=debug`, the
    /// variables from `set_env` (inherited `AGENTD_*` variables are removed), stdout and stderr
    /// appended to `<tmp>/daemon.<n>.log`, in its own process group. Waits up to 20 s until
    /// `state/control.pipe` is a FIFO with a reader (the daemon is reading its control FIFO;
    /// a stale FIFO left by a killed daemon has none). Panics with the log's tail if the
    /// process exits first or the wait times out.
    ///
    /// The config must keep the FIFO enabled at its default path.
    pub fn start(&mut self) {
        match &self.through {
            Some(t) => {
                let program = t.wrapper[0].clone();
                let mut args: Vec<String> = t.wrapper[1..].to_vec();
                args.push(env!("CARGO_BIN_EXE_agentd").to_string());
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                self.start_program(&program, &args);
            }
            None => self.start_program(env!("CARGO_BIN_EXE_agentd"), &[]),
        }
    }

    /// `start` with another program: `program <leading_args…> run -c <config>`. Lets the
    /// launcher be tested with a stand-in daemon.
    fn start_program(&mut self, program: &str, leading_args: &[&str]) {
        assert!(
            !self.is_running(),
            "TestDaemon::start: the daemon is already running"
        );
        self.chown_for_daemon();
        self.starts += 1;
        let log_path = self.log_path(self.starts);
        let log = fs::File::create(&log_path)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", log_path.display()));
        let log_err = log
            .try_clone()
            .expect("cannot duplicate the log file handle");

        let mut cmd = Command::new(program);
        cmd.args(leading_args)
            .arg("run")
            .arg("-c")
            .arg(&self.config_path);
        self.apply_env(&mut cmd);
        cmd.env("AGENTD_STATE_DIR", self.daemon_state_dir())
            .env("AGENTD_LOG", "debug");
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd.current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .process_group(0);
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot spawn {program}: {e}"));
        self.child = Some(child);

        let fifo = self.state_dir.join("control.pipe");
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(status) = self.try_wait() {
                self.child = None;
                panic!(
                    "agentd exited before it was ready ({status}); {}",
                    self.log_tail()
                );
            }
            if fifo_has_reader(&fifo) {
                return;
            }
            if Instant::now() >= deadline {
                self.kill_group();
                panic!(
                    "agentd did not create a readable {} within {READY_TIMEOUT:?}; {}",
                    fifo.display(),
                    self.log_tail()
                );
            }
            std::thread::sleep(POLL);
        }
    }

    /// Sends SIGKILL to the daemon (not its children: like a crash) and reaps it.
    pub fn kill9(&mut self) {
        let mut child = self
            .child
            .take()
            .expect("TestDaemon::kill9: the daemon was not started");
        if child.try_wait().ok().flatten().is_none() {
            // ESRCH means it died on its own meanwhile; wait() below reaps it either way.
            let _ = kill(pid_of(&child), Signal::SIGKILL);
        }
        child.wait().expect("cannot reap the killed daemon");
    }

    /// Sends SIGTERM and waits for the exit (graceful stop). Panics with the log's tail if the
    /// daemon is not running or has not exited within 30 s (it is then killed).
    pub fn sigterm(&mut self) -> ExitStatus {
        assert!(
            self.is_running(),
            "TestDaemon::sigterm: the daemon is not running; {}",
            self.log_tail()
        );
        let pid = self.pid().expect("running daemon has a pid");
        kill(Pid::from_raw(pid as i32), Signal::SIGTERM).expect("cannot send SIGTERM");
        let deadline = Instant::now() + STOP_TIMEOUT;
        loop {
            if let Some(status) = self.try_wait() {
                self.child = None;
                return status;
            }
            if Instant::now() >= deadline {
                self.kill_group();
                panic!(
                    "agentd did not exit within {STOP_TIMEOUT:?} after SIGTERM; {}",
                    self.log_tail()
                );
            }
            std::thread::sleep(POLL);
        }
    }

    /// Whether the daemon process is alive.
    pub fn is_running(&mut self) -> bool {
        self.child.is_some() && self.try_wait().is_none()
    }

    /// The daemon's pid while a process is attached (running or exited but not reaped by
    /// `kill9`/`sigterm`).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// All daemon logs (`daemon.1.log`, `daemon.2.log`, …) concatenated, lossily decoded.
    pub fn log(&self) -> String {
        (1..=self.starts)
            .map(|n| {
                let bytes = fs::read(self.log_path(n)).unwrap_or_default();
                String::from_utf8_lossy(&bytes).into_owned()
            })
            .collect()
    }

    /// Waits up to 30 s for `needle` in the log and panics with the log if it never shows.
    /// The daemon logs through a non-blocking appender, so a line can land after the trail
    /// record or reply a test has just read.
    pub fn wait_log(&self, needle: &str) {
        super::wait_until(
            Duration::from_secs(30),
            &format!("{needle:?} in the log"),
            || self.log().contains(needle).then_some(()),
        );
    }

    /// Runs `agent-send --state-dir <state> -c <config> <args…>` (inherited `AGENTD_*`
    /// variables removed, `set_env` variables added) and returns its output. Panics if it runs
    /// longer than 60 s.
    pub fn agent_send(&self, args: &[&str]) -> Output {
        self.chown_for_daemon();
        let mut cmd = match &self.through {
            Some(t) => {
                let mut c = Command::new(&t.wrapper[0]);
                c.args(&t.wrapper[1..])
                    .arg(env!("CARGO_BIN_EXE_agent-send"));
                c
            }
            None => Command::new(env!("CARGO_BIN_EXE_agent-send")),
        };
        cmd.arg("--state-dir")
            .arg(self.daemon_state_dir())
            .arg("-c")
            .arg(&self.config_path)
            .args(args);
        self.apply_env(&mut cmd);
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd.current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        run_with_timeout(cmd, AGENT_SEND_TIMEOUT, &format!("agent-send {args:?}"))
    }

    /// `agentd <args…> -c <config>` with this daemon's state directory and environment (the
    /// `set_env` variables), not run yet: for the subcommands that read the daemon's state.
    pub fn agentd(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_agentd"));
        cmd.args(args).arg("-c").arg(&self.config_path);
        self.apply_env(&mut cmd);
        cmd.env("AGENTD_STATE_DIR", self.daemon_state_dir());
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd.current_dir(self.dir.path()).stdin(Stdio::null());
        cmd
    }

    /// The session id of `key`: from `state/sessions/sessions.json`, or, while the index does
    /// not name the key, from the trails (the daemon writes the index in the background, a
    /// moment after a new session's first intake; the record of a session is the `session`
    /// event on the first line of its first trail file). Panics if the index is not valid JSON.
    pub fn session_id(&self, key: &str) -> Option<String> {
        self.indexed_session_id(key)
            .or_else(|| session_id_in_trails(&self.sessions_dir(), key))
    }

    /// The session id of `key` in `state/sessions/sessions.json`, if the index and the key
    /// exist. Panics if the index is not valid JSON.
    pub fn indexed_session_id(&self, key: &str) -> Option<String> {
        let path = self.sessions_dir().join("sessions.json");
        let text = fs::read_to_string(&path).ok()?;
        let index: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{} is not valid JSON: {e}\n{text}", path.display()));
        session_id_in_index(&index, key)
    }

    /// Parsed lines of every trail file of the session `key` (`sessions/<id>.*.jsonl`, sorted by
    /// name). Empty when the session does not exist (yet). See [`parse_jsonl`] for torn lines.
    pub fn trail(&self, key: &str) -> Vec<Value> {
        match self.session_id(key) {
            Some(id) => self.trail_by_id(&id),
            None => Vec::new(),
        }
    }

    /// Like [`TestDaemon::trail`], by session id.
    pub fn trail_by_id(&self, id: &str) -> Vec<Value> {
        read_trail_files(&self.sessions_dir(), id)
    }

    /// `state/sessions`.
    pub fn sessions_dir(&self) -> PathBuf {
        self.state_dir.join("sessions")
    }

    fn log_path(&self, n: usize) -> PathBuf {
        self.dir.path().join(format!("daemon.{n}.log"))
    }

    fn log_tail(&self) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        let from = lines.len().saturating_sub(LOG_TAIL_LINES);
        format!(
            "daemon log (last {} of {} lines, in {}):\n{}",
            lines.len() - from,
            lines.len(),
            self.dir.path().display(),
            lines[from..].join("\n")
        )
    }

    /// Removes inherited `AGENTD_*` variables so the developer's shell cannot leak keys or
    /// paths into a test.
    fn apply_env(&self, cmd: &mut Command) {
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("AGENTD_") {
                cmd.env_remove(k);
            }
        }
    }

    /// The exit status if the child has exited (reaping it), `None` while it runs.
    fn try_wait(&mut self) -> Option<ExitStatus> {
        let child = self.child.as_mut()?;
        child.try_wait().expect("cannot query the daemon's status")
    }

    /// SIGKILL to the daemon's whole process group (the daemon and children it did not move to
    /// another group), then reap the daemon. Only while the daemon is unreaped, so the group id
    /// still names our group and cannot have been reused.
    fn kill_group(&mut self) {
        if let Some(mut child) = self.child.take() {
            if child.try_wait().ok().flatten().is_none() {
                let _ = killpg(pid_of(&child), Signal::SIGKILL);
            }
            let _ = child.wait();
        }
    }
}

impl Drop for TestDaemon {
    fn drop(&mut self) {
        if std::thread::panicking() && self.starts > 0 {
            eprintln!("{}", self.log_tail());
        }
        self.kill_group();
    }
}

/// `setpriv … --` switching to [`UNPRIVILEGED_ID`]: a command prefix for [`TestDaemon::run_through`]
/// and for other processes of the daemon's uid in a test.
pub fn unprivileged_wrapper() -> Vec<String> {
    vec![
        SETPRIV.to_string(),
        format!("--reuid={UNPRIVILEGED_ID}"),
        format!("--regid={UNPRIVILEGED_ID}"),
        "--clear-groups".to_string(),
        "--".to_string(),
    ]
}

/// `chown -R uid:uid root` without following symlinks.
pub fn chown_tree(root: &Path, uid: u32) {
    std::os::unix::fs::lchown(root, Some(uid), Some(uid))
        .unwrap_or_else(|e| panic!("cannot chown {}: {e}", root.display()));
    let Ok(meta) = fs::symlink_metadata(root) else {
        return;
    };
    if meta.is_dir() {
        let entries =
            fs::read_dir(root).unwrap_or_else(|e| panic!("cannot read {}: {e}", root.display()));
        for entry in entries.flatten() {
            chown_tree(&entry.path(), uid);
        }
    }
}

fn pid_of(child: &Child) -> Pid {
    Pid::from_raw(child.id() as i32)
}

/// Whether `path` is a FIFO that some process has open for reading: a non-blocking open for
/// writing fails with ENXIO when there is no reader. Nothing is written.
pub fn fifo_has_reader(path: &Path) -> bool {
    let is_fifo = fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_fifo());
    is_fifo
        && fs::OpenOptions::new()
            .write(true)
            .custom_flags(nix::libc::O_NONBLOCK)
            .open(path)
            .is_ok()
}

/// Looks `key` up in a `sessions.json` value: `{ "<key>": {"session_id": …} }` (also accepted
/// nested under a top-level `"sessions"` object).
pub fn session_id_in_index(index: &Value, key: &str) -> Option<String> {
    let entry = index
        .get(key)
        .filter(|e| e.get("session_id").is_some())
        .or_else(|| index.get("sessions").and_then(|s| s.get(key)))?;
    entry
        .get("session_id")
        .and_then(Value::as_str)
        .map(str::to_string)
}

/// The newest session (the greatest id: UUIDv7 ids sort by creation) in `dir` whose first trail
/// file starts with its `session` event for `key`.
pub fn session_id_in_trails(dir: &Path, key: &str) -> Option<String> {
    let mut first_files: std::collections::BTreeMap<String, PathBuf> = Default::default();
    for e in fs::read_dir(dir).ok()?.filter_map(Result::ok) {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some((id, date)) = name
            .strip_suffix(".jsonl")
            .and_then(|rest| rest.rsplit_once('.'))
        else {
            continue;
        };
        if date.len() != 10 || id.contains('.') {
            continue;
        }
        let first = first_files
            .entry(id.to_string())
            .or_insert_with(|| e.path());
        if e.path() < *first {
            *first = e.path();
        }
    }
    first_files
        .into_iter()
        .rev()
        .find(|(id, path)| {
            let text = fs::read_to_string(path).unwrap_or_default();
            let Some(line) = text.lines().next() else {
                return false;
            };
            serde_json::from_str::<Value>(line).is_ok_and(|v| {
                v["type"] == "session" && v["key"] == key && v["session_id"] == id.as_str()
            })
        })
        .map(|(id, _)| id)
}

/// Parses every `<dir>/<id>.*.jsonl`, in file-name order.
pub fn read_trail_files(dir: &Path, id: &str) -> Vec<Value> {
    let prefix = format!("{id}.");
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&prefix) && n.ends_with(".jsonl"))
        })
        .collect();
    files.sort();
    files
        .iter()
        .flat_map(|path| {
            let bytes =
                fs::read(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
            parse_jsonl(
                &path.display().to_string(),
                &String::from_utf8_lossy(&bytes),
            )
        })
        .collect()
}

/// Parses JSON lines. A final line without a terminating newline that does not parse is a torn
/// write and is skipped; any other line that does not parse (including an empty one) panics,
/// naming `name` and the line number.
pub fn parse_jsonl(name: &str, text: &str) -> Vec<Value> {
    let terminated = text.ends_with('\n');
    let mut lines: Vec<&str> = text.split('\n').collect();
    if terminated || text.is_empty() {
        lines.pop();
    }
    let last = lines.len().checked_sub(1);
    let mut out = Vec::with_capacity(lines.len());
    for (i, line) in lines.iter().enumerate() {
        match serde_json::from_str::<Value>(line) {
            Ok(v) => out.push(v),
            Err(_) if Some(i) == last && !terminated => {}
            Err(e) => panic!("{name}:{}: not a JSON line ({e}): {line:?}", i + 1),
        }
    }
    out
}

/// Copies the directory tree `src` to `dst` (created), following symlinks.
pub fn copy_dir_recursive(src: &Path, dst: &Path) {
    fs::create_dir_all(dst).unwrap_or_else(|e| panic!("cannot create {}: {e}", dst.display()));
    let entries =
        fs::read_dir(src).unwrap_or_else(|e| panic!("cannot read {}: {e}", src.display()));
    for entry in entries {
        let entry = entry.unwrap_or_else(|e| panic!("cannot read {}: {e}", src.display()));
        let from = entry.path();
        let to = dst.join(entry.file_name());
        if from.is_dir() {
            copy_dir_recursive(&from, &to);
        } else {
            fs::copy(&from, &to).unwrap_or_else(|e| {
                panic!("cannot copy {} to {}: {e}", from.display(), to.display())
            });
        }
    }
}

/// Spawns `cmd` (stdout/stderr piped by the caller) and collects its output; kills it and
/// panics after `timeout`.
pub fn run_with_timeout(mut cmd: Command, timeout: Duration, what: &str) -> Output {
    let child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot spawn {what}: {e}"));
    let pid = pid_of(&child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(timeout) {
        Ok(out) => out.unwrap_or_else(|e| panic!("cannot collect the output of {what}: {e}")),
        Err(_) => {
            // The waiting thread has not reaped it, so the pid still names our child.
            let _ = kill(pid, Signal::SIGKILL);
            panic!("{what} did not finish within {timeout:?}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const TOML: &str = "[agent]\nname = \"t\"\nworkspace = \"../workspace\"\n";

    fn files_under(root: &Path) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for e in fs::read_dir(root).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                out.extend(files_under(&p));
            } else {
                out.push(p.strip_prefix(root).unwrap().to_path_buf());
            }
        }
        out.sort();
        out
    }

    #[test]
    fn new_lays_out_config_providers_and_workspace() {
        let d = TestDaemon::new(
            TOML,
            &[
                ("anthropic", "type = \"anthropic\"\n"),
                ("openai", "type = \"openai\"\n"),
            ],
        );
        let root = d.dir.path();
        assert_eq!(d.config_path, root.join("config/agentd.toml"));
        assert_eq!(fs::read_to_string(&d.config_path).unwrap(), TOML);
        assert_eq!(
            fs::read_to_string(root.join("providers.d/anthropic.toml")).unwrap(),
            "type = \"anthropic\"\n"
        );
        assert_eq!(
            fs::read_to_string(root.join("providers.d/openai.toml")).unwrap(),
            "type = \"openai\"\n"
        );
        assert_eq!(d.state_dir, root.join("state"));
        assert!(!d.state_dir.exists(), "the daemon creates its state dir");
        assert!(d.workspace().is_dir());
        let template = Path::new(env!("CARGO_MANIFEST_DIR")).join("workspace");
        if template.is_dir() {
            assert_eq!(files_under(&template), files_under(&d.workspace()));
        }
        assert!(d.log().is_empty());
        assert!(d.trail("cli").is_empty());
        assert_eq!(d.session_id("cli"), None);
    }

    #[test]
    #[should_panic(expected = "bare name")]
    fn provider_names_must_be_bare() {
        TestDaemon::new(TOML, &[("anthropic.toml", "")]);
    }

    #[test]
    fn copy_dir_recursive_copies_nested_trees() {
        let src = tempfile::tempdir().unwrap();
        fs::create_dir_all(src.path().join("skills/example")).unwrap();
        fs::create_dir_all(src.path().join("memory")).unwrap();
        fs::write(src.path().join("SOUL.md"), "soul").unwrap();
        fs::write(src.path().join("skills/example/SKILL.md"), "skill").unwrap();
        let dst = tempfile::tempdir().unwrap();
        let to = dst.path().join("ws");
        copy_dir_recursive(src.path(), &to);
        assert_eq!(fs::read_to_string(to.join("SOUL.md")).unwrap(), "soul");
        assert_eq!(
            fs::read_to_string(to.join("skills/example/SKILL.md")).unwrap(),
            "skill"
        );
        assert!(to.join("memory").is_dir(), "empty directories are copied");
    }

    #[test]
    fn trail_reads_all_day_files_of_the_session_in_order() {
        let d = TestDaemon::new(TOML, &[]);
        let dir = d.sessions_dir();
        fs::create_dir_all(&dir).unwrap();
        fs::write(
            dir.join("sessions.json"),
            json!({"cli": {"session_id": "abc", "created_at": 1}, "system": {"session_id": "xyz", "created_at": 2}})
                .to_string(),
        )
        .unwrap();
        fs::write(
            dir.join("abc.2026-01-02.jsonl"),
            "{\"n\":3}\n{\"n\":4,\"torn",
        )
        .unwrap();
        fs::write(dir.join("abc.2026-01-01.jsonl"), "{\"n\":1}\n{\"n\":2}\n").unwrap();
        fs::write(dir.join("abc.state.json"), "{}").unwrap();
        fs::write(dir.join("xyz.2026-01-01.jsonl"), "{\"n\":99}\n").unwrap();
        fs::write(dir.join("abcd.2026-01-01.jsonl"), "{\"n\":98}\n").unwrap();

        assert_eq!(d.session_id("cli").as_deref(), Some("abc"));
        let ns: Vec<Value> = d.trail("cli").iter().map(|v| v["n"].clone()).collect();
        assert_eq!(ns, [json!(1), json!(2), json!(3)]);
        assert_eq!(d.trail("system"), [json!({"n": 99})]);
        assert!(d.trail("nobody").is_empty());
    }

    /// A session the index does not name yet is found by its trail's `session` event: the
    /// newest of the key's sessions, and never one whose event names another key or id.
    #[test]
    fn a_session_the_index_does_not_name_yet_is_found_by_its_trail() {
        let d = TestDaemon::new(TOML, &[]);
        let dir = d.sessions_dir();
        fs::create_dir_all(&dir).unwrap();
        let session = |id: &str, key: &str| {
            json!({"v": 1, "seq": 1, "ts": "2026-01-01T00:00:00.000+00:00", "type": "session",
                   "session_id": id, "key": key, "model": "m"})
            .to_string()
                + "\n"
        };
        fs::write(dir.join("s1.2026-01-01.jsonl"), session("s1", "cli")).unwrap();
        fs::write(dir.join("s2.2026-01-01.jsonl"), session("s2", "cli")).unwrap();
        fs::write(dir.join("s2.2026-01-02.jsonl"), "{\"n\":1}\n").unwrap();
        fs::write(dir.join("s3.2026-01-01.jsonl"), session("s3", "other")).unwrap();
        fs::write(dir.join("s4.2026-01-01.jsonl"), session("s9", "lost")).unwrap();
        assert_eq!(d.indexed_session_id("cli"), None);
        assert_eq!(d.session_id("cli").as_deref(), Some("s2"));
        assert_eq!(d.session_id("other").as_deref(), Some("s3"));
        assert_eq!(d.session_id("lost"), None);
        assert_eq!(d.trail("cli").len(), 2);
        fs::write(
            dir.join("sessions.json"),
            json!({"cli": {"session_id": "s1", "created_at": 1}}).to_string(),
        )
        .unwrap();
        assert_eq!(
            d.session_id("cli").as_deref(),
            Some("s1"),
            "the index first"
        );
    }

    #[test]
    fn session_index_may_be_nested() {
        let index =
            json!({"version": 1, "sessions": {"cli": {"session_id": "s1", "created_at": 5}}});
        assert_eq!(session_id_in_index(&index, "cli").as_deref(), Some("s1"));
        assert_eq!(session_id_in_index(&index, "version"), None);
    }

    #[test]
    fn parse_jsonl_skips_only_a_torn_last_line() {
        assert!(parse_jsonl("f", "").is_empty());
        assert_eq!(parse_jsonl("f", "{\"a\":1}\n"), [json!({"a": 1})]);
        assert_eq!(parse_jsonl("f", "{\"a\":1}\n{\"a\":"), [json!({"a": 1})]);
        // A complete last line without its newline still counts.
        assert_eq!(
            parse_jsonl("f", "{\"a\":1}\n{\"a\":2}"),
            [json!({"a": 1}), json!({"a": 2})]
        );
    }

    #[test]
    #[should_panic(expected = "f:1: not a JSON line")]
    fn parse_jsonl_panics_on_a_bad_middle_line() {
        parse_jsonl("f", "{\"a\":\n{\"a\":2}\n");
    }

    #[test]
    #[should_panic(expected = "f:2: not a JSON line")]
    fn parse_jsonl_panics_on_a_bad_terminated_last_line() {
        parse_jsonl("f", "{\"a\":1}\n{oops\n");
    }

    #[test]
    fn fifo_has_reader_needs_a_fifo_with_a_reader() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("control.pipe");
        assert!(!fifo_has_reader(&fifo), "missing path");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        assert!(!fifo_has_reader(&fifo), "a stale FIFO has no reader");
        let reader = fs::OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_NONBLOCK)
            .open(&fifo)
            .unwrap();
        assert!(fifo_has_reader(&fifo));
        drop(reader);
        assert!(!fifo_has_reader(&fifo));
        let file = dir.path().join("plain");
        fs::write(&file, "").unwrap();
        assert!(!fifo_has_reader(&file), "a regular file is not a FIFO");
    }

    #[test]
    fn start_reports_an_early_exit_with_the_log() {
        // Not TOML at all: a real daemon exits with a config error, the skeleton exits at once.
        let mut d = TestDaemon::new("this is [not toml", &[]);
        let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| d.start()));
        let err = res.expect_err("start must panic when the daemon exits");
        let msg = err
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| err.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        assert!(msg.contains("agentd exited before it was ready"), "{msg}");
        assert!(msg.contains("daemon log"), "{msg}");
        assert!(!d.is_running());
        assert!(d.dir.path().join("daemon.1.log").exists());
    }

    /// A stand-in daemon: creates the FIFO (after `$DELAY` seconds holds it open for reading),
    /// logs its arguments, optionally starts a grandchild, exits 7 on SIGTERM. The loop's
    /// `sleep` must not inherit the FIFO (`3>&-`), or it would keep a reader alive after a kill.
    const STAND_IN: &str = r#"
        mkdir -p "$AGENTD_STATE_DIR"
        [ -p "$AGENTD_STATE_DIR/control.pipe" ] || mkfifo -m 600 "$AGENTD_STATE_DIR/control.pipe"
        echo "stand-in args: $1 $2 $3 log=$AGENTD_LOG marker=$MARKER"
        if [ -n "$GRANDCHILD_PID_FILE" ]; then sleep 1000 & echo $! > "$GRANDCHILD_PID_FILE"; fi
        sleep "${DELAY:-0}"
        exec 3<>"$AGENTD_STATE_DIR/control.pipe"
        trap 'echo got TERM; exit 7' TERM
        while :; do sleep 0.05 3>&-; done
    "#;

    fn start_stand_in(d: &mut TestDaemon) {
        d.start_program("/bin/sh", &["-c", STAND_IN, "stand-in"]);
    }

    #[test]
    fn launcher_lifecycle_with_a_stand_in_daemon() {
        let mut d = TestDaemon::new(TOML, &[]);
        d.set_env("MARKER", "first");
        start_stand_in(&mut d);
        assert!(d.is_running());
        assert!(fifo_has_reader(&d.state_dir.join("control.pipe")));
        let log = d.log();
        assert!(log.contains("stand-in args: run -c "), "{log}");
        assert!(log.contains("log=debug marker=first"), "{log}");
        assert!(log.contains(d.config_path.to_str().unwrap()), "{log}");

        // A crash leaves the FIFO behind; the next start must not take it for readiness.
        d.kill9();
        assert!(!d.is_running());
        assert!(d.state_dir.join("control.pipe").exists());
        d.set_env("MARKER", "second");
        d.set_env("DELAY", "0.5");
        let begun = Instant::now();
        start_stand_in(&mut d);
        assert!(
            begun.elapsed() >= Duration::from_millis(500),
            "waited for the reader"
        );
        assert!(d.is_running());

        let status = d.sigterm();
        assert_eq!(status.code(), Some(7));
        assert!(!d.is_running());
        let log = d.log();
        assert!(
            log.contains("marker=first") && log.contains("marker=second"),
            "{log}"
        );
        assert!(log.trim_end().ends_with("got TERM"), "{log}");
        assert!(d.dir.path().join("daemon.2.log").exists());
    }

    #[test]
    fn drop_kills_the_daemon_and_its_process_group() {
        let mut d = TestDaemon::new(TOML, &[]);
        let pid_file = d.dir.path().join("grandchild.pid");
        d.set_env("GRANDCHILD_PID_FILE", pid_file.to_str().unwrap());
        start_stand_in(&mut d);
        let daemon_pid = d.pid().unwrap();
        let grandchild: u32 = fs::read_to_string(&pid_file)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        drop(d);
        let gone = |pid: u32| {
            // Gone, or a zombie waiting for its (new) parent to reap it.
            fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| {
                stat.rsplit(')')
                    .next()
                    .unwrap_or("")
                    .trim_start()
                    .starts_with('Z')
            })
        };
        assert!(gone(daemon_pid), "the daemon is reaped on drop");
        crate::support::wait_until(Duration::from_secs(30), "the grandchild to die", || {
            gone(grandchild).then_some(())
        });
    }

    /// The stand-in daemon started through the unprivileged wrapper runs as uid/gid 65534 and
    /// creates its state directory in the chowned temporary root.
    #[test]
    fn unprivileged_launch_runs_as_nobody() {
        let mut d = TestDaemon::new(TOML, &[]);
        d.as_unprivileged_user();
        let wrapper = unprivileged_wrapper();
        let mut args: Vec<&str> = wrapper[1..].iter().map(String::as_str).collect();
        args.extend(["/bin/sh", "-c", STAND_IN, "stand-in"]);
        d.start_program(&wrapper[0], &args);
        let pid = d.pid().unwrap();
        let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let ids = |key: &str| -> Vec<String> {
            let line = status.lines().find(|l| l.starts_with(key)).unwrap();
            line.split_whitespace()
                .skip(1)
                .map(str::to_string)
                .collect()
        };
        assert_eq!(ids("Uid:"), ["65534"; 4], "{status}");
        assert_eq!(ids("Gid:"), ["65534"; 4], "{status}");
        assert!(ids("Groups:").is_empty(), "{status}");
        use std::os::unix::fs::MetadataExt;
        assert_eq!(fs::metadata(&d.state_dir).unwrap().uid(), UNPRIVILEGED_ID);
        assert_eq!(d.sigterm().code(), Some(7));
    }

    #[test]
    fn set_env_replaces_earlier_values() {
        let mut d = TestDaemon::new(TOML, &[]);
        d.set_env("AGENTD_X", "1");
        d.set_env("AGENTD_Y", "2");
        d.set_env("AGENTD_X", "3");
        assert_eq!(
            d.env,
            [
                ("AGENTD_Y".to_string(), "2".to_string()),
                ("AGENTD_X".to_string(), "3".to_string())
            ]
        );
    }

    #[test]
    fn wait_until_returns_the_value_or_panics() {
        let mut n = 0;
        let v = crate::support::wait_until(Duration::from_secs(1), "n to reach 3", || {
            n += 1;
            (n >= 3).then_some(n)
        });
        assert_eq!(v, 3);
        let r = std::panic::catch_unwind(|| {
            crate::support::wait_until(Duration::from_millis(30), "never", || None::<()>)
        });
        assert!(r.is_err());
    }
}
