//! `agentd`: the daemon and its subcommands. Thin: parse arguments, load config, set up logging,
//! call the library, map errors to exit codes ([`EXIT_CODES`], also in `--help`).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

/// The exit codes, as `--help` lists them (docs/usage.md).
const EXIT_CODES: &str = "\
Exit codes:
  0  success; `run`/`chat`: stopped cleanly
  1  configuration or start-up error; `check-config` found problems or `--diff` has no running
     daemon to compare against; a `doctor` check failed; `index`/`consolidate` failed;
     `backup` failed, `backup verify` found a problem, `restore` refused or failed
  2  usage error (unknown command or flag)
  3  the daemon failed while running";

#[derive(Parser)]
#[command(
    name = "agentd",
    version = agentd::VERSION,
    about = "An always-on AI agent daemon",
    after_help = EXIT_CODES
)]
struct Cli {
    /// Config file (default: $AGENTD_CONFIG, else ./config/agentd.toml).
    #[arg(short = 'c', long = "config", global = true)]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Run the daemon (the default).
    Run,
    /// Run the daemon in the foreground with this terminal as one more channel (stdin in,
    /// replies on stdout; logs go to the log file, warnings to stderr). Ctrl-D stops it.
    Chat,
    /// Validate the configuration and print the effective config (secrets redacted) and which
    /// models loaded or were skipped.
    CheckConfig {
        /// Instead, compare the file with the running daemon's effective config: what a reload
        /// (SIGHUP) would apply and what needs a restart.
        #[arg(long)]
        diff: bool,
        /// Instead, rewrite the file with renamed keys under their new names and retired ones
        /// removed, keeping values and comments; the old file is kept beside it.
        #[arg(long, conflicts_with = "diff")]
        migrate: bool,
        /// Print one JSON document on stdout instead (docs/usage.md, "JSON output").
        #[arg(long)]
        json: bool,
    },
    /// Check config, provider reachability, Telegram, databases and disk space; print a
    /// pass/fail table (exit 1 when a check fails).
    Doctor {
        /// Print one JSON document on stdout instead (docs/usage.md, "JSON output").
        #[arg(long)]
        json: bool,
    },
    /// Print a shell completion script for agentd on stdout, e.g.
    /// `agentd completions bash > ~/.local/share/bash-completion/completions/agentd`.
    Completions {
        /// bash, zsh or fish.
        #[arg(value_parser = clap::builder::PossibleValuesParser::new(["bash", "zsh", "fish"]))]
        shell: String,
    },
    /// Index the workspace notes for memory search ([memory] indexer.include): only changed
    /// files are read again, only new texts embedded. Progress on stderr.
    Index {
        /// Show the index's counts instead of running.
        #[arg(long)]
        status: bool,
        /// Print the summary as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Extract facts, episodes and commitments from the sessions and notes not consolidated
    /// yet into long-term memory (uses the `consolidation` model, else `compaction`, else
    /// `primary`).
    Consolidate {
        /// Print the summary as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Import another agent's state: `agentd import openclaw PATH` (OpenClaw's state directory,
    /// e.g. ~/.openclaw). A dry run that reports what would be imported and what is skipped;
    /// `--apply` writes sessions (archived), memory notes and skills, and indexes the notes.
    /// Cron jobs and the Telegram allow-list are printed as config to add, never written.
    Import {
        #[arg(value_parser = clap::builder::PossibleValuesParser::new(["openclaw"]))]
        from: String,
        path: PathBuf,
        #[arg(long)]
        apply: bool,
    },
    /// Serve MCP on stdin/stdout for an MCP host (docs/mcp-server.md): talks to the running
    /// daemon through the control FIFO and the state files, like agent-send.
    Mcp,
    /// Write a backup of the state directory, workspace and config to one file (tar + zstd),
    /// also while the daemon runs; `backup verify FILE` checks one (docs/operations.md).
    #[command(args_conflicts_with_subcommands = true)]
    Backup {
        #[command(subcommand)]
        action: Option<BackupAction>,
        /// The file to write (default: ./agentd-backup-<time>.tar.zst).
        #[arg(long)]
        to: Option<PathBuf>,
        /// Include the secrets (config/.env); the file is written mode 0600 either way.
        #[arg(long)]
        with_secrets: bool,
        /// Print one JSON document on stdout instead.
        #[arg(long)]
        json: bool,
    },
    /// Restore a backup into an empty state directory (exit 1 when refused or failed).
    Restore {
        file: PathBuf,
        /// The state directory to restore into (empty or new).
        #[arg(long)]
        state_dir: PathBuf,
        /// Move a non-empty target aside (to <dir>.before-restore-<time>) instead of refusing.
        #[arg(long)]
        force: bool,
        /// Answer the messages in flight and send the replies whose delivery was open at
        /// backup time when the daemon starts, instead of closing them (they may have been
        /// answered or sent after the backup).
        #[arg(long)]
        resume_deliveries: bool,
        /// Where the workspace goes (default: <state-dir>/from-backup/workspace).
        #[arg(long)]
        workspace: Option<PathBuf>,
        /// Where the config files go (default: <state-dir>/from-backup/config).
        #[arg(long)]
        config_dir: Option<PathBuf>,
        /// Print one JSON document on stdout instead.
        #[arg(long)]
        json: bool,
    },
    /// Internal: the exec tool's sandbox helper (`--policy <json> -- <command...>`).
    #[command(hide = true)]
    SandboxExec {
        #[arg(long)]
        policy: String,
        #[arg(last = true, required = true)]
        command: Vec<std::ffi::OsString>,
    },
    /// Internal: report what the sandbox helper can do here (one JSON line).
    #[command(hide = true)]
    SandboxProbe {
        /// Probe for a command whose network is allowed.
        #[arg(long)]
        network: bool,
        /// Take the subreaper fallback (`AGENTD_SANDBOX_FALLBACK=1` in the daemon).
        #[arg(long)]
        no_namespaces: bool,
    },
}

#[derive(Subcommand)]
enum BackupAction {
    /// Check a backup: the manifest, every hash, both databases' integrity, every trail line,
    /// the schema versions (exit 1 when a problem is found; each is named).
    Verify {
        file: PathBuf,
        /// Print one JSON document on stdout instead.
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    // Completions need no config, and no secrets are read.
    if let Some(Command::Completions { shell }) = &cli.command {
        return completions(shell);
    }
    // The sandbox helper needs no config: it gets everything in its policy. It stays dumpable
    // until it has written its user-namespace maps (it turns non-dumpable itself before the
    // command runs), and it holds none of the daemon's secrets.
    if let Some(Command::SandboxExec { policy, command }) = &cli.command {
        let code = agentd::sandbox::helper_main(policy, command);
        return ExitCode::from(u8::try_from(code).unwrap_or(1));
    }
    // The probe forks the helper's namespace set-up, which must stay dumpable too.
    if let Some(Command::SandboxProbe {
        network,
        no_namespaces,
    }) = &cli.command
    {
        let code = agentd::sandbox::probe::probe_main(*network, *no_namespaces);
        return ExitCode::from(u8::try_from(code).unwrap_or(1));
    }
    // Checking a backup reads only the file.
    if let Some(Command::Backup {
        action: Some(BackupAction::Verify { file, json }),
        ..
    }) = &cli.command
    {
        agentd::telemetry::init_cli();
        return ExitCode::from(agentd::cli::backup::verify(file, *json));
    }
    // Every other role holds the daemon's secrets (environment, .env, tokens): non-dumpable
    // before anything is read, so `/proc/<pid>/environ`, `mem` and ptrace are root's only and
    // no core file is written. Other processes of the same uid (an MCP server, a command that
    // escaped) cannot read them (SPEC §16.9). See docs/security.md.
    if let Err(e) = nix::sys::prctl::set_dumpable(false) {
        eprintln!(
            "agentd: warning: cannot make the process non-dumpable ({e}); other processes of \
             this uid can read its environment"
        );
    }
    // Everything the daemon creates is its own only (logs, databases, trails, inbox files):
    // what the shipped units' UMask=0077 does, also when started by hand.
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
    // Before any HTTPS client exists (providers, Telegram, MCP over HTTP, doctor).
    agentd::net::tls::install();
    let path = agentd::config::resolve_config_path(cli.config.as_deref());
    // A restore needs no config (it may be what is restored): the zone is the config's if
    // it loads.
    if let Some(Command::Restore { .. }) = &cli.command {
        return restore(cli, &path);
    }
    let json = matches!(
        cli.command,
        Some(Command::CheckConfig { json: true, .. } | Command::Doctor { json: true })
    );
    let cfg = match agentd::config::load(&path) {
        Ok(c) => c,
        Err(e) => {
            if json {
                print_json(&e.to_json());
            }
            eprintln!("agentd: configuration error\n{e}");
            return ExitCode::from(1);
        }
    };
    // The daemon logs them (`run`); every other command says them on stderr.
    if !json && !matches!(cli.command, None | Some(Command::Run | Command::Chat)) {
        for w in &cfg.warnings {
            eprintln!("agentd: warning: {w}");
        }
    }
    match cli.command.unwrap_or(Command::Run) {
        Command::CheckConfig { migrate: true, .. } => check_config_migrate(&path),
        Command::CheckConfig {
            diff: false, json, ..
        } => {
            if json {
                print_json(&agentd::config::render_effective_json(&cfg));
            } else {
                print!("{}", agentd::config::render_effective(&cfg));
            }
            ExitCode::SUCCESS
        }
        Command::CheckConfig {
            diff: true, json, ..
        } => check_config_diff(&cfg, json),
        Command::Run => run(cfg, agentd::daemon::RunOptions::default()),
        Command::Chat => run(
            cfg,
            agentd::daemon::RunOptions {
                terminal: true,
                ..Default::default()
            },
        ),
        Command::Doctor { json } => doctor(&cfg, json),
        Command::Index { status, json } => memory_command(&cfg, |cfg| async move {
            if status {
                agentd::cli::memory::status(cfg, json).await
            } else {
                agentd::cli::memory::index(cfg, json).await
            }
        }),
        Command::Consolidate { json } => {
            memory_command(&cfg, |cfg| agentd::cli::memory::consolidate(cfg, json))
        }
        Command::Import { path, apply, .. } => import_openclaw(&cfg, &path, apply),
        Command::Mcp => mcp(cfg),
        Command::Backup {
            to,
            with_secrets,
            json,
            ..
        } => {
            agentd::telemetry::init_cli();
            ExitCode::from(agentd::cli::backup::backup(&cfg, to, with_secrets, json))
        }
        Command::SandboxExec { .. }
        | Command::SandboxProbe { .. }
        | Command::Completions { .. }
        | Command::Restore { .. } => ExitCode::from(2),
    }
}

fn run(cfg: agentd::config::Config, opts: agentd::daemon::RunOptions) -> ExitCode {
    // glibc gives every thread that allocates its own malloc arena; with the tokio workers and
    // the blocking pool that is megabytes of resident memory for little gain in a daemon this
    // size. And its mmap threshold grows with every large block freed, after which session
    // snapshots and request bodies (tens to hundreds of KiB) come from the heap and fragment it:
    // resident memory creeps up over days. Two arenas and a fixed 128 KiB threshold, set before
    // any thread starts (docs/BENCHMARKS.md, footprint and soak).
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets allocator parameters; no other thread exists yet.
    unsafe {
        nix::libc::mallopt(nix::libc::M_ARENA_MAX, 2);
        nix::libc::mallopt(nix::libc::M_MMAP_THRESHOLD, 128 * 1024);
        nix::libc::mallopt(nix::libc::M_TRIM_THRESHOLD, 256 * 1024);
    }
    let quiet = [
        agentd::tools::mcp::QUIET_LOG_TARGETS,
        agentd::channels::matrix::QUIET_LOG_TARGETS,
    ]
    .concat();
    let _guard = match agentd::telemetry::init(&cfg, opts.terminal, &quiet) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("agentd: {e}");
            return ExitCode::from(1);
        }
    };
    for w in &cfg.warnings {
        tracing::warn!(key = %w.key, "{}", w.message);
    }
    if let Some(why) = &cfg.agent.timezone_fallback {
        tracing::warn!(reason = %why, "the system's time zone is not readable; using UTC (set [agent] timezone)");
    }
    // HTTP connections get a quarter of the fd limit at most; raise it first (SPEC §16.9).
    match agentd::api::raise_fd_limit() {
        Ok((soft, _)) => tracing::debug!(limit = soft, "open file limit (RLIMIT_NOFILE)"),
        Err(e) => tracing::warn!(error = %e, "cannot raise the open file limit (RLIMIT_NOFILE)"),
    }
    // The blocking pool (file appends with fsync, directory scans, config reads) is capped: its
    // idle threads are woken in turn by any periodic task, so they never reach their 10 s
    // idle timeout, and tokio's default cap is 512. 16 is well above what the daemon runs at
    // once (docs/BENCHMARKS.md, senders: threads).
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(16)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("agentd: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let result = rt.block_on(agentd::daemon::run(
        cfg,
        opts,
        tokio_util::sync::CancellationToken::new(),
    ));
    // A blocking stdin read (agentd chat) cannot be cancelled: do not wait for it.
    rt.shutdown_timeout(std::time::Duration::from_secs(2));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "agentd failed");
            eprintln!("agentd: {e}");
            ExitCode::from(e.exit_code() as u8)
        }
    }
}

