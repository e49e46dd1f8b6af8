//! `bench`: benchmark programs that print figures (docs/BENCHMARKS.md). Each one starts the
//! real release `agentd` with a temporary state directory and fakes on 127.0.0.1.
//!
//! ```sh
//! cargo build --release --bin agentd --bin bench
//! target/release/bench all          # or footprint | startup | overhead | cache | soak | senders
//! ```

#[path = "../benches/backup.rs"]
mod backup;
#[path = "../benches/cache.rs"]
mod cache;
#[path = "../benches/client.rs"]
mod client;
#[path = "../benches/cost.rs"]
mod cost;
#[path = "../benches/disk.rs"]
mod disk;
#[path = "../benches/fake_provider.rs"]
mod fake_provider;
#[allow(dead_code)]
#[path = "../tests/it/support/fake_telegram.rs"]
mod fake_telegram;
#[path = "../benches/launch.rs"]
mod launch;
#[path = "../benches/runs.rs"]
mod runs;
#[path = "../benches/stats.rs"]
mod stats;

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::{Parser, ValueEnum};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Name {
    Footprint,
    Startup,
    Overhead,
    Cache,
    /// What the cost autopilot saves (prechecks, cache TTL), in simulated time.
    Cost,
    Soak,
    /// Many distinct HTTP senders with idle sessions archived after 2 s.
    Senders,
    /// `agentd backup` of 1,000 sessions and 100,000 trail lines; per-message time meanwhile.
    Backup,
    /// Everything but the soak and senders.
    All,
}

/// The exit codes, as `--help` lists them.
const EXIT_CODES: &str = "\
Exit codes:
  0  the benchmark ran and printed its figures
  1  it could not run (no agentd binary, a fake or the daemon failed)
  2  usage error";

#[derive(Parser)]
#[command(
    name = "bench",
    version = agentd::VERSION,
    about = "agentd benchmarks (docs/BENCHMARKS.md)",
    after_help = EXIT_CODES
)]
struct Cli {
    name: Name,
    /// The daemon binary (default: `agentd` next to this program).
    #[arg(long)]
    agentd: Option<PathBuf>,
    /// Parent directory of the temporary daemon homes, so of the state directories
    /// (default: $TMPDIR or /tmp). The disk under it decides the fsync cost.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// startup: restarts measured.
    #[arg(long, default_value_t = 30)]
    runs: usize,
    /// overhead: sequential messages (the concurrent run sends as many); soak: messages.
    #[arg(long)]
    messages: Option<usize>,
    /// senders: distinct HTTP senders.
    #[arg(long, default_value_t = 2000)]
    senders: usize,
    /// senders: messages per sender.
    #[arg(long, default_value_t = 2)]
    per_sender: usize,
    /// soak: sessions.
    #[arg(long, default_value_t = 200)]
    sessions: usize,
    /// overhead, soak and senders: sessions in flight at once.
    #[arg(long, default_value_t = 20)]
    concurrency: usize,
    /// overhead: only the sequential session (messages 1–N by quarter), no concurrent phase.
    #[arg(long)]
    sequential_only: bool,
    /// footprint: keep the daemon running this many seconds after the figures (to profile it).
    #[arg(long, default_value_t = 0)]
    hold: u64,
    /// soak: compact sessions above this many tokens (`[behavior.compaction]
    /// threshold_tokens`; 0 keeps the default, 150,000).
    #[arg(long, default_value_t = 0)]
    compaction_tokens: u64,
    /// footprint and startup: turn Matrix on against this homeserver URL, logged in as
    /// `--matrix-user` with the access token in AGENTD_MATRIX_TOKEN.
    #[arg(long, requires = "matrix_user")]
    matrix: Option<String>,
    /// The bot's user id for `--matrix` (`@bot:example.org`).
    #[arg(long, requires = "matrix")]
    matrix_user: Option<String>,
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    agentd::net::tls::install();
    let agentd = cli.agentd.unwrap_or_else(runs::default_agentd);
    // The daemon runs in its temporary directory: a relative path would not resolve there.
    let agentd = std::fs::canonicalize(&agentd).unwrap_or(agentd);
    if !agentd.is_file() {
        bail!(
            "{} not found: build it first (cargo build --release --bin agentd --bin bench)",
            agentd.display()
        );
    }
    let mut o = runs::Opts {
        agentd,
        dir: cli.dir.unwrap_or_else(std::env::temp_dir),
        runs: cli.runs.max(1),
        messages: cli.messages.unwrap_or(1000),
        sessions: cli.sessions.max(1),
        concurrency: cli.concurrency.max(1),
        hold: std::time::Duration::from_secs(cli.hold),
        compaction_tokens: cli.compaction_tokens,
        senders: cli.senders.max(1),
        per_sender: cli.per_sender.max(1),
        sequential_only: cli.sequential_only,
        matrix: match (cli.matrix, cli.matrix_user) {
            (Some(homeserver), Some(user_id)) => Some(launch::MatrixLogin {
                homeserver,
                user_id,
                token: std::env::var("AGENTD_MATRIX_TOKEN")
                    .context("--matrix needs the bot's access token in AGENTD_MATRIX_TOKEN")?,
            }),
            _ => None,
        },
    };
    machine(&o);
    match cli.name {
        Name::Footprint => runs::footprint(&o)?,
        Name::Startup => runs::startup(&o)?,
        Name::Overhead => runs::overhead(&o)?,
        Name::Cache => cache::cache(&o)?,
        Name::Cost => cost::cost()?,
        Name::Soak => {
            o.messages = cli.messages.unwrap_or(20_000);
            runs::soak(&o)?
        }
        Name::Senders => runs::senders(&o)?,
        Name::Backup => backup::backup(&o)?,
        Name::All => {
            runs::footprint(&o)?;
            runs::startup(&o)?;
            runs::overhead(&o)?;
            cache::cache(&o)?;
            cost::cost()?;
        }
    }
    Ok(())
}

/// The machine, so that figures carry their context.
fn machine(o: &runs::Opts) {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|v| v.trim_start_matches([' ', '\t', ':']).to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let built = std::fs::metadata(&o.agentd)
        .and_then(|m| m.modified())
        .ok()
        .map(|t| {
            chrono::DateTime::<chrono::Utc>::from(t)
                .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        })
        .unwrap_or_default();
    println!(
        "machine: {cores} cores, {cpu}, Linux {}; state dirs under {} on {}",
        kernel.trim(),
        o.dir.display(),
        launch::storage_of(&o.dir)
    );
    println!("agentd: {} (built {built})", o.agentd.display());
}
