//! `agentd index [--status] [--json]` and `agentd consolidate [--json]` (SPEC §10.4, §13): run
//! against the state directory directly, so they work with the daemon running or stopped.
//! Progress goes to stderr (a bar on a terminal, plain lines otherwise); the summary goes to
//! stdout.

use std::fmt::Write as _;
use std::io::IsTerminal;
use std::sync::Arc;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::config::Config;
use crate::cost::Ledger;
use crate::gateway::Gateway;
use crate::memory::consolidate::{Consolidator, SessionOutcome};
use crate::memory::index::{IndexLock, IndexReport, Phase, Progress};
use crate::memory::{DB_FILE, Memory, MemoryError};
use crate::store::Db;
use crate::store::memory::MemoryDb;

/// A progress bar on stderr (a terminal).
pub struct BarProgress {
    bar: Option<ProgressBar>,
}

impl Progress for BarProgress {
    fn begin(&mut self, phase: Phase, total: u64) {
        let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
        if let Ok(style) =
            ProgressStyle::with_template("{prefix:>10} [{bar:30}] {pos}/{len} {elapsed}")
        {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_prefix(phase.label());
        self.bar = Some(bar);
    }
    fn advance(&mut self, n: u64) {
        if let Some(b) = &self.bar {
            b.inc(n);
        }
    }
    fn end(&mut self) {
        // Cleared and replaced by a plain line, so what follows starts on a line of its own.
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
            eprintln!(
                "index: {} {}/{} done in {:.1} s",
                b.prefix(),
                b.position(),
                b.length().unwrap_or(0),
                b.elapsed().as_secs_f64()
            );
        }
    }
}

/// Plain progress lines on stderr (not a terminal: cron, systemd, a pipe): the start, every
/// tenth of the way, and the end of each phase.
#[derive(Default)]
pub struct LineProgress {
    phase: Option<Phase>,
    total: u64,
    done: u64,
    shown_tenth: u64,
}

impl Progress for LineProgress {
    fn begin(&mut self, phase: Phase, total: u64) {
        *self = LineProgress {
            phase: Some(phase),
            total,
            ..LineProgress::default()
        };
        eprintln!("index: {} 0/{total}", phase.label());
    }
    fn advance(&mut self, n: u64) {
        self.done += n;
        let tenth = (self.done * 10).checked_div(self.total).unwrap_or(10);
        if tenth > self.shown_tenth && self.done < self.total {
            self.shown_tenth = tenth;
            if let Some(p) = self.phase {
                eprintln!("index: {} {}/{}", p.label(), self.done, self.total);
            }
        }
    }
    fn end(&mut self) {
        if let Some(p) = self.phase.take() {
            eprintln!("index: {} {}/{} done", p.label(), self.done, self.total);
        }
    }
}

/// The progress reporter for this process's stderr.
pub fn stderr_progress() -> Box<dyn Progress> {
    if std::io::stderr().is_terminal() {
        Box::new(BarProgress { bar: None })
    } else {
        Box::new(LineProgress::default())
    }
}

/// Open what a memory command needs: the state directory, `agentd.db` (costs, budget),
/// the models behind the provider gateway, and `memory.db`.
fn open(cfg: &Config) -> Result<(Memory, Arc<Gateway>), MemoryError> {
    if !cfg.memory.enabled {
        return Err(MemoryError::Invalid(
            "memory is disabled ([memory] enabled = false); enable it to index or consolidate"
                .into(),
        ));
    }
    crate::fsutil::create_private_dir(&cfg.paths.state_dir).map_err(|e| {
        MemoryError::Io(format!(
            "cannot create the state directory {}: {e}",
            cfg.paths.state_dir.display()
        ))
    })?;
    let db = Db::open(&cfg.paths.state_dir.join("agentd.db"))?;
    // A one-shot command: its metrics are counted and dropped.
    let metrics = Arc::new(crate::metrics::Metrics::new());
    let gateway = Arc::new(Gateway::new(cfg, Ledger::new(db, cfg), metrics));
    let memory = Memory::open(cfg, gateway.clone())?;
    Ok((memory, gateway))
}

