//! footprint, startup, overhead and soak: the real daemon against loopback fakes.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::client::{Chat, runtime};
use crate::fake_provider::{Answer, FakeProvider, Usage};
use crate::launch::{Daemon, ProcStats, Setup, TG_TOKEN, mb, storage_of};
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
}

/// A fake provider that answers every call at once with a short text. It reports the request's
/// size as input tokens (4 bytes a token), so the daemon's context estimate, and with it
/// compaction, behaves as with a real provider.
fn echo_provider() -> Result<FakeProvider> {
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
    std::thread::sleep(Duration::from_secs(3));
    println!("footprint (FIFO + HTTP + Telegram on a fake Bot API; 2 tokio workers)");
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
    d.stop()?;
    let mut warm = Vec::new();
    for _ in 0..o.runs {
        let t0 = d.spawn()?;
        warm.push(d.wait_status(Duration::from_secs(30), poll)? - t0);
        d.stop()?;
    }
    println!(
        "startup: exec → GET /api/v1/status 200 (FIFO + HTTP + Telegram; polled every {} µs)",
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
    // How the figure moves as the session's history grows.
    let chunk = (n / 4).max(1);
    for (i, c) in added.chunks(chunk).enumerate() {
        let mut c = c.to_vec();
        c.sort();
        println!(
            "    messages {:>5}-{:<5} daemon-added p50 {} ms, p99 {} ms",
            i * chunk + 1,
            i * chunk + c.len(),
            ms(pct(&c, 50.0)),
            ms(pct(&c, 99.0))
        );
    }

    // 20 sessions at once, each sequential.
    let sessions = o.concurrency;
    let per = (n / sessions).max(1);
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
    d.stop()?;
    Ok(())
}

/// Client round trip minus the provider's own time for the same message.
fn subtract(totals: &[Duration], tags: &[u64], spans: &[(u64, Duration)]) -> Result<Vec<Duration>> {
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

fn report(totals: &[Duration], added: &[Duration], n: usize, wall: Duration) {
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

/// The `agentd` next to this executable (both built by `cargo build --release`).
pub fn default_agentd() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join("agentd")))
        .unwrap_or_else(|| Path::new("target/release/agentd").to_path_buf())
}