/// Run a memory command on a current-thread runtime with logging to stderr (warnings only,
/// unless AGENTD_LOG says otherwise): its summary on stdout, exit 0; an error on stderr, exit 1.
fn memory_command<'a, F, Fut>(cfg: &'a agentd::config::Config, f: F) -> ExitCode
where
    F: FnOnce(&'a agentd::config::Config) -> Fut,
    Fut: std::future::Future<Output = Result<String, agentd::memory::MemoryError>>,
{
    agentd::telemetry::init_cli();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("agentd: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match rt.block_on(f(cfg)) {
        Ok(out) => {
            print!("{out}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("agentd: {e}");
            ExitCode::from(1)
        }
    }
}

/// `agentd mcp`: stdout carries the protocol, so logs go to stderr only (warnings, unless
/// AGENTD_LOG says otherwise); a daemon that is not running is exit 1 with the reason.
fn mcp(cfg: agentd::config::Config) -> ExitCode {
    agentd::telemetry::init_cli();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("agentd: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match rt.block_on(agentd::cli::mcp::serve(cfg)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("agentd mcp: {e}");
            ExitCode::from(1)
        }
    }
}

/// One JSON document on stdout (pretty, final newline): the `--json` output.
fn print_json(v: &serde_json::Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string())
    );
}