/// Memory search for `agentd mcp`'s `memory_search` (SPEC §23): the daemon's own search over
/// `memory.db`, its query embedding billed through this process's gateway.
pub async fn search(
    cfg: &Config,
    query: &str,
    k: usize,
) -> Result<crate::memory::search::SearchResults, MemoryError> {
    let (memory, _gateway) = open(cfg)?;
    memory.search(query, k, "mcp").await
}

/// `agentd index`: one run, progress on stderr; the summary (text or JSON) is returned.
/// An embeddings failure after the full-text index was updated is an error too (exit 1), with
/// the summary in the message.
pub async fn index(cfg: &Config, json: bool) -> Result<String, MemoryError> {
    let (memory, _gateway) = open(cfg)?;
    let mut progress = stderr_progress();
    let report = memory.index(progress.as_mut()).await?;
    let text = if json {
        serde_json::to_string_pretty(&report).unwrap_or_default() + "\n"
    } else {
        render_report(&report)
    };
    match &report.embed_error {
        Some(e) => Err(MemoryError::Embed(format!(
            "{e}\n{text}the full-text index is up to date; run `agentd index` again to embed the rest"
        ))),
        None => Ok(text),
    }
}

fn render_report(r: &IndexReport) -> String {
    let mut s = format!(
        "indexed {} file(s): {} changed, {} unchanged, {} removed; chunks +{} -{} ({} kept)",
        r.files_seen,
        r.files_changed,
        r.files_unchanged,
        r.files_removed,
        r.chunks_added,
        r.chunks_removed,
        r.chunks_kept
    );
    match &r.embeddings_model {
        Some(m) => {
            let _ = write!(s, "; embedded {} chunk text(s) with {m}", r.embedded);
        }
        None => s.push_str("; no embeddings model (full-text search only)"),
    }
    let _ = writeln!(s, " in {:.1} s", r.elapsed_ms as f64 / 1000.0);
    for skipped in &r.skipped {
        let _ = writeln!(s, "skipped: {skipped}");
    }
    s
}

/// `agentd index --status`: counts from `memory.db` (read-only) and whether a run holds the
/// lock right now.
pub async fn status(cfg: &Config, json: bool) -> Result<String, MemoryError> {
    let path = cfg.paths.state_dir.join(DB_FILE);
    let model = cfg
        .models
        .get(crate::memory::embed::MODEL_NAME)
        .map(|s| s.model.clone());
    let running = matches!(
        IndexLock::acquire(&cfg.paths.state_dir),
        Err(MemoryError::Busy(_))
    );
    let Some(db) = MemoryDb::open_read_only(&path)? else {
        return Ok(if json {
            "{\"indexed\": false}\n".to_string()
        } else {
            format!(
                "no memory database yet ({}); run `agentd index`\n",
                path.display()
            )
        });
    };
    let st = db.index_status(model.as_deref()).await?;
    let pending = match &model {
        Some(m) => db.count_unembedded(m).await?,
        None => 0,
    };
    if json {
        let v = serde_json::json!({
            "indexed": true,
            "database": path,
            "running": running,
            "embeddings_model": model,
            "unembedded_texts": pending,
            "status": st,
        });
        return Ok(serde_json::to_string_pretty(&v).unwrap_or_default() + "\n");
    }
    let when = st
        .last_indexed_at
        .and_then(|t| chrono::DateTime::from_timestamp(t, 0))
        .map(|t| {
            t.with_timezone(&cfg.agent.timezone)
                .format("%Y-%m-%d %H:%M %Z")
                .to_string()
        })
        .unwrap_or_else(|| "never".into());
    let mut s = String::new();
    let _ = writeln!(s, "database        {}", path.display());
    let _ = writeln!(s, "files           {}", st.files);
    let _ = writeln!(s, "chunks          {}", st.chunks);
    match &model {
        Some(m) => {
            let _ = writeln!(
                s,
                "embeddings      {} of {} chunks ({m}; {pending} text(s) waiting)",
                st.embedded_chunks, st.chunks
            );
        }
        None => {
            let _ = writeln!(
                s,
                "embeddings      none (no `embeddings` model; full-text only)"
            );
        }
    }
    let _ = writeln!(s, "last indexed    {when}");
    let _ = writeln!(
        s,
        "index run       {}",
        if running { "running now" } else { "idle" }
    );
    let _ = writeln!(s, "facts           {}", st.facts);
    let _ = writeln!(s, "episodes        {}", st.episodes);
    let _ = writeln!(s, "commitments     {} open", st.open_commitments);
    Ok(s)
}

