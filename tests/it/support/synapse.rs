//! A real Matrix homeserver for the tests: Synapse (PyPI `matrix-synapse`, installed by
//! `scripts/install-test-peers.sh` part `synapse`) on a free loopback port with SQLite, server
//! name `localhost`, rate limits out of the way, users registered through the shared-secret
//! admin API. One Synapse serves the whole test binary: [`synapse`] starts it on first use and
//! every test registers users of its own (unique names), so tests share no rooms or state.
//!
//! The homeserver dies with the test binary: a thread that lives as long as the process spawns
//! it with `PR_SET_PDEATHSIG` = SIGKILL (the signal follows the death of the spawning thread,
//! so a test thread must not be the one) and reaps it. Its data directory is
//! `$CARGO_TARGET_TMPDIR/synapse/<pid of the test binary>`; the directories of test binaries
//! that are gone are removed at the next start.
//!
//! Users are driven by matrix-nio through `tests/it/matrix_client.py` (a subprocess per
//! command, JSON in and out): [`MatrixUser`].

use std::fs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock, mpsc};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tempfile::TempDir;

use super::daemon::run_with_timeout;

/// How long [`synapse`] waits for `/health` (Synapse starts in ~6 s alone, ~15 s under load).
const READY_TIMEOUT: Duration = Duration::from_secs(180);
/// How long one client command may run (a `wait` has its own, shorter deadline inside).
const CLIENT_TIMEOUT: Duration = Duration::from_secs(300);
/// How long [`MatrixUser::wait_messages`] lets the client sync for the messages.
pub const WAIT_SECONDS: u64 = 120;
/// Lines of Synapse's log shown in panic messages.
const LOG_TAIL_LINES: usize = 40;
/// The shared secret of the admin registration API (loopback only, test data only).
const REGISTRATION_SECRET: &str = "agentd-tests-registration-secret";
/// Every user id ends with `:localhost`.
pub const SERVER_NAME: &str = "localhost";

/// The running homeserver.
pub struct Synapse {
    port: u16,
    dir: PathBuf,
    python_path: PathBuf,
    /// Why the process ended, once it has (set by the reaping thread).
    exited: &'static Mutex<Option<String>>,
}

/// The homeserver of this test binary, started on the first call (which installs the part
/// `synapse` of the test peers when needed); panics with Synapse's log if it does not start.
pub fn synapse() -> &'static Synapse {
    static SYNAPSE: OnceLock<Synapse> = OnceLock::new();
    SYNAPSE.get_or_init(Synapse::start)
}

impl Synapse {
    fn start() -> Synapse {
        let python_path =
            super::test_peers("synapse", "python3/pip with registry access").join("synapse");
        let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("synapse");
        remove_stale_dirs(&root);
        let dir = root.join(std::process::id().to_string());
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("cannot create the Synapse data directory");
        let exited: &'static Mutex<Option<String>> = Box::leak(Box::new(Mutex::new(None)));
        let mut attempt = 0;
        loop {
            attempt += 1;
            let port = super::free_port();
            fs::write(dir.join("homeserver.yaml"), config(&dir, port))
                .expect("cannot write homeserver.yaml");
            let server = Synapse {
                port,
                dir: dir.clone(),
                python_path: python_path.clone(),
                exited,
            };
            if attempt == 1 {
                server.generate_keys();
            }
            server.spawn(attempt);
            let t0 = Instant::now();
            match server.wait_ready() {
                Ok(()) => {
                    eprintln!(
                        "synapse ready on port {port} after {:.1} s",
                        t0.elapsed().as_secs_f64()
                    );
                    return server;
                }
                Err(why) if attempt < 3 && server.log().contains("Address already in use") => {
                    eprintln!("synapse {why} (port {port} taken); trying another port");
                    *exited.lock().unwrap() = None;
                }
                Err(why) => panic!("synapse {why}; {}", server.log_tail()),
            }
        }
    }

