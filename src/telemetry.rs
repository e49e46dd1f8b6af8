//! Logging: structured `tracing` events to stderr (journald under systemd) and, when
//! `[logging] file` is on, to daily-rotated files in `state_dir/logs/`.

use std::fmt::{self, Write as _};

use tracing::field::{Field, Visit};
use tracing_appender::non_blocking::WorkerGuard;
use tracing_subscriber::Layer;
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::fmt::FormatFields;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

use crate::config::Config;

/// How fields and messages are written (see [`fields`]).
type Fields = EscapingFields;

/// The field formatter of every log layer.
fn fields() -> Fields {
    EscapingFields
}

/// Writes an event's fields as tracing-subscriber's default does (the message first, then
/// `name=value`, `?`-recorded and string values in `Debug` form), except that the secrets the
/// config holds are replaced by `[redacted]` (`redact::scrub_registered`: libraries such as
/// rmcp and reqwest log URLs, which may carry keys) and every control
/// character in the message and in every value, however it was recorded (`%`, `?`, a string,
/// an error), is written escaped: C0 and C1 controls, DEL and the Unicode line and paragraph
/// separators. Log lines quote outside strings (FIFO ids, provider errors, file names,
/// Telegram text); with this none of them can end a line early and forge the next one, or
/// send escape sequences to a terminal (SPEC §16.9).
#[derive(Debug, Clone, Copy, Default)]
pub struct EscapingFields;

impl<'writer> FormatFields<'writer> for EscapingFields {
    fn format_fields<R: RecordFields>(&self, writer: Writer<'writer>, fields: R) -> fmt::Result {
        let mut visitor = EscapingVisitor {
            writer,
            first: true,
            result: Ok(()),
        };
        fields.record(&mut visitor);
        visitor.result
    }
}

struct EscapingVisitor<'writer> {
    writer: Writer<'writer>,
    first: bool,
    result: fmt::Result,
}

impl EscapingVisitor<'_> {
    fn write(&mut self, field: &Field, value: fmt::Arguments<'_>) {
        if self.result.is_err() {
            return;
        }
        let name = field.name();
        // Metadata of events bridged from the `log` crate, already in the line's prefix.
        if name.starts_with("log.") {
            return;
        }
        let separator = if self.first { "" } else { " " };
        self.first = false;
        // Whole, so that a secret split across format pieces is still found.
        let text = value.to_string();
        let text = crate::redact::scrub_registered(&text);
        self.result = if name == "message" {
            write!(self.writer, "{separator}")
                .and_then(|()| Escaping(&mut self.writer).write_str(&text))
        } else {
            let name = name.strip_prefix("r#").unwrap_or(name);
            write!(self.writer, "{separator}{name}=")
                .and_then(|()| Escaping(&mut self.writer).write_str(&text))
        };
    }
}

impl Visit for EscapingVisitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.write(field, format_args!("{value}"));
        } else {
            self.write(field, format_args!("{value:?}"));
        }
    }

    /// The error and its causes, as `error: cause: cause` (a cause its text already names is
    /// left out).
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        let text = error_chain(value);
        self.write(field, format_args!("{text}"));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.write(field, format_args!("{value:?}"));
    }
}

/// A `fmt::Write` that escapes control characters on the way through: `\n`, `\r`, `\t` as
/// such, others as `\u{…}`. Text without them passes unchanged.
struct Escaping<'a, W: fmt::Write>(&'a mut W);

impl<W: fmt::Write> fmt::Write for Escaping<'_, W> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let mut rest = s;
        while let Some(at) = rest.find(needs_escape) {
            self.0.write_str(&rest[..at])?;
            let c = rest[at..].chars().next().unwrap_or_default();
            match c {
                '\n' => self.0.write_str("\\n")?,
                '\r' => self.0.write_str("\\r")?,
                '\t' => self.0.write_str("\\t")?,
                c => write!(self.0, "\\u{{{:x}}}", u32::from(c))?,
            }
            rest = &rest[at + c.len_utf8()..];
        }
        self.0.write_str(rest)
    }
}

/// C0 and C1 controls, DEL (all `char::is_control`), and U+2028/U+2029, which some viewers
/// treat as line ends.
fn needs_escape(c: char) -> bool {
    c.is_control() || matches!(c, '\u{2028}' | '\u{2029}')
}

/// Log lines buffered for the file writer thread. tracing-appender's default (128,000) is a
/// channel allocated and touched in full at start: 4 MB of resident memory for a daemon that
/// logs a few lines per message (docs/BENCHMARKS.md, footprint). When the writer falls this far
/// behind, further lines are dropped (the default lossy mode), never blocking a worker.
const LOG_BUFFER_LINES: usize = 8192;

