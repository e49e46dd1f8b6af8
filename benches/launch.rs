//! Starts the real release `agentd` the way an operator does: a temporary directory with
//! `config/agentd.toml`, `providers.d/fake.toml`, a workspace and a state directory, the
//! daemon in its own process group, and readers for what `/proc` says about it.

use std::fs;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;

/// The bearer token the bench gives the HTTP API.
pub const HTTP_TOKEN: &str = "bench-http-token-0123456789abcdef";
/// The bot token the bench gives the Telegram channel.
pub const TG_TOKEN: &str = "123456:BENCH-token-abcdefghijklmnopqrstuvw";

/// What the daemon under test is given.
#[derive(Clone, Debug, Default)]
pub struct Setup {
    /// Base URL of the fake Anthropic server.
    pub provider_url: String,
    /// `cost_per_mtok` and `cache` for the fake model.
    pub provider_extra: String,
    /// Base URL of the fake Bot API (`None`: Telegram off).
    pub telegram_url: Option<String>,
    /// Extra TOML appended to `agentd.toml` (e.g. `[behavior]` keys).
    pub extra_toml: String,
    /// A real homeserver's bot account (`None`: Matrix off).
    pub matrix: Option<MatrixLogin>,
    /// Workspace files to write over the template copy: `(relative path, content)`.
    pub workspace_files: Vec<(String, String)>,
}

/// The Matrix account the daemon logs in to (`bench --matrix`).
#[derive(Clone, Debug)]
pub struct MatrixLogin {
    pub homeserver: String,
    pub user_id: String,
    /// The access token, given to the daemon as `AGENTD_MATRIX_TOKEN`.
    pub token: String,
}

/// A daemon's temporary home and, while it runs, the process.
pub struct Daemon {
    pub root: PathBuf,
    pub state_dir: PathBuf,
    pub config_path: PathBuf,
    pub port: u16,
    agentd: PathBuf,
    child: Option<Child>,
    matrix_token: Option<String>,
    starts: usize,
    keep: bool,
}

impl Daemon {
    /// Lays out `<parent>/agentd-bench-XXXXXX/{config,providers.d,workspace}`.
    pub fn new(agentd: &Path, parent: &Path, setup: &Setup) -> Result<Daemon> {
        fs::create_dir_all(parent)?;
        let template = parent.join("agentd-bench-XXXXXX");
        let root = nix::unistd::mkdtemp(&template).context("mkdtemp")?;
        let port = free_port()?;
        let config_dir = root.join("config");
        fs::create_dir_all(&config_dir)?;
        let mut toml = format!(
            r#"[agent]
name = "bench"
workspace = "../workspace"
timezone = "UTC"

[providers]
dir = "../providers.d"
load = ["fake"]

[http]
enabled = true
port = {port}
rate_limit = 10000000
status_rate_limit = 10000000
"#
        );
        if let Some(url) = &setup.telegram_url {
            toml.push_str(&format!(
                "\n[channel.telegram]\nenabled = true\napi_url = \"{url}\"\nallow_from = [1001]\ncontacts = {{ Alice = 1001 }}\n"
            ));
        }
        if let Some(m) = &setup.matrix {
            toml.push_str(&format!(
                "\n[matrix]\nhomeserver = \"{}\"\nuser_id = \"{}\"\n",
                m.homeserver, m.user_id
            ));
        }
        toml.push_str(&setup.extra_toml);
        let config_path = config_dir.join("agentd.toml");
        fs::write(&config_path, toml)?;

        let providers = root.join("providers.d");
        fs::create_dir_all(&providers)?;
        fs::write(
            providers.join("fake.toml"),
            format!(
                "type = \"anthropic\"\nbase_url = \"{}\"\n\n[models.primary]\nmodel = \"claude-sonnet-bench\"\nmax_tokens = 4096\ncost_per_mtok = {{ input = 3.0, output = 15.0, cache_read = 0.3, cache_write = 3.75 }}\n{}",
                setup.provider_url, setup.provider_extra
            ),
        )?;

        let workspace = root.join("workspace");
        copy_dir(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("workspace"),
            &workspace,
        )?;
        for (rel, content) in &setup.workspace_files {
            let p = workspace.join(rel);
            if let Some(dir) = p.parent() {
                fs::create_dir_all(dir)?;
            }
            fs::write(p, content)?;
        }
        Ok(Daemon {
            state_dir: root.join("state"),
            root,
            config_path,
            port,
            agentd: agentd.to_path_buf(),
            child: None,
            matrix_token: setup.matrix.as_ref().map(|m| m.token.clone()),
            starts: 0,
            keep: std::env::var_os("AGENTD_BENCH_KEEP").is_some(),
        })
    }