    /// `http://127.0.0.1:P`, the homeserver URL.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Registers a new user `@<prefix>-<n>:localhost` (a fresh name on every call) with a
    /// password, through the admin API; the user's nio store is a new temporary directory.
    pub fn register(&self, prefix: &str) -> MatrixUser {
        static N: AtomicUsize = AtomicUsize::new(0);
        let name = format!(
            "{}-{}",
            prefix.to_lowercase(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let password = format!("pw-{name}-not-secret");
        let store = tempfile::Builder::new()
            .prefix("matrix-user-")
            .tempdir()
            .expect("cannot create a temporary directory");
        let mut user = MatrixUser {
            user_id: String::new(),
            access_token: String::new(),
            device_id: String::new(),
            password: password.clone(),
            hs: self.url(),
            python_path: self.python_path.clone(),
            store,
        };
        let out = user.call(json!({
            "cmd": "register",
            "secret": REGISTRATION_SECRET,
            "user": name,
            "password": password,
        }));
        user.user_id = str_field(&out, "user_id");
        user.access_token = str_field(&out, "access_token");
        user.device_id = str_field(&out, "device_id");
        user
    }

    /// Synapse's log so far.
    pub fn log(&self) -> String {
        String::from_utf8_lossy(&fs::read(self.dir.join("homeserver.log")).unwrap_or_default())
            .into_owned()
    }

    /// The last lines of the log, for panic messages.
    pub fn log_tail(&self) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        let from = lines.len().saturating_sub(LOG_TAIL_LINES);
        format!(
            "synapse log (last {} lines):\n{}",
            lines.len() - from,
            lines[from..].join("\n")
        )
    }

    fn python(&self) -> Command {
        let mut cmd = Command::new("python3");
        cmd.env("PYTHONPATH", &self.python_path)
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .current_dir(&self.dir)
            .stdin(Stdio::null());
        cmd
    }

    /// `--generate-keys`: the server's signing key, then exit.
    fn generate_keys(&self) {
        let mut cmd = self.python();
        cmd.args(["-m", "synapse.app.homeserver", "-c", "homeserver.yaml"])
            .arg("--generate-keys")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let out = run_with_timeout(cmd, READY_TIMEOUT, "synapse --generate-keys");
        assert!(
            out.status.success(),
            "synapse --generate-keys failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Spawns the homeserver from a thread that lives as long as the test binary (see the
    /// module's doc) and returns once it runs; the thread reaps it and records its end.
    fn spawn(&self, attempt: usize) {
        let log = fs::File::create(self.dir.join("homeserver.log"))
            .expect("cannot create the Synapse log");
        let log_err = log.try_clone().expect("cannot duplicate the log handle");
        let mut cmd = self.python();
        cmd.args(["-m", "synapse.app.homeserver", "-c", "homeserver.yaml"])
            .stdout(log)
            .stderr(log_err);
        // SAFETY: only prctl(2), async-signal-safe, between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                    .map_err(std::io::Error::from)
            });
        }
        let exited = self.exited;
        let (tx, rx) = mpsc::channel();
        std::thread::Builder::new()
            .name(format!("synapse-{attempt}"))
            .spawn(move || match cmd.spawn() {
                Ok(mut child) => {
                    let _ = tx.send(Ok(()));
                    let status = child.wait();
                    *exited.lock().unwrap() = Some(format!("{status:?}"));
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                }
            })
            .expect("cannot spawn the Synapse thread");
        if let Err(e) = rx.recv().expect("the Synapse thread ended") {
            panic!("cannot spawn python3 -m synapse.app.homeserver: {e}");
        }
    }

    fn wait_ready(&self) -> Result<(), String> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(status) = self.exited.lock().unwrap().clone() {
                return Err(format!("exited before it was ready ({status})"));
            }
            if super::get_status(self.port, "/health") == Some(200) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!("was not healthy within {READY_TIMEOUT:?}"));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// A Matrix user of the test homeserver and its matrix-nio client (one device, kept in its
/// store across commands).
pub struct MatrixUser {
    pub user_id: String,
    pub access_token: String,
    /// The device the registration created (the one the access token belongs to).
    pub device_id: String,
    pub password: String,
    hs: String,
    python_path: PathBuf,
    /// nio's crypto store and `session.json`.
    store: TempDir,
}

