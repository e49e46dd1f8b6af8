//! footprint, startup, overhead and soak: the real daemon against loopback fakes.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::client::{Chat, runtime};
use crate::fake_provider::{Answer, FakeProvider, Usage};
use crate::launch::{Daemon, MatrixLogin, ProcStats, Setup, TG_TOKEN, mb, storage_of};
use crate::stats::{ms, pct, summary};

/// Options shared by the benchmarks.
#[derive(Clone, Debug)]
pub struct Opts {
    pub agentd: PathBuf,
    /// Where the temporary daemon homes (and so the state directories) go.
    pub dir: PathBuf,
    pub runs: usize,
    pub messages: usize,
    pub sessions: usize,
    pub concurrency: usize,
    /// footprint: keep the daemon running this long after the figures (for profiling).
    pub hold: Duration,
    /// soak: `[behavior.compaction] threshold_tokens` (0: the default, 150,000).
    pub compaction_tokens: u64,
    /// senders: distinct HTTP senders.
    pub senders: usize,
    /// senders: messages each sender sends, one after the other.
    pub per_sender: usize,
    /// overhead: the sequential session only (no concurrent phase).
    pub sequential_only: bool,
    /// footprint and startup: Matrix on, logged in to this account.
    pub matrix: Option<MatrixLogin>,
}

/// The channels the daemon of footprint and startup runs, for their headings.
fn channels(o: &Opts) -> &'static str {
    match o.matrix {
        Some(_) => "FIFO + HTTP + Telegram + Matrix",
        None => "FIFO + HTTP + Telegram",
    }
}