/// `; N alias(es) refused: why, …` when an application refused aliases (issue "Security,
/// third round", item 9), else nothing.
fn refused(a: &crate::store::memory::Applied) -> String {
    if a.aliases_refused == 0 {
        return String::new();
    }
    format!(
        "; {} alias(es) refused: {}",
        a.aliases_refused,
        a.alias_refusals.join("; ")
    )
}

/// `agentd consolidate`: every live and archived session past its watermark, then the
/// changed workspace notes. One progress line per session on stderr.
pub async fn consolidate(cfg: &Config, json: bool) -> Result<String, MemoryError> {
    let (memory, gateway) = open(cfg)?;
    let consolidator = Consolidator::new(memory, gateway, cfg);
    eprintln!("consolidate: model {}", consolidator.model());
    let sessions_dir = cfg.paths.state_dir.join("sessions");
    let mut on_session = |id: &str, r: &Result<SessionOutcome, MemoryError>| match r {
        Ok(SessionOutcome::Done { applied, calls, .. }) => eprintln!(
            "consolidate: session {id}: {} new fact(s), {} superseded, {} episode(s), {} commitment(s) ({calls} call(s)){}",
            applied.facts_new,
            applied.facts_superseded,
            applied.episodes,
            applied.commitments,
            refused(applied)
        ),
        Ok(SessionOutcome::Waiting { reason }) => {
            eprintln!("consolidate: session {id}: skipped ({reason})")
        }
        Err(e) => eprintln!("consolidate: session {id}: failed: {e}"),
    };
    let report = consolidator.all(&sessions_dir, &mut on_session).await;
    let text = if json {
        serde_json::to_string_pretty(&report).unwrap_or_default() + "\n"
    } else {
        let done = report
            .sessions
            .iter()
            .filter(|(_, o)| matches!(o, SessionOutcome::Done { .. }))
            .count();
        let mut s = format!(
            "consolidated {done} of {} session(s) and {} changed note(s)\n",
            report.sessions.len(),
            report.notes()
        );
        for (paths, a) in &report.files {
            let _ = writeln!(
                s,
                "notes {}: {} new fact(s), {} episode(s), {} commitment(s){}",
                paths.join(", "),
                a.facts_new,
                a.episodes,
                a.commitments,
                refused(a)
            );
        }
        s
    };
    if report.errors.is_empty() {
        Ok(text)
    } else {
        Err(MemoryError::Consolidation(format!(
            "{}\n{text}",
            report.errors.join("\n")
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_progress_counts_tenths() {
        let mut p = LineProgress::default();
        p.begin(Phase::Files, 100);
        for _ in 0..100 {
            p.advance(1);
        }
        assert_eq!(p.shown_tenth, 9, "tenths 1..9 shown, the end by end()");
        p.end();
        assert!(p.phase.is_none());
        let mut z = LineProgress::default();
        z.begin(Phase::Embeddings, 0);
        z.advance(0);
        z.end();
    }

    #[test]
    fn report_text_names_the_counts() {
        let r = IndexReport {
            files_seen: 3,
            files_changed: 1,
            files_unchanged: 2,
            chunks_added: 4,
            embeddings_model: Some("all-minilm".into()),
            embedded: 4,
            skipped: vec!["x.md: too large".into()],
            ..IndexReport::default()
        };
        let t = render_report(&r);
        assert!(
            t.starts_with("indexed 3 file(s): 1 changed, 2 unchanged, 0 removed; chunks +4 -0"),
            "{t}"
        );
        assert!(t.contains("embedded 4 chunk text(s) with all-minilm"));
        assert!(t.contains("skipped: x.md: too large"));
    }
}