    pub fn workspace(&self) -> PathBuf {
        self.root.join("workspace")
    }

    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Spawns `agentd run -c <config>` and returns the instant just before `exec`.
    pub fn spawn(&mut self) -> Result<Instant> {
        if self.child.is_some() {
            bail!("the daemon is already running");
        }
        self.starts += 1;
        let log = fs::File::create(self.root.join(format!("daemon.{}.log", self.starts)))?;
        let mut cmd = Command::new(&self.agentd);
        cmd.arg("run").arg("-c").arg(&self.config_path);
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("AGENTD_") {
                cmd.env_remove(k);
            }
        }
        cmd.env("AGENTD_STATE_DIR", &self.state_dir)
            .env("AGENTD_HTTP_TOKEN", HTTP_TOKEN)
            .env("AGENTD_TELEGRAM_TOKEN", TG_TOKEN)
            .env_remove("JOURNAL_STREAM")
            .env_remove("NOTIFY_SOCKET")
            .current_dir(&self.root)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .process_group(0);
        if let Some(token) = &self.matrix_token {
            cmd.env("AGENTD_MATRIX_TOKEN", token);
        }
        let t0 = Instant::now();
        self.child = Some(cmd.spawn().context("cannot spawn agentd")?);
        Ok(t0)
    }

    /// Polls `GET /api/v1/status` every `interval` until it answers 200; returns when it did.
    pub fn wait_status(&mut self, timeout: Duration, interval: Duration) -> Result<Instant> {
        let deadline = Instant::now() + timeout;
        loop {
            if status_ok(self.port) {
                return Ok(Instant::now());
            }
            if let Some(c) = self.child.as_mut()
                && let Some(st) = c.try_wait()?
            {
                self.child = None;
                bail!(
                    "agentd exited before answering ({st}); log:\n{}",
                    self.log_tail()
                );
            }
            if Instant::now() > deadline {
                bail!("agentd did not answer /api/v1/status within {timeout:?}");
            }
            std::thread::sleep(interval);
        }
    }

    /// Spawn and wait until ready.
    pub fn start(&mut self) -> Result<()> {
        self.spawn()?;
        self.wait_status(Duration::from_secs(30), Duration::from_millis(5))?;
        Ok(())
    }

    pub fn pid(&self) -> Option<i32> {
        self.child.as_ref().map(|c| c.id() as i32)
    }

    /// SIGTERM and wait (graceful stop, so the PID lock is free for the next start).
    pub fn stop(&mut self) -> Result<()> {
        if let Some(mut c) = self.child.take() {
            let _ = kill(Pid::from_raw(c.id() as i32), Signal::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                if c.try_wait()?.is_some() {
                    break;
                }
                if Instant::now() > deadline {
                    let _ = killpg(Pid::from_raw(c.id() as i32), Signal::SIGKILL);
                    let _ = c.wait();
                    bail!("agentd did not stop within 30 s");
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        Ok(())
    }

    pub fn log_tail(&self) -> String {
        let text = fs::read_to_string(self.root.join(format!("daemon.{}.log", self.starts)))
            .unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            if c.try_wait().ok().flatten().is_none() {
                let _ = killpg(Pid::from_raw(c.id() as i32), Signal::SIGKILL);
            }
            let _ = c.wait();
        }
        if self.keep {
            eprintln!("kept {}", self.root.display());
        } else {
            let _ = fs::remove_dir_all(&self.root);
        }
    }
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// One `GET /api/v1/status` on a fresh connection; true on a 200.
pub fn status_ok(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let req = "GET /api/v1/status HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    if s.write_all(req.as_bytes()).is_err() {
        return false;
    }
    let mut buf = [0u8; 16];
    let mut got = 0;
    while got < 12 {
        match s.read(&mut buf[got..]) {
            Ok(0) | Err(_) => return false,
            Ok(n) => got += n,
        }
    }
    buf.starts_with(b"HTTP/1.1 200")
}

fn copy_dir(src: &Path, dst: &Path) -> Result<()> {
    fs::create_dir_all(dst)?;
    if !src.is_dir() {
        return Ok(());
    }
    for e in fs::read_dir(src)? {
        let e = e?;
        let to = dst.join(e.file_name());
        if e.path().is_dir() {
            copy_dir(&e.path(), &to)?;
        } else {
            fs::copy(e.path(), &to)?;
        }
    }
    Ok(())
}

/// What `/proc` says about a process.
#[derive(Clone, Copy, Debug, Default)]
pub struct ProcStats {
    pub rss_kb: u64,
    pub pss_kb: u64,
    pub pss_anon_kb: u64,
    pub pss_file_kb: u64,
    pub fds: usize,
    pub threads: usize,
}

impl ProcStats {
    pub fn read(pid: i32) -> Result<ProcStats> {
        // The daemon is non-dumpable (docs/security.md): only root may read these files.
        let rollup = fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).context(
            "reading smaps_rollup (agentd is non-dumpable: run the bench as root to measure it)",
        )?;
        let field = |name: &str| -> u64 {
            rollup
                .lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
                .unwrap_or(0)
        };
        let fds = fs::read_dir(format!("/proc/{pid}/fd"))
            .context("listing the daemon's fds (run the bench as root)")?
            .count();
        let threads = fs::read_dir(format!("/proc/{pid}/task"))?.count();
        Ok(ProcStats {
            rss_kb: field("Rss"),
            pss_kb: field("Pss"),
            pss_anon_kb: field("Pss_Anon"),
            pss_file_kb: field("Pss_File"),
            fds,
            threads,
        })
    }
}

pub fn mb(kb: u64) -> f64 {
    kb as f64 / 1024.0
}

/// Where a directory lives: the mount's device, filesystem type and mount point.
pub fn storage_of(dir: &Path) -> String {
    let dir = fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let mounts = fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let mut best: Option<(usize, String)> = None;
    for line in mounts.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 4 {
            continue;
        }
        let mp = f[1].replace("\\040", " ");
        if dir.starts_with(&mp) && best.as_ref().is_none_or(|(l, _)| mp.len() > *l) {
            best = Some((
                mp.len(),
                format!("{} ({}, mounted at {}, {})", f[0], f[2], mp, f[3]),
            ));
        }
    }
    let base = best.map_or_else(|| "unknown".to_string(), |(_, s)| s);
    // The block device model (virtio disks have none, rotational tells HDD vs SSD).
    let dev = base.split_whitespace().next().unwrap_or("");
    let name = dev.trim_start_matches("/dev/");
    let rot = fs::read_to_string(format!("/sys/block/{name}/queue/rotational"))
        .map(|s| {
            if s.trim() == "1" {
                ", rotational"
            } else {
                ", non-rotational"
            }
        })
        .unwrap_or("");
    format!("{base}{rot}")
}