/// Waits until the daemon's `monitor.json` shows a Matrix sync that succeeded.
fn wait_matrix_synced(d: &Daemon, timeout: Duration) -> Result<Instant> {
    let deadline = Instant::now() + timeout;
    let monitor = d.state_dir.join("monitor.json");
    loop {
        let synced = fs_json(&monitor)
            .is_some_and(|m| m["channels"]["matrix"]["last_sync_ok_at"].is_string());
        if synced {
            return Ok(Instant::now());
        }
        if Instant::now() >= deadline {
            bail!(
                "no Matrix sync succeeded within {timeout:?} (see the daemon's log under {})",
                d.root.display()
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn fs_json(path: &Path) -> Option<serde_json::Value> {
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}

/// A fake provider that answers every call at once with a short text. It reports the request's
/// size as input tokens (4 bytes a token), so the daemon's context estimate, and with it
/// compaction, behaves as with a real provider.
pub(crate) fn echo_provider() -> Result<FakeProvider> {
    FakeProvider::spawn(Box::new(|body| {
        (
            Answer::Text("ok".into()),
            Usage {
                input: body.len() as u64 / 4,
                output: 2,
                cache_read: 0,
                cache_write: 0,
            },
        )
    }))
}

/// Sessions and their compactions, from `GET /api/v1/sessions`.
fn compactions(rt: &tokio::runtime::Runtime, chat: &Chat) -> Result<(usize, u64)> {
    let v = rt.block_on(chat.get("/api/v1/sessions"))?;
    let list = v["sessions"].as_array().cloned().unwrap_or_default();
    let n = list
        .iter()
        .map(|s| s["compaction_count"].as_u64().unwrap_or(0))
        .sum();
    Ok((list.len(), n))
}

fn print_stats(label: &str, s: &ProcStats) {
    println!(
        "  {label:<28} RSS {:>6.2} MB  PSS {:>6.2} MB (anon {:.2}, file {:.2})  fds {:>3}  threads {:>2}",
        mb(s.rss_kb),
        mb(s.pss_kb),
        mb(s.pss_anon_kb),
        mb(s.pss_file_kb),
        s.fds,
        s.threads
    );
}

/// A daemon (not started) with the echo provider and Telegram on a fake Bot API; the fakes
/// live as long as the returned values.
fn telegram_daemon(o: &Opts) -> Result<(FakeProvider, crate::fake_telegram::FakeTelegram, Daemon)> {
    let fake = echo_provider()?;
    let tg = crate::fake_telegram::FakeTelegram::spawn(TG_TOKEN);
    let d = Daemon::new(
        &o.agentd,
        &o.dir,
        &Setup {
            provider_url: fake.base_url(),
            telegram_url: Some(tg.api_url()),
            matrix: o.matrix.clone(),
            ..Setup::default()
        },
    )?;
    Ok((fake, tg, d))
}

/// RSS/PSS 3 s after ready with FIFO, HTTP and Telegram (fake Bot API) on; then after 200
/// messages (HTTP) and 20 Telegram messages.
pub fn footprint(o: &Opts) -> Result<()> {
    let (_fake, tg, mut d) = telegram_daemon(o)?;
    d.start()?;
    let pid = d.pid().context("pid")?;
    // Telegram is up when the poller has asked for updates.
    let rt = runtime()?;
    rt.block_on(tg.wait_for_polls(1, Duration::from_secs(10)));
    if o.matrix.is_some() {
        wait_matrix_synced(&d, Duration::from_secs(180))?;
    }
    std::thread::sleep(Duration::from_secs(3));
    println!(
        "footprint ({}; Telegram on a fake Bot API; 2 tokio workers)",
        channels(o)
    );
    let idle = ProcStats::read(pid)?;
    print_stats("3 s after ready:", &idle);

    let chat = Chat::new(&d.base_url())?;
    rt.block_on(async {
        for i in 0..200 {
            chat.send("fp", &format!("message {i}")).await?;
        }
        Ok::<_, anyhow::Error>(())
    })?;
    for i in 0..20 {
        tg.push_text(1001, 1001, &format!("telegram message {i}"));
        rt.block_on(tg.wait_for_sent(i + 1, Duration::from_secs(30)));
    }
    std::thread::sleep(Duration::from_secs(1));
    let after = ProcStats::read(pid)?;
    print_stats("after 200 HTTP + 20 Telegram:", &after);
    if !o.hold.is_zero() {
        println!(
            "  holding pid {pid} for {:?} (state dir {})",
            o.hold,
            d.state_dir.display()
        );
        std::thread::sleep(o.hold);
    }
    d.stop()?;
    Ok(())
}

/// Exec → `/api/v1/status` 200, `runs` times (one cold start on an empty state directory,
/// the rest warm restarts of the same state directory).
pub fn startup(o: &Opts) -> Result<()> {
    let (_fake, _tg, mut d) = telegram_daemon(o)?;
    let poll = Duration::from_micros(200);
    let t0 = d.spawn()?;
    let cold = d.wait_status(Duration::from_secs(30), poll)? - t0;
    // The first sync of a new login answers at once; later ones wait for new events (a long
    // poll), so only this one says how soon Matrix is up.
    let synced = match o.matrix {
        Some(_) => Some(wait_matrix_synced(&d, Duration::from_secs(180))? - t0),
        None => None,
    };
    d.stop()?;
    let mut warm = Vec::new();
    for _ in 0..o.runs {
        let t0 = d.spawn()?;
        warm.push(d.wait_status(Duration::from_secs(30), poll)? - t0);
        d.stop()?;
    }
    println!(
        "startup: exec → GET /api/v1/status 200 ({}; polled every {} µs)",
        channels(o),
        poll.as_micros()
    );
    println!("  first start (empty state dir): {} ms", ms(cold));
    let mut w = warm.clone();
    w.sort();
    println!(
        "  restart: min {} / p50 {} / p90 {} / max {} ms (n = {})",
        ms(w[0]),
        ms(pct(&w, 50.0)),
        ms(pct(&w, 90.0)),
        ms(*w.last().expect("runs > 0")),
        w.len()
    );
    if let Some(synced) = synced {
        println!(
            "  first start → first Matrix sync in monitor.json: {} ms",
            ms(synced)
        );
    }
    Ok(())
}

/// Daemon-added latency of `/api/v1/chat` with a zero-latency provider.
pub fn overhead(o: &Opts) -> Result<()> {
    let fake = echo_provider()?;
    let mut d = Daemon::new(
        &o.agentd,
        &o.dir,
        &Setup {
            provider_url: fake.base_url(),
            ..Setup::default()
        },
    )?;
    d.start()?;
    println!("overhead: POST /api/v1/chat, provider answers at once (streamed), fsync on");
    println!("  state dir on: {}", storage_of(&d.root));
    let disk = crate::disk::measure(&d.root.join("disk-probe"), 400)?;
    println!("  bare append + fdatasync on that dir: {}", disk.fdatasync);
    println!(
        "  temp + fsync + rename + dir fsync (4 KiB): {}",
        disk.atomic_replace
    );
    let chat = Chat::new(&d.base_url())?;
    let rt = runtime()?;
    let mut next = 1u64;
    // Warm-up: connections, first session, SQLite pages.
    rt.block_on(async {
        for _ in 0..50 {
            chat.send("warm", &format!("BENCHID={next} warm-up"))
                .await?;
            next += 1;
        }
        Ok::<_, anyhow::Error>(())
    })?;
    fake.take_spans();

    // One session, sequential.
    let n = o.messages;
    let mut totals = Vec::with_capacity(n);
    let mut tags = Vec::with_capacity(n);
    let wall = Instant::now();
    rt.block_on(async {
        for _ in 0..n {
            let (t, _) = chat
                .send("seq", &format!("BENCHID={next} how are you?"))
                .await?;
            totals.push(t);
            tags.push(next);
            next += 1;
        }
        Ok::<_, anyhow::Error>(())
    })?;
    let wall = wall.elapsed();
    let added = subtract(&totals, &tags, &fake.take_spans())?;
    let (_, compacted) = compactions(&rt, &chat)?;
    println!(
        "  sequential, one session, {n} messages ({compacted} compaction(s) at the default threshold):"
    );
    report(&totals, &added, n, wall);
    // How the figure moves as the session's history grows (SPEC §16.6: it should not).
    let chunk = (n / 4).max(1);
    let mut p50s = Vec::new();
    for (i, c) in added.chunks(chunk).enumerate() {
        let mut c = c.to_vec();
        c.sort();
        p50s.push(pct(&c, 50.0));
        println!(
            "    messages {:>5}-{:<5} daemon-added p50 {} ms, p99 {} ms",
            i * chunk + 1,
            i * chunk + c.len(),
            ms(pct(&c, 50.0)),
            ms(pct(&c, 99.0))
        );
    }
    if let (Some(first), Some(last)) = (p50s.first(), p50s.last())
        && !first.is_zero()
    {
        println!(
            "    last quarter's p50 / first quarter's p50: {:.2} (goal: <= 1.2)",
            last.as_secs_f64() / first.as_secs_f64()
        );
    }

    if o.sequential_only {
        d.stop()?;
        return Ok(());
    }

    // 20 sessions at once, each sequential.
    let sessions = o.concurrency;
    let per = (n / sessions).max(1);
    let waits_before = slot_waits(&rt, &chat)?;
    let wall = Instant::now();
    let results = rt.block_on(async {
        let mut tasks = Vec::new();
        for s in 0..sessions {
            let chat = chat.clone();
            let first = next + (s * per) as u64;
            tasks.push(async move {
                let mut out = Vec::with_capacity(per);
                for k in 0..per {
                    let tag = first + k as u64;
                    let (t, _) = chat
                        .send(&format!("c{s}"), &format!("BENCHID={tag} hello"))
                        .await?;
                    out.push((tag, t));
                }
                Ok::<_, anyhow::Error>(out)
            });
        }
        futures::future::try_join_all(tasks).await
    })?;
    let wall = wall.elapsed();
    let (tags, totals): (Vec<u64>, Vec<Duration>) = results.into_iter().flatten().unzip();
    let added = subtract(&totals, &tags, &fake.take_spans())?;
    println!(
        "  {sessions} sessions concurrently, {per} messages each ([behavior] max_concurrent_sessions = 4, the default):"
    );
    report(&totals, &added, totals.len(), wall);
    // Waiting for one of the 4 slots, from the daemon's own histogram, against the rest.
    let (sum, count) = slot_waits(&rt, &chat)?;
    let (sum, count) = (sum - waits_before.0, count - waits_before.1);
    if count > 0.0 {
        let wait = sum / count;
        let mean_added = added.iter().map(Duration::as_secs_f64).sum::<f64>() / added.len() as f64;
        println!(
            "    of daemon-added (mean {:.3} ms): waiting for a session slot mean {:.3} ms, work mean {:.3} ms ({count} waits)",
            mean_added * 1e3,
            wait * 1e3,
            (mean_added - wait).max(0.0) * 1e3
        );
    }
    d.stop()?;
    Ok(())
}

/// `agentd_session_slot_wait_seconds`' sum and count from `/metrics`.
fn slot_waits(rt: &tokio::runtime::Runtime, chat: &Chat) -> Result<(f64, f64)> {
    let text = rt.block_on(chat.get_text("/metrics"))?;
    let value = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    Ok((
        value("agentd_session_slot_wait_seconds_sum"),
        value("agentd_session_slot_wait_seconds_count"),
    ))
}

/// Client round trip minus the provider's own time for the same message.
pub(crate) fn subtract(
    totals: &[Duration],
    tags: &[u64],
    spans: &[(u64, Duration)],
) -> Result<Vec<Duration>> {
    let mut by_tag: HashMap<u64, Duration> = HashMap::new();
    for (tag, span) in spans {
        *by_tag.entry(*tag).or_default() += *span;
    }
    totals
        .iter()
        .zip(tags)
        .map(|(t, tag)| match by_tag.get(tag) {
            Some(span) => Ok(t.saturating_sub(*span)),
            None => bail!("the provider never saw message {tag}"),
        })
        .collect()
}

pub(crate) fn report(totals: &[Duration], added: &[Duration], n: usize, wall: Duration) {
    let mut t = totals.to_vec();
    let mut a = added.to_vec();
    println!("    round trip:    {}", summary(&mut t));
    println!("    daemon-added:  {}", summary(&mut a));
    println!(
        "    throughput:    {:.0} messages/s ({n} in {:.2} s)",
        n as f64 / wall.as_secs_f64(),
        wall.as_secs_f64()
    );
}

/// 20,000 messages over 200 sessions: RSS, fds and threads as the run goes.
pub fn soak(o: &Opts) -> Result<()> {
    let fake = echo_provider()?;
    let extra_toml = if o.compaction_tokens > 0 {
        format!(
            "\n[behavior.compaction]\nthreshold_tokens = {}\n",
            o.compaction_tokens
        )
    } else {
        String::new()
    };
    let mut d = Daemon::new(
        &o.agentd,
        &o.dir,
        &Setup {
            provider_url: fake.base_url(),
            extra_toml,
            ..Setup::default()
        },
    )?;
    d.start()?;
    let pid = d.pid().context("pid")?;
    let chat = Chat::new(&d.base_url())?;
    let rt = runtime()?;
    let total = o.messages;
    let sessions = o.sessions;
    let conc = o.concurrency;
    let step = (total / 20).max(1);
    println!(
        "soak: {total} messages over {sessions} sessions ({conc} in flight, round robin), compaction at {} tokens; RSS/fds/threads every {step} (after 0.5 s quiet)",
        if o.compaction_tokens > 0 {
            o.compaction_tokens
        } else {
            150_000
        }
    );
    print_stats("ready:", &ProcStats::read(pid)?);
    let started = Instant::now();
    let mut samples = Vec::new();
    let mut sent = 0usize;
    while sent < total {
        let end = (sent + step).min(total);
        let t0 = Instant::now();
        rt.block_on(async {
            let mut tasks = Vec::new();
            for w in 0..conc {
                let chat = chat.clone();
                tasks.push(async move {
                    let mut i = sent + w;
                    while i < end {
                        let s = i % sessions;
                        chat.send(&format!("soak{s}"), &format!("BENCHID={i} message {i}"))
                            .await?;
                        i += conc;
                    }
                    Ok::<_, anyhow::Error>(())
                });
            }
            futures::future::try_join_all(tasks).await
        })?;
        fake.take_spans();
        let rate = (end - sent) as f64 / t0.elapsed().as_secs_f64();
        sent = end;
        // Let the work that follows a reply (snapshots) finish, so samples compare.
        std::thread::sleep(Duration::from_millis(500));
        let s = ProcStats::read(pid)?;
        print_stats(&format!("after {end:>6} ({rate:.0}/s):"), &s);
        samples.push((end, s));
    }
    let (n_sessions, compacted) = compactions(&rt, &chat)?;
    println!("  {n_sessions} sessions, {compacted} compactions");
    // Warm-up: the first quarter (every session has history, caches and pools are full).
    let w = (samples.len() / 4).max(1) - 1;
    let warm = samples[w].1;
    let mid = samples[(samples.len() / 2).max(1) - 1].1;
    let last = samples.last().map(|(_, s)| *s).unwrap_or_default();
    println!(
        "  growth after warm-up ({} → {} messages): RSS {:+.2} MB (middle {:+.2} MB), fds {:+}, threads {:+}; {:.0} s in all",
        samples[w].0,
        total,
        mb(last.rss_kb) - mb(warm.rss_kb),
        mb(mid.rss_kb) - mb(warm.rss_kb),
        last.fds as i64 - warm.fds as i64,
        last.threads as i64 - warm.threads as i64,
        started.elapsed().as_secs_f64()
    );
    // Idle blocking-pool threads exit after 10 s.
    std::thread::sleep(Duration::from_secs(12));
    print_stats("12 s after the last message:", &ProcStats::read(pid)?);
    d.stop()?;
    Ok(())
}

/// What `bench senders` samples: the daemon's `/proc` figures and the sessions directory.
struct SendersSample {
    proc: ProcStats,
    /// Entries of `sessions/sessions.json`.
    index: usize,
    /// Files directly in `sessions/` (the index, trails, snapshots, settled marks).
    files: usize,
    /// Files in `sessions/.archive/`.
    archived: usize,
    /// `agentd_open_sessions` and `agentd_session_workers` from `/metrics`.
    open: u64,
    workers: u64,
}

fn count_files(dir: &Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |rd| {
        rd.filter_map(|e| e.ok())
            .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
            .count()
    })
}

/// A gauge without labels from the OpenMetrics text of `/metrics`.
fn gauge(metrics: &str, name: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

fn senders_sample(
    rt: &tokio::runtime::Runtime,
    chat: &Chat,
    pid: i32,
    sessions: &Path,
) -> Result<SendersSample> {
    let index = match std::fs::read(sessions.join("sessions.json")) {
        Ok(b) => serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(&b)
            .context("sessions.json")?
            .len(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
        Err(e) => return Err(e).context("reading sessions.json"),
    };
    let metrics = rt.block_on(chat.get_text("/metrics"))?;
    Ok(SendersSample {
        proc: ProcStats::read(pid)?,
        index,
        files: count_files(sessions),
        archived: count_files(&sessions.join(".archive")),
        open: gauge(&metrics, "agentd_open_sessions"),
        workers: gauge(&metrics, "agentd_session_workers"),
    })
}

fn print_senders_row(label: &str, s: &SendersSample) {
    println!(
        "  {label:<26} {:>5} {:>6} {:>8} {:>5} {:>7}  {:>4} {:>7}  {:>6.2} {:>6.2}",
        s.index,
        s.files,
        s.archived,
        s.open,
        s.workers,
        s.proc.fds,
        s.proc.threads,
        mb(s.proc.rss_kb),
        mb(s.proc.pss_anon_kb),
    );
}

/// 2,000 distinct HTTP senders with `[retention] idle_session_after = "2s"`: the session
/// index, the sessions directory, open session handles, fds, threads and memory as the run
/// goes and after it, so that growth with the number of senders ever seen shows (issue 13).
pub fn senders(o: &Opts) -> Result<()> {
    let fake = echo_provider()?;
    let mut d = Daemon::new(
        &o.agentd,
        &o.dir,
        &Setup {
            provider_url: fake.base_url(),
            extra_toml: "\n[retention]\nidle_session_after = \"2s\"\n".into(),
            ..Setup::default()
        },
    )?;
    d.start()?;
    let pid = d.pid().context("pid")?;
    let sessions_dir = d.state_dir.join("sessions");
    let chat = Chat::new(&d.base_url())?;
    let rt = runtime()?;
    let total = o.senders;
    let per = o.per_sender;
    let conc = o.concurrency;
    let step = 250.min(total).max(1);
    println!(
        "senders: {total} distinct HTTP senders, {per} message(s) each in sequence, {conc} senders in flight; [retention] idle_session_after = \"2s\" (a retention pass every 1 s); sampled every {step} senders after 0.5 s quiet"
    );
    println!(
        "  {:<26} {:>5} {:>6} {:>8} {:>5} {:>7}  {:>4} {:>7}  {:>6} {:>6}",
        "", "index", "files", "archived", "open", "workers", "fds", "threads", "RSS", "anon"
    );
    print_senders_row("ready:", &senders_sample(&rt, &chat, pid, &sessions_dir)?);
    let started = Instant::now();
    let mut samples = Vec::new();
    let mut sent = 0usize;
    while sent < total {
        let end = (sent + step).min(total);
        let t0 = Instant::now();
        rt.block_on(async {
            let mut tasks = Vec::new();
            for w in 0..conc {
                let chat = chat.clone();
                tasks.push(async move {
                    let mut i = sent + w;
                    while i < end {
                        for k in 0..per {
                            chat.send(&format!("sender{i}"), &format!("BENCHID={i} message {k}"))
                                .await?;
                        }
                        i += conc;
                    }
                    Ok::<_, anyhow::Error>(())
                });
            }
            futures::future::try_join_all(tasks).await
        })?;
        fake.take_spans();
        let rate = ((end - sent) * per) as f64 / t0.elapsed().as_secs_f64();
        sent = end;
        std::thread::sleep(Duration::from_millis(500));
        let s = senders_sample(&rt, &chat, pid, &sessions_dir)?;
        print_senders_row(&format!("after {end:>5} ({rate:.0} msgs/s):"), &s);
        samples.push(s);
    }
    let took = started.elapsed();
    // Every session is now idle: 2 s of idleness plus a pass (every second) and the archive.
    for wait in [5u64, 30] {
        let since = started.elapsed().saturating_sub(took);
        std::thread::sleep(Duration::from_secs(wait).saturating_sub(since));
        let s = senders_sample(&rt, &chat, pid, &sessions_dir)?;
        print_senders_row(&format!("{wait} s after the last:"), &s);
        samples.push(s);
    }
    let listed = serde_json::from_str::<serde_json::Value>(
        &rt.block_on(chat.get_text("/api/v1/sessions"))?,
    )?
    .get("sessions")
    .and_then(|v| v.as_array().map(Vec::len))
    .unwrap_or(0);
    let max = |f: fn(&SendersSample) -> u64| samples.iter().map(f).max().unwrap_or(0);
    println!(
        "  maxima during the run: index {}, files in sessions/ {}, open handles {}, fds {}, threads {}; GET /api/v1/sessions lists {listed} at the end; {} messages in {:.0} s",
        max(|s| s.index as u64),
        max(|s| s.files as u64),
        max(|s| s.open),
        max(|s| s.proc.fds as u64),
        max(|s| s.proc.threads as u64),
        total * per,
        took.as_secs_f64()
    );
    d.stop()?;
    Ok(())
}

/// The `agentd` next to this executable (both built by `cargo build --release`).
pub fn default_agentd() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join("agentd")))
        .unwrap_or_else(|| Path::new("target/release/agentd").to_path_buf())
}
