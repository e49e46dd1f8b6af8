//! Budget check latency (issue #6): what `[budget]` costs before every model call once the
//! month's ledger is long. Two `spend_since` calls per check (today, this month); the bench
//! times one, over a month of rows:
//!
//! - `scan`: the period's rows summed on every call (what every check did before the running
//!   sums, and what the first check of a period still does);
//! - `running`: `Db::spend_since`, with one new row written between calls, as in the daemon.
//!
//! ```sh
//! cargo bench --bench budget_check                     # 10k and 100k rows
//! cargo bench --bench budget_check -- --rows 30000 --calls 500
//! ```

use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use agentd::message::Usage;
use agentd::store::{CallType, CostRow, Db};

/// A month of rows ends here (Unix seconds); the month starts 30 days before.
const END: i64 = 1_795_000_000;
const MONTH: i64 = 30 * 86_400;

struct Args {
    sizes: Vec<usize>,
    calls: usize,
}

fn parse() -> anyhow::Result<Args> {
    let mut a = Args {
        sizes: vec![10_000, 100_000],
        calls: 300,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || it.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--rows" => a.sizes = vec![value()?.parse()?],
            "--calls" => a.calls = value()?.parse()?,
            "--bench" => {}
            other => bail!("unknown argument {other:?} (see the top of benches/budget_check.rs)"),
        }
    }
    Ok(a)
}

fn row(timestamp: i64) -> CostRow {
    CostRow {
        timestamp,
        session_id: "0195f0a0-1234-7000-8000-000000000000".into(),
        model: "claude-sonnet".into(),
        provider: "anthropic".into(),
        call_type: CallType::Chat,
        usage: Usage {
            input_tokens: 1_000,
            output_tokens: 200,
            cache_read_tokens: 5_000,
            cache_write_tokens: 100,
            cache_write_1h_tokens: 0,
        },
        cost_usd: 0.0123,
        fallback_from: None,
        source: None,
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn report(name: &str, mut times: Vec<Duration>) {
    times.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "  {name:<8} p50 {:8.3} ms   p99 {:8.3} ms   max {:8.3} ms",
        ms(percentile(&times, 0.5)),
        ms(percentile(&times, 0.99)),
        ms(*times.last().expect("calls > 0")),
    );
}

fn main() -> anyhow::Result<()> {
    let a = parse()?;
    if a.calls == 0 {
        bail!("--calls must be at least 1");
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    println!(
        "budget check: spend_since(start of the month), {} calls per mode",
        a.calls
    );
    for rows in a.sizes {
        let dir = tempfile::tempdir()?;
        let db = Db::open(&dir.path().join("agentd.db"))?;
        let since = END - MONTH;
        rt.block_on(async {
            let started = Instant::now();
            for i in 0..rows as i64 {
                db.insert_cost(row(since + i * MONTH / rows as i64)).await?;
            }
            println!(
                "{rows} rows written in {:.1} s",
                started.elapsed().as_secs_f64()
            );

            let mut scan = Vec::with_capacity(a.calls);
            for _ in 0..a.calls {
                let t = Instant::now();
                std::hint::black_box(db.spend_since_scan(since).await?);
                scan.push(t.elapsed());
            }
            report("scan", scan);

            let mut running = Vec::with_capacity(a.calls);
            db.spend_since(since).await?;
            for _ in 0..a.calls {
                db.insert_cost(row(END)).await?;
                let t = Instant::now();
                std::hint::black_box(db.spend_since(since).await?);
                running.push(t.elapsed());
            }
            report("running", running);
            let (kept, scanned) = (
                db.spend_since(since).await?,
                db.spend_since_scan(since).await?,
            );
            if (kept - scanned).abs() > 1e-6 {
                bail!("running sum {kept} differs from the scan {scanned}");
            }
            anyhow::Ok(())
        })?;
    }
    Ok(())
}
