//! Logging: structured `tracing` events to stderr (journald under systemd) and, when
//! `[logging] file` is on, to daily-rotated files in `state_dir/logs/`.

use tracing_appender::non_blocking::WorkerGuard;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::Layer;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

use crate::config::Config;

/// Log lines buffered for the file writer thread. tracing-appender's default (128,000) is a
/// channel allocated and touched in full at start: 4 MB of resident memory for a daemon that
/// logs a few lines per message (docs/BENCHMARKS.md, footprint). When the writer falls this far
/// behind, further lines are dropped (the default lossy mode), never blocking a worker.
const LOG_BUFFER_LINES: usize = 8192;

/// Keep the returned guard alive until exit: dropping it flushes the file writer. With
/// `quiet_stderr` (the terminal channel of `agentd chat`) only warnings reach stderr.
pub fn init(cfg: &Config, quiet_stderr: bool) -> Result<Option<WorkerGuard>, String> {
    let filter = std::env::var("AGENTD_LOG")
        .ok()
        .filter(|v| !v.trim().is_empty())
        .unwrap_or_else(|| cfg.logging.level.clone());
    let filter = EnvFilter::try_new(&filter).map_err(|e| {
        format!("invalid log filter {filter:?} (AGENTD_LOG or [logging] level): {e}")
    })?;
    // Under systemd the journal adds timestamps.
    let under_journal = std::env::var_os("JOURNAL_STREAM").is_some();
    let stderr_level = if quiet_stderr {
        tracing_subscriber::filter::LevelFilter::WARN
    } else {
        tracing_subscriber::filter::LevelFilter::TRACE
    };
    let stderr = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_target(false);
    let (file_layer, guard) = if cfg.logging.file {
        let dir = cfg.paths.state_dir.join("logs");
        crate::fsutil::create_private_dir(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let appender = tracing_appender::rolling::Builder::new()
            .rotation(tracing_appender::rolling::Rotation::DAILY)
            .filename_prefix("agentd")
            .filename_suffix("log")
            .max_log_files(cfg.logging.keep_files.max(1))
            .build(&dir)
            .map_err(|e| format!("cannot open log files in {}: {e}", dir.display()))?;
        let (nb, guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
            .buffered_lines_limit(LOG_BUFFER_LINES)
            .finish(appender);
        (
            Some(
                tracing_subscriber::fmt::layer()
                    .with_writer(nb)
                    .with_ansi(false),
            ),
            Some(guard),
        )
    } else {
        (None, None)
    };
    let registry = tracing_subscriber::registry().with(filter).with(file_layer);
    if under_journal {
        registry
            .with(stderr.without_time().with_filter(stderr_level))
            .try_init()
    } else {
        registry.with(stderr.with_filter(stderr_level)).try_init()
    }
    .map_err(|e| format!("cannot initialise logging: {e}"))?;
    Ok(guard)
}

/// Logging for one-shot commands (`agentd index`, `agentd consolidate`): stderr only, warnings
/// and errors unless `AGENTD_LOG` asks for more. A second call does nothing.
pub fn init_cli() {
    let filter = std::env::var("AGENTD_LOG")
        .ok()
        .and_then(|v| EnvFilter::try_new(v.trim()).ok())
        .unwrap_or_else(|| EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_target(false)
        .try_init();
}
