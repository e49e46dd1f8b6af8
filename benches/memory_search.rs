//! Memory search latency (issue #6): p50/p99 of `Memory::search_chunks` at 10k and 100k
//! chunks, full text only and hybrid (FTS5 + a scan of every chunk vector + fusion).
//!
//! ```sh
//! cargo bench --bench memory_search                   # 10k and 100k chunks
//! cargo bench --bench memory_search -- --chunks 5000 --queries 500 --dims 384
//! ```
//!
//! The corpus is synthetic: chunks of ~120 words drawn from a 20,000-word vocabulary with a
//! Zipf-like distribution (so posting lists are as skewed as in real text), and random unit
//! vectors. Queries are 2–6 words drawn from the same distribution as the text. Query vectors are put in the embedding cache
//! beforehand, so the figure is agentd's own search time (SQLite, the vector scan, fusion and
//! row fetches), not an embeddings server's. The first query of each run loads the vectors
//! into memory; that load is reported on its own and not counted in the percentiles.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use agentd::memory::chunk::{embed_text, sha256_hex};
use agentd::memory::{Memory, SearchMode};
use agentd::store::memory::{FileMeta, NewChunk};

struct Args {
    sizes: Vec<usize>,
    queries: usize,
    dims: usize,
    k: usize,
}

fn parse() -> anyhow::Result<Args> {
    let mut a = Args {
        sizes: vec![10_000, 100_000],
        queries: 300,
        dims: 384,
        k: 10,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || it.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--chunks" => a.sizes = vec![value()?.parse()?],
            "--queries" => a.queries = value()?.parse()?,
            "--dims" => a.dims = value()?.parse()?,
            "--k" => a.k = value()?.parse()?,
            "--bench" => {}
            other => bail!("unknown argument {other:?} (see the top of benches/memory_search.rs)"),
        }
    }
    Ok(a)
}

/// A pronounceable pseudo-word for vocabulary index `i` (distinct for distinct `i`).
fn word(i: usize) -> String {
    const C: &[u8] = b"bcdfghklmnprstvz";
    const V: &[u8] = b"aeiou";
    let mut s = String::new();
    let mut n = i + 1;
    while n > 0 {
        s.push(C[n % C.len()] as char);
        n /= C.len();
        s.push(V[n % V.len()] as char);
        n /= V.len();
    }
    s
}

/// Zipf-like: index `floor(V^u) - 1` for uniform `u`, so low indices are far more frequent.
fn zipf(rng: &mut StdRng, vocab: usize) -> usize {
    let u: f64 = rng.random();
    ((vocab as f64).powf(u) as usize)
        .saturating_sub(1)
        .min(vocab - 1)
}