/// `check-config --diff [--json]`; nothing to compare against: exit 1 (with `--json`, also
/// `{"ok": false, "error": …}` on stdout).
fn check_config_diff(cfg: &agentd::config::Config, json: bool) -> ExitCode {
    let report = if json {
        agentd::cli::config_diff::against_running_json(cfg).map(|v| print_json(&v))
    } else {
        agentd::cli::config_diff::against_running(cfg).map(|r| print!("{r}"))
    };
    match report {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            if json {
                print_json(&serde_json::json!({"ok": false, "error": e}));
            }
            eprintln!("agentd: {e}");
            ExitCode::from(1)
        }
    }
}

/// `import openclaw PATH [--apply]`: the report on stdout; after an import that wrote memory
/// notes, the memory index (as `agentd index`), so search finds them at once.
fn import_openclaw(cfg: &agentd::config::Config, path: &std::path::Path, apply: bool) -> ExitCode {
    agentd::telemetry::init_cli();
    let report = match agentd::cli::import::openclaw(cfg, path, apply) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("agentd: {e}");
            return ExitCode::from(1);
        }
    };
    print!("{}", report.render());
    if report.notes_written == 0 {
        return ExitCode::SUCCESS;
    }
    if !cfg.memory.enabled {
        println!("memory is disabled ([memory] enabled = false): the notes are not indexed");
        return ExitCode::SUCCESS;
    }
    memory_command(cfg, |cfg| agentd::cli::memory::index(cfg, false))
}