/// Keep the returned guard alive until exit: dropping it flushes the file writer. With
/// `quiet_stderr` (the terminal channel of `agentd chat`) only warnings reach stderr.
///
/// `quiet_targets`: library targets capped at a level (`(target, level)`) unless the filter
/// names them (`tools::mcp::QUIET_LOG_TARGETS`, `channels::matrix::QUIET_LOG_TARGETS`).
pub fn init(
    cfg: &Config,
    quiet_stderr: bool,
    quiet_targets: &[(&str, &str)],
) -> Result<Option<WorkerGuard>, String> {
    crate::redact::register(cfg.secrets_to_scrub());
    let filter = std::env::var("AGENTD_LOG")
        .ok()
        .filter(|v| !v.trim().is_empty())
        .unwrap_or_else(|| cfg.logging.level.clone());
    let filter = parse_filter(&with_quiet_targets(&filter, quiet_targets)).map_err(|e| {
        format!(
            "invalid log filter {filter:?} (AGENTD_LOG or [logging] level): {e}; \
             write a level (error, warn, info, debug, trace) or target=level pairs, \
             e.g. \"info,agentd::llm=debug\""
        )
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
        .with_target(false)
        .fmt_fields(fields());
    let (file_layer, guard) = if cfg.logging.file {
        let dir = cfg.paths.state_dir.join("logs");
        crate::fsutil::create_private_dir(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let appender = tracing_appender::rolling::Builder::new()
            .rotation(tracing_appender::rolling::Rotation::DAILY)
            .filename_prefix(LOG_PREFIX)
            .filename_suffix(LOG_SUFFIX)
            .max_log_files(cfg.logging.keep_files.max(1))
            .build(&dir)
            .map_err(|e| format!("cannot open log files in {}: {e}", dir.display()))?;
        let capped = CappedFiles::new(appender, dir, cfg.logging.max_total_bytes);
        let (nb, guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
            .buffered_lines_limit(LOG_BUFFER_LINES)
            .finish(capped);
        (
            Some(
                tracing_subscriber::fmt::layer()
                    .with_writer(nb)
                    .with_ansi(false)
                    .fmt_fields(fields()),
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
        .and_then(|v| parse_filter(&v).ok())
        .unwrap_or_else(|| Targets::new().with_default(tracing::Level::WARN));
    let layer = tracing_subscriber::fmt::layer()
        .fmt_fields(fields())
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_target(false);
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(layer)
        .try_init();
}

/// `filter` with each of `targets` (`(target, level)`) capped at its level unless the filter
/// names it itself (a library that logs what a peer sends at `info` would let the peer fill
/// the log; docs/security.md).
fn with_quiet_targets(filter: &str, targets: &[(&str, &str)]) -> String {
    let mut out = filter.to_string();
    for (t, level) in targets {
        if !filter.contains(t) {
            out.push_str(&format!(",{t}={level}"));
        }
    }
    out
}

/// The names of the log files: `agentd.<date>.log`.
const LOG_PREFIX: &str = "agentd";
const LOG_SUFFIX: &str = "log";

/// The log files under a total size (`[logging] max_total_mb`): before a line would pass it,
/// the oldest files are deleted; when today's file alone is that large, lines are dropped and
/// counted until the next day's file, and the count is written when writing resumes. Runs on
/// the log writer's own thread.
struct CappedFiles<W> {
    inner: W,
    dir: std::path::PathBuf,
    cap: u64,
    /// The log files' total size as last listed, plus what was written since.
    used: u64,
    dropped: u64,
    /// When the files were last listed: while lines are dropped, at most once a second.
    listed_at: Option<std::time::Instant>,
}

impl<W: std::io::Write> CappedFiles<W> {
    fn new(inner: W, dir: std::path::PathBuf, cap: u64) -> Self {
        let mut files = CappedFiles {
            inner,
            dir,
            cap,
            used: 0,
            dropped: 0,
            listed_at: None,
        };
        files.used = files.listed().iter().map(|(_, len)| len).sum();
        files
    }

    /// The log files, oldest first (their names end with the date), with their sizes.
    fn listed(&self) -> Vec<(std::path::PathBuf, u64)> {
        let mut files: Vec<(std::path::PathBuf, u64)> = std::fs::read_dir(&self.dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| {
                let name = e.file_name();
                let name = name.to_string_lossy();
                name.starts_with(LOG_PREFIX) && name.ends_with(LOG_SUFFIX)
            })
            .filter_map(|e| Some((e.path(), e.metadata().ok()?.len())))
            .collect();
        files.sort();
        files
    }

    /// Delete the oldest files (never the newest, which is being written) until `room` more
    /// bytes fit; the total after.
    fn make_room(&mut self, room: u64) -> u64 {
        let mut files = self.listed();
        let mut total: u64 = files.iter().map(|(_, len)| len).sum();
        let newest = files.pop();
        for (path, len) in files {
            if total + room <= self.cap {
                break;
            }
            if std::fs::remove_file(&path).is_ok() {
                total -= len;
            }
        }
        drop(newest);
        total
    }
}

impl<W: std::io::Write> std::io::Write for CappedFiles<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let need = buf.len() as u64 + if self.dropped > 0 { 128 } else { 0 };
        if self.used + need > self.cap {
            let recently = self
                .listed_at
                .is_some_and(|t| t.elapsed() < std::time::Duration::from_secs(1));
            if self.dropped == 0 || !recently {
                self.used = self.make_room(need);
                self.listed_at = Some(std::time::Instant::now());
            }
            if self.used + need > self.cap {
                self.dropped += 1;
                return Ok(buf.len());
            }
        }
        if self.dropped > 0 {
            let note = format!(
                "log files reached [logging] max_total_mb ({} MB): {} lines were dropped\n",
                self.cap >> 20,
                std::mem::take(&mut self.dropped)
            );
            self.inner.write_all(note.as_bytes())?;
            self.used += note.len() as u64;
        }
        self.inner.write_all(buf)?;
        self.used += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// A log filter: a default level and `target=level` directives, comma-separated (empty ones
/// skipped), e.g. `info,agentd::llm=debug`. `tracing_subscriber`'s `Targets`, not its
/// `EnvFilter`: span and field filters are not accepted, and the regex engines `EnvFilter`
/// needs are not linked (binary size: docs/BENCHMARKS.md).
fn parse_filter(s: &str) -> Result<Targets, String> {
    let directives: Vec<&str> = s
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .collect();
    if directives.is_empty() {
        return Err("no level given".into());
    }
    for d in &directives {
        if d.contains(['[', '{']) {
            return Err(format!("{d:?}: span and field filters are not supported"));
        }
        if d.contains(['"', ' ', '\t']) {
            return Err(format!("{d:?}: no spaces or quotes inside a directive"));
        }
    }
    directives.join(",").parse().map_err(|e| format!("{e}"))
}

/// An error and its causes, as `error: cause: cause` (a cause whose text the chain already
/// holds is left out). The one formatter for error chains: logs, and every HTTP client's
/// error text (after the client has removed the URL, which may carry secrets).
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod cap_tests {
    use std::io::Write;

    use super::*;

    fn file(dir: &std::path::Path, day: &str) -> std::fs::File {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join(format!("agentd.{day}.log")))
            .unwrap()
    }

    #[test]
    fn old_files_go_first_then_lines_are_dropped_and_counted() {
        let dir = tempfile::tempdir().unwrap();
        file(dir.path(), "2026-01-01")
            .write_all(&[b'o'; 600])
            .unwrap();
        let mut capped = CappedFiles::new(file(dir.path(), "2026-01-02"), dir.path().into(), 1000);
        assert_eq!(capped.used, 600);
        let line = [b'x'; 99];
        for _ in 0..5 {
            capped.write_all(&line).unwrap();
        }
        // 600 + 500 > 1000: the old file was deleted, nothing dropped.
        assert!(!dir.path().join("agentd.2026-01-01.log").exists());
        assert_eq!(capped.dropped, 0);
        for _ in 0..20 {
            capped.write_all(&line).unwrap();
        }
        let today = std::fs::metadata(dir.path().join("agentd.2026-01-02.log"))
            .unwrap()
            .len();
        assert!(today <= 1000, "{today}");
        assert!(capped.dropped > 0);
        // A new day: the full file goes, the count is written first.
        capped.inner = file(dir.path(), "2026-01-03");
        capped.listed_at = None;
        capped.write_all(b"fresh\n").unwrap();
        let text = std::fs::read_to_string(dir.path().join("agentd.2026-01-03.log")).unwrap();
        assert!(
            text.contains("lines were dropped") && text.ends_with("fresh\n"),
            "{text}"
        );
        assert!(!dir.path().join("agentd.2026-01-02.log").exists());
    }

    #[test]
    fn quiet_targets_are_quiet_unless_named() {
        let lib = [("lib", "error")];
        assert_eq!(with_quiet_targets("info", &lib), "info,lib=error");
        assert_eq!(
            with_quiet_targets("debug,lib=debug", &lib),
            "debug,lib=debug"
        );
    }

    /// matrix-sdk and ruma log at `info` what the homeserver sends (every sync, every key
    /// share): capped at `warn` unless the filter names them, in every crate of theirs.
    #[test]
    fn matrix_sdk_and_ruma_are_capped_at_warn_unless_named() {
        use tracing::Level;
        let quiet = crate::channels::matrix::QUIET_LOG_TARGETS;
        let f = parse_filter(&with_quiet_targets("info", quiet)).unwrap();
        for t in [
            "matrix_sdk::sync",
            "matrix_sdk_crypto::machine",
            "ruma_common",
        ] {
            assert!(!f.would_enable(t, &Level::INFO), "{t}");
            assert!(f.would_enable(t, &Level::WARN), "{t}");
        }
        assert!(f.would_enable("agentd::channels::matrix", &Level::INFO));
        let named = with_quiet_targets("info,matrix_sdk_crypto=debug", quiet);
        let f = parse_filter(&named).unwrap();
        assert!(f.would_enable("matrix_sdk_crypto::machine", &Level::DEBUG));
        assert!(!f.would_enable("ruma_common", &Level::INFO));
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::layer::SubscriberExt;

    use super::*;

    #[test]
    fn log_filters_as_documented() {
        use tracing::Level;
        use tracing_subscriber::filter::LevelFilter;
        let f = parse_filter("info,agentd::llm=debug").unwrap();
        assert!(f.would_enable("agentd::llm::anthropic", &Level::DEBUG));
        assert!(!f.would_enable("agentd::session", &Level::DEBUG));
        assert!(f.would_enable("agentd::session", &Level::INFO));
        let f = parse_filter(" warn , agentd=trace, ").unwrap();
        assert_eq!(f.default_level(), Some(LevelFilter::WARN));
        assert!(f.would_enable("agentd::x", &Level::TRACE));
        assert!(!f.would_enable("hyper", &Level::INFO));
        assert!(
            parse_filter("DEBUG")
                .unwrap()
                .would_enable("h2", &Level::DEBUG)
        );
        for bad in [
            "",
            " , ",
            "info,agentd=loud",
            "agentd[span]=debug",
            "agentd = debug",
        ] {
            assert!(parse_filter(bad).is_err(), "{bad:?} accepted");
        }
        assert!(
            parse_filter("a[{x}]=info")
                .unwrap_err()
                .contains("span and field")
        );
        assert!(
            parse_filter("agentd = debug")
                .unwrap_err()
                .contains("no spaces")
        );
    }

    /// Everything written, shared with the test.
    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// What the daemon's log layer writes for the events `f` emits.
    fn logged(f: impl FnOnce()) -> String {
        let buf = Buf::default();
        let writer = buf.clone();
        let layer = tracing_subscriber::fmt::layer()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .without_time()
            .fmt_fields(fields());
        tracing::subscriber::with_default(tracing_subscriber::registry().with(layer), f);
        String::from_utf8(buf.0.lock().unwrap().clone()).unwrap()
    }

    /// Issue #12 finding 12: a newline in an outside string (a FIFO id) forged a log line.
    /// Control characters in messages and in every field value, however recorded, are
    /// escaped: one event is one line.
    #[test]
    fn control_characters_in_outside_strings_cannot_forge_lines() {
        let id = "abc\n2026-11-27T00:00:00Z  INFO forged line\r\x1b[31mred\x07\u{85}\u{2028}";
        let err = std::io::Error::other("bad\nthing");
        let chained = anyhow::anyhow!("inner\ncause").context("outer");
        let out = logged(|| {
            let chained: &(dyn std::error::Error + 'static) = chained.as_ref();
            tracing::warn!(id = %id, raw = id, dbg = ?id, error = %err, chained, "line {id} seen");
            tracing::info!(next = 1, "second");
        });
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 2, "{out}");
        assert!(lines[1].contains("second"), "{out}");
        let first = lines[0];
        for c in first.chars() {
            assert!(
                !c.is_control() && c != '\u{2028}',
                "control character {c:?} in {first:?}"
            );
        }
        assert!(first.contains(r"abc\n2026"), "{first}");
        assert!(first.contains(r"line abc\n2026"), "{first}");
        assert!(first.contains(r"bad\nthing"), "{first}");
        assert!(first.contains(r"chained=outer: inner\ncause"), "{first}");
        assert!(first.contains(r"\r"), "{first}");
        assert!(first.contains("forged line"), "{first}");
    }

    /// Ordinary text, including non-ASCII letters, is written as before.
    #[test]
    fn ordinary_text_is_unchanged() {
        let out = logged(|| tracing::info!(user = %"Jürgen", n = 3, q = "a b", "hello wörld"));
        assert!(out.contains("hello wörld"), "{out}");
        assert!(out.contains("user=Jürgen"), "{out}");
        assert!(out.contains("n=3"), "{out}");
        assert!(out.contains("q=\"a b\""), "{out}");
    }
}