fn unit_vector(rng: &mut StdRng, dims: usize) -> Vec<f32> {
    let mut v: Vec<f32> = (0..dims).map(|_| rng.random::<f32>() - 0.5).collect();
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    v.iter_mut().for_each(|x| *x /= norm);
    v
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

const VOCAB: usize = 20_000;
const WORDS_PER_CHUNK: usize = 120;
const CHUNKS_PER_FILE: usize = 50;

fn main() -> anyhow::Result<()> {
    let a = parse()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let vocab: Vec<String> = (0..VOCAB).map(word).collect();
    println!(
        "memory search: {} queries per run, k = {}, {} dims, {}-word chunks, {VOCAB}-word vocabulary",
        a.queries, a.k, a.dims, WORDS_PER_CHUNK
    );
    println!(
        "{:>8}  {:<9}  {:>10}  {:>10}  {:>10}  {:>14}",
        "chunks", "mode", "p50", "p99", "max", "first (load)"
    );
    for &size in &a.sizes {
        rt.block_on(run(size, &a, &vocab))?;
    }
    Ok(())
}

async fn run(size: usize, a: &Args, vocab: &[String]) -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let workspace = tmp.path().join("workspace");
    std::fs::create_dir_all(&workspace)?;
    let toml = format!(
        "[agent]\nname = \"search-bench\"\nworkspace = {workspace:?}\ntimezone = \"UTC\"\n\n[providers]\nload = []\n\n[models.primary]\ntype = \"openai\"\nbase_url = \"http://127.0.0.1:9/v1\"\nmodel = \"unused\"\n\n[models.embeddings]\ntype = \"openai\"\nbase_url = \"http://127.0.0.1:9/v1\"\nmodel = \"bench-vectors\"\n\n[paths]\nstate_dir = {:?}\n\n[logging]\nfile = false\n",
        tmp.path().join("state")
    );
    let config = tmp.path().join("agentd.toml");
    std::fs::write(&config, toml)?;
    let cfg = agentd::config::load(&config).map_err(|e| anyhow::anyhow!("{e}"))?;
    std::fs::create_dir_all(&cfg.paths.state_dir)?;
    // The embedding calls go through the provider gateway, billed to this state's ledger.
    let db = agentd::store::Db::open(&cfg.paths.state_dir.join("agentd.db"))?;
    let ledger = agentd::cost::Ledger::new(db, &cfg);
    let metrics = Arc::new(agentd::metrics::Metrics::new());
    let gateway = Arc::new(agentd::gateway::Gateway::new(&cfg, ledger, metrics));
    let memory = Memory::open(&cfg, gateway)?;
    let db = memory.db().clone();
    let model = memory
        .embedder()
        .context("the embeddings model is configured")?
        .model_id()
        .to_string();

    let mut rng = StdRng::seed_from_u64(42);
    let built = Instant::now();
    for f in 0..size.div_ceil(CHUNKS_PER_FILE) {
        let path = format!("memory/note-{f:06}.md");
        let n = CHUNKS_PER_FILE.min(size - f * CHUNKS_PER_FILE);
        let mut chunks = Vec::with_capacity(n);
        let mut vectors = Vec::with_capacity(n);
        for c in 0..n {
            let text: Vec<&str> = (0..WORDS_PER_CHUNK)
                .map(|_| vocab[zipf(&mut rng, VOCAB)].as_str())
                .collect();
            let text = text.join(" ");
            let hash = sha256_hex(embed_text(&path, &text).as_bytes());
            vectors.push((hash.clone(), unit_vector(&mut rng, a.dims)));
            chunks.push(NewChunk {
                start_line: c as u32 + 1,
                end_line: c as u32 + 1,
                hash,
                text,
            });
        }
        let meta = FileMeta {
            path: path.clone(),
            hash: format!("file-{f}"),
            size: 0,
            mtime: 0,
        };
        db.replace_file(meta, chunks).await?;
        db.put_embeddings(&model, vectors, true).await?;
    }
    // Queries, with their vectors already cached.
    let queries: Vec<String> = (0..a.queries + 1)
        .map(|_| {
            let n = rng.random_range(2..=6);
            (0..n)
                .map(|_| vocab[zipf(&mut rng, VOCAB)].as_str())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    let cached: Vec<(String, Vec<f32>)> = queries
        .iter()
        .map(|q| (sha256_hex(q.as_bytes()), unit_vector(&mut rng, a.dims)))
        .collect();
    db.put_embeddings(&model, cached, false).await?;
    eprintln!(
        "{size} chunks built in {:.1} s",
        built.elapsed().as_secs_f64()
    );

    for mode in [SearchMode::FullText, SearchMode::Hybrid] {
        let first = Instant::now();
        let r = memory
            .search_chunks(&queries[0], a.k, mode, "bench")
            .await?;
        let first = first.elapsed();
        if r.mode != mode {
            bail!("search fell back to {:?}: {:?}", r.mode, r.warning);
        }
        let mut times = Vec::with_capacity(a.queries);
        let mut hits = 0;
        for q in &queries[1..] {
            let t = Instant::now();
            let r = memory.search_chunks(q, a.k, mode, "bench").await?;
            times.push(t.elapsed());
            hits += r.hits.len();
            if r.mode != mode {
                bail!("search fell back to {:?}: {:?}", r.mode, r.warning);
            }
        }
        times.sort();
        let label = match mode {
            SearchMode::FullText => "full text",
            SearchMode::Hybrid => "hybrid",
        };
        println!(
            "{size:>8}  {label:<9}  {:>10}  {:>10}  {:>10}  {:>14}",
            ms(percentile(&times, 0.5)),
            ms(percentile(&times, 0.99)),
            ms(times.last().copied().unwrap_or_default()),
            ms(first),
        );
        if hits == 0 {
            bail!("no query found anything");
        }
    }
    Ok(())
}