impl MatrixUser {
    /// Runs one `matrix_client.py` command (`hs` and `store` added) and returns its answer;
    /// panics with the client's output when it fails. Never call it for a user whose device
    /// agentd uses: nio would publish keys for that device.
    pub fn call(&self, mut cmd: Value) -> Value {
        cmd["hs"] = json!(self.hs);
        cmd["store"] = json!(self.store.path());
        let what = format!("matrix_client.py {}", cmd["cmd"]);
        let mut child = Command::new("python3");
        child
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/it/matrix_client.py"))
            .arg(cmd.to_string())
            .env("PYTHONPATH", &self.python_path)
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let out = run_with_timeout(child, CLIENT_TIMEOUT, &what);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let answer: Option<Value> = stdout
            .lines()
            .rev()
            .find_map(|l| serde_json::from_str(l).ok());
        match answer {
            Some(v) if out.status.success() => v,
            _ => panic!(
                "{what} of {} failed ({}):\n{stdout}\n{stderr}",
                self.user_id, out.status
            ),
        }
    }

    /// Creates a direct chat inviting `invite`, end-to-end encrypted when `encrypted`;
    /// returns the room id.
    pub fn create_dm(&self, invite: &[&str], encrypted: bool) -> String {
        let out = self.call(json!({"cmd": "create_dm", "invite": invite, "encrypted": encrypted}));
        str_field(&out, "room_id")
    }

    /// Creates `count` direct chats inviting `invite` (not encrypted) in one client run;
    /// returns their room ids.
    pub fn create_dms(&self, invite: &[&str], count: usize) -> Vec<String> {
        let out = self.call(json!({"cmd": "create_dm", "invite": invite, "count": count}));
        strings(&out, "room_ids")
    }

    /// Joins a room this user was invited to.
    pub fn join(&self, room: &str) {
        self.call(json!({"cmd": "join", "room_id": room}));
    }

    /// Sends a message of `kind` (`text`, `notice`, `edit`, `reply`, `reaction`, `image`,
    /// `file`, `audio`; the other fields in `fields`, see matrix_client.py); returns its event
    /// id.
    pub fn send(&self, room: &str, kind: &str, fields: Value) -> String {
        let mut cmd = json!({"cmd": "send", "room_id": room, "kind": kind});
        if let Value::Object(extra) = fields {
            for (k, v) in extra {
                cmd[k] = v;
            }
        }
        str_field(&self.call(cmd), "event_id")
    }

    /// Sends an `m.text`; returns its event id.
    pub fn send_text(&self, room: &str, body: &str) -> String {
        self.send(room, "text", json!({ "body": body }))
    }

    /// Reacts to `target` with `key`; returns the reaction's event id.
    pub fn react(&self, room: &str, target: &str, key: &str) -> String {
        self.send(room, "reaction", json!({ "target": target, "key": key }))
    }

    /// Every event of the room (from /messages, oldest first), decrypted where this user has
    /// the keys: `type` (as stored: `m.room.encrypted` when it was), `decrypted_type`,
    /// `sender`, `event_id`, `msgtype`, `body`, `formatted_body`, `relates_to`, `content`.
    pub fn messages(&self, room: &str) -> Vec<Value> {
        events(&self.call(json!({"cmd": "messages", "room_id": room})))
    }

    /// The `m.room.message` events from `sender`, oldest first, once there are at least
    /// `count` (with a body containing `contains`, when given); panics after
    /// [`WAIT_SECONDS`] with what was there.
    pub fn wait_messages(
        &self,
        room: &str,
        sender: &str,
        count: usize,
        contains: Option<&str>,
    ) -> Vec<Value> {
        events(&self.call(json!({
            "cmd": "wait",
            "room_id": room,
            "sender": sender,
            "count": count,
            "contains": contains,
            "timeout": WAIT_SECONDS,
        })))
    }

    /// The `m.room.message` events from `sender` in the room now.
    pub fn messages_from(&self, room: &str, sender: &str) -> Vec<Value> {
        self.messages(room)
            .into_iter()
            .filter(|e| e["sender"] == sender && e["decrypted_type"] == "m.room.message")
            .collect()
    }