/// `check-config --migrate`: what changed (or that nothing had to), and where the old file is.
fn check_config_migrate(path: &std::path::Path) -> ExitCode {
    match agentd::config::migrate::migrate(path, agentd::config::load) {
        Ok(m) => {
            for c in &m.changes {
                println!("{c}");
            }
            match &m.backup {
                Some(b) => println!(
                    "rewrote {} (same effective configuration); the old file is {}",
                    path.display(),
                    b.display()
                ),
                None => println!("{}: nothing to migrate", path.display()),
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("agentd: {e}");
            ExitCode::from(1)
        }
    }
}

/// `agentd completions bash|zsh|fish`: the script clap generates from this very parser.
fn completions(shell: &str) -> ExitCode {
    let shell = match shell {
        "bash" => clap_complete::Shell::Bash,
        "zsh" => clap_complete::Shell::Zsh,
        "fish" => clap_complete::Shell::Fish,
        other => {
            eprintln!("agentd: no completions for shell {other:?}; use bash, zsh or fish");
            return ExitCode::from(2);
        }
    };
    clap_complete::generate(shell, &mut Cli::command(), "agentd", &mut std::io::stdout());
    ExitCode::SUCCESS
}

fn doctor(cfg: &agentd::config::Config, json: bool) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("agentd: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let checks = rt.block_on(agentd::doctor::run(cfg));
    let ok = if json {
        let (doc, ok) = agentd::doctor::render_json(&checks);
        print_json(&doc);
        ok
    } else {
        let (table, ok) = agentd::doctor::render(&checks);
        print!("{table}");
        ok
    };
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// `agentd restore`.
fn restore(cli: Cli, config: &std::path::Path) -> ExitCode {
    let Some(Command::Restore {
        file,
        state_dir,
        force,
        resume_deliveries,
        workspace,
        config_dir,
        json,
    }) = cli.command
    else {
        return ExitCode::from(2);
    };
    agentd::telemetry::init_cli();
    let tz = agentd::config::load(config)
        .map(|c| c.agent.timezone)
        .unwrap_or_else(|_| agentd::zone::Zone::utc());
    let opts = agentd::backup::RestoreOptions {
        state_dir,
        force,
        workspace,
        config_dir,
    };
    ExitCode::from(agentd::cli::backup::restore(
        tz,
        &file,
        &opts,
        resume_deliveries,
        json,
    ))
}