    /// `user`'s membership in `room` as this user sees it (`join`, `invite`, `leave`, or "").
    pub fn membership(&self, room: &str, user: &str) -> String {
        let out = self.call(json!({"cmd": "membership", "room_id": room, "user_id": user}));
        str_field(&out, "membership")
    }

    /// `user`'s membership in each of `rooms`, in order (one client run).
    pub fn memberships(&self, rooms: &[String], user: &str) -> Vec<String> {
        let out = self.call(json!({"cmd": "memberships", "room_ids": rooms, "user_id": user}));
        strings(&out, "memberships")
    }

    /// Waits until `user`'s membership in `room` is `want`; panics naming the last one.
    pub fn wait_membership(&self, room: &str, user: &str, want: &str) {
        let deadline = Instant::now() + Duration::from_secs(WAIT_SECONDS);
        loop {
            let now = self.membership(room, user);
            if now == want {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{user}'s membership in {room} is {now:?}, not {want:?}, after {WAIT_SECONDS} s"
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// `user`'s device ids (from /keys/query).
    pub fn devices(&self, user: &str) -> Vec<String> {
        let out = self.call(json!({"cmd": "devices", "user_id": user}));
        strings(&out, "devices")
    }

    /// Revokes `access_token` (POST /logout with it): the homeserver answers M_UNKNOWN_TOKEN
    /// to it from now on.
    pub fn revoke(&self, access_token: &str) {
        self.call(json!({"cmd": "logout", "access_token": access_token}));
    }
}

fn str_field(v: &Value, k: &str) -> String {
    v[k].as_str()
        .unwrap_or_else(|| panic!("no {k} in {v}"))
        .to_string()
}

/// The strings of the array `v[k]`.
fn strings(v: &Value, k: &str) -> Vec<String> {
    v[k].as_array()
        .map(|a| {
            a.iter()
                .filter_map(|d| d.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

fn events(v: &Value) -> Vec<Value> {
    v["events"].as_array().cloned().unwrap_or_default()
}

/// The homeserver's config: loopback only, SQLite, no federation key servers, no presence,
/// rate limits far above what the tests send (every test shares one server).
fn config(dir: &Path, port: u16) -> String {
    let d = dir.display();
    let unlimited = "{per_second: 10000, burst_count: 100000}";
    format!(
        r#"server_name: "{SERVER_NAME}"
pid_file: "{d}/homeserver.pid"
listeners:
  - port: {port}
    bind_addresses: ['127.0.0.1']
    type: http
    tls: false
    x_forwarded: false
    resources:
      - names: [client]
        compress: false
database:
  name: sqlite3
  args:
    database: "{d}/homeserver.db"
media_store_path: "{d}/media_store"
signing_key_path: "{d}/signing.key"
registration_shared_secret: "{REGISTRATION_SECRET}"
macaroon_secret_key: "agentd-tests-macaroon"
form_secret: "agentd-tests-form"
report_stats: false
enable_metrics: false
trusted_key_servers: []
suppress_key_server_warning: true
max_upload_size: 100M
presence:
  enabled: false
rc_message: {unlimited}
rc_registration: {unlimited}
rc_login:
  address: {unlimited}
  account: {unlimited}
  failed_attempts: {unlimited}
rc_joins:
  local: {unlimited}
  remote: {unlimited}
rc_invites:
  per_room: {unlimited}
  per_user: {unlimited}
  per_issuer: {unlimited}
rc_key_requests: {unlimited}
rc_admin_redaction: {unlimited}
rc_room_creation: {unlimited}
"#
    )
}

/// Removes the data directories of test binaries that are no longer running.
fn remove_stale_dirs(root: &Path) {
    let Ok(rd) = fs::read_dir(root) else {
        return;
    };
    for e in rd.flatten() {
        let gone = e
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
            .is_some_and(|pid| {
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_err()
            });
        if gone {
            let _ = fs::remove_dir_all(e.path());
        }
    }
}
