//! Retrieval quality of memory search (issue #5): index a workspace and print recall@k per
//! query class, full text only and hybrid (FTS5 + vectors, merged as `memory::Fusion` says;
//! other fusions with `--fusion`).
//!
//! ```sh
//! cargo bench --bench retrieval                                   # full text only
//! cargo bench --bench retrieval -- --embeddings-url http://127.0.0.1:PORT/v1 --model all-MiniLM-L6-v2
//! scripts/retrieval-eval.sh                                        # starts the real model itself
//! ```
//!
//! Options: `--workspace DIR` and `--queries FILE` (default: tests/fixtures/retrieval), `--k N`
//! (5), `--chunk-chars N` / `--overlap-chars N` (the config defaults), `--misses` (list what
//! each miss found instead), `--json`, `--weights "A,B ..."` (the default fusion with full-text
//! weight A and vector weight B), `--fusion "SPEC ..."` (other fusions, each
//! `METHOD[+coverage][+adaptive]:A,B` with METHOD `rrf` or `convex`; `vector` = vectors alone).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use agentd::memory::eval::{EvalReport, load_queries};
use agentd::memory::index::NoProgress;
use agentd::memory::{Fusion, FusionMethod, Memory, SearchMode};
use anyhow::{Context, bail};

struct Args {
    workspace: PathBuf,
    queries: PathBuf,
    url: Option<String>,
    model: String,
    k: usize,
    chunk_chars: Option<usize>,
    overlap_chars: Option<usize>,
    misses: bool,
    json: bool,
    /// Weight pairs (fts, vector) of the default fusion to compare, e.g. `--weights "1,1 0.5,1"`.
    weights: Vec<(f64, f64)>,
    /// Other fusions to compare, with their labels.
    fusions: Vec<(String, Fusion)>,
}

/// `METHOD[+coverage][+adaptive]:A,B`, or `vector` (RRF with full-text weight 0).
fn parse_fusion(spec: &str) -> anyhow::Result<Fusion> {
    if spec == "vector" {
        return Ok(Fusion {
            method: FusionMethod::Rrf,
            fts_weight: 0.0,
            vector_weight: 1.0,
            coverage: false,
            adaptive: false,
        });
    }
    let (name, weights) = spec.split_once(':').unwrap_or((spec, "1,1"));
    let (a, b) = weights
        .split_once(',')
        .with_context(|| format!("--fusion {spec:?}: weights are A,B"))?;
    let mut parts = name.split('+');
    let method = match parts.next() {
        Some("rrf") => FusionMethod::Rrf,
        Some("convex") => FusionMethod::Convex,
        _ => bail!("--fusion {spec:?}: the method is rrf or convex"),
    };
    let mut f = Fusion {
        method,
        fts_weight: a.parse()?,
        vector_weight: b.parse()?,
        coverage: false,
        adaptive: false,
    };
    for p in parts {
        match p {
            "coverage" => f.coverage = true,
            "adaptive" => f.adaptive = true,
            other => bail!("--fusion {spec:?}: unknown option {other:?} (coverage, adaptive)"),
        }
    }
    Ok(f)
}

fn parse() -> anyhow::Result<Args> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/retrieval");
    let mut a = Args {
        workspace: root.join("workspace"),
        queries: root.join("queries.json"),
        url: None,
        model: "all-MiniLM-L6-v2".into(),
        k: 5,
        chunk_chars: None,
        overlap_chars: None,
        misses: false,
        json: false,
        weights: Vec::new(),
        fusions: Vec::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || it.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--workspace" => a.workspace = value()?.into(),
            "--queries" => a.queries = value()?.into(),
            "--embeddings-url" => a.url = Some(value()?),
            "--model" => a.model = value()?,
            "--k" => a.k = value()?.parse()?,
            "--chunk-chars" => a.chunk_chars = Some(value()?.parse()?),
            "--overlap-chars" => a.overlap_chars = Some(value()?.parse()?),
            "--misses" => a.misses = true,
            "--json" => a.json = true,
            "--weights" => {
                for pair in value()?.split_whitespace() {
                    let (f, v) = pair
                        .split_once(',')
                        .context("--weights takes FTS,VECTOR pairs")?;
                    a.weights.push((f.parse()?, v.parse()?));
                }
            }
            "--fusion" => {
                for spec in value()?.split_whitespace() {
                    a.fusions.push((spec.to_string(), parse_fusion(spec)?));
                }
            }
            // cargo bench passes --bench to harness-less benches.
            "--bench" => {}
            other => bail!("unknown argument {other:?} (see the top of benches/retrieval.rs)"),
        }
    }
    Ok(a)
}

fn print_table(reports: &[(String, EvalReport)]) {
    println!(
        "{:<12} {}",
        "class",
        reports
            .iter()
            .map(|(l, _)| format!("{l:>24}"))
            .collect::<String>()
    );
    let classes: Vec<&String> = reports[0].1.classes.keys().collect();
    for c in classes {
        let cells: String = reports
            .iter()
            .map(|(_, r)| {
                let s = &r.classes[c];
                format!(
                    "{:>24}",
                    format!("{}/{} {:.2}", s.hits, s.total, s.recall())
                )
            })
            .collect();
        println!("{c:<12} {cells}");
    }
    let cells: String = reports
        .iter()
        .map(|(_, r)| {
            let o = &r.overall;
            format!(
                "{:>24}",
                format!("{}/{} {:.2}", o.hits, o.total, o.recall())
            )
        })
        .collect();
    println!("{:<12} {cells}", "overall");
}

fn main() -> anyhow::Result<()> {
    let a = parse()?;
    let tmp = tempfile::tempdir()?;
    let mut toml = format!(
        "[agent]\nname = \"retrieval-bench\"\nworkspace = {:?}\ntimezone = \"UTC\"\n\n[providers]\nload = []\n\n# Required by the config; never called.\n[models.primary]\ntype = \"openai\"\nbase_url = \"http://127.0.0.1:9/v1\"\nmodel = \"unused\"\n\n[paths]\nstate_dir = {:?}\n\n[logging]\nfile = false\n\n[memory.indexer]\ninclude = [\"MEMORY.md\", \"memory/**/*.md\"]\n",
        a.workspace.canonicalize().context("workspace")?,
        tmp.path().join("state"),
    );
    if let Some(n) = a.chunk_chars {
        toml.push_str(&format!("chunk_chars = {n}\n"));
    }
    if let Some(n) = a.overlap_chars {
        toml.push_str(&format!("overlap_chars = {n}\n"));
    }
    if let Some(url) = &a.url {
        toml.push_str(&format!(
            "\n[models.embeddings]\ntype = \"openai\"\nbase_url = {url:?}\nmodel = {:?}\n",
            a.model
        ));
    }
    let config = tmp.path().join("agentd.toml");
    std::fs::write(&config, toml)?;
    let cfg = agentd::config::load(&config).map_err(|e| anyhow::anyhow!("{e}"))?;
    std::fs::create_dir_all(&cfg.paths.state_dir)?;
    let queries = load_queries(&a.queries)?;

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async {
        // The embedding calls go through the provider gateway, billed to this state's ledger.
        let db = agentd::store::Db::open(&cfg.paths.state_dir.join("agentd.db"))?;
        let ledger = agentd::cost::Ledger::new(db, &cfg);
        let metrics = Arc::new(agentd::metrics::Metrics::new());
        let gateway = Arc::new(agentd::gateway::Gateway::new(&cfg, ledger, metrics));
        let memory = Memory::open(&cfg, gateway)?;
        let started = Instant::now();
        let index = memory.index(&mut NoProgress).await?;
        if let Some(e) = &index.embed_error {
            bail!("embedding the workspace failed: {e}");
        }
        eprintln!(
            "indexed {} notes into {} chunks ({} embedded) in {:.1} s; {} queries, k = {}",
            index.files_seen,
            index.chunks_added,
            index.embedded,
            started.elapsed().as_secs_f64(),
            queries.len(),
            a.k
        );
        let fts = memory.evaluate(&queries, a.k, SearchMode::FullText).await?;
        let mut reports = vec![("full text".to_string(), fts)];
        if a.url.is_some() {
            let default = memory.fusion();
            let mut fusions = vec![("hybrid".to_string(), default)];
            for (fts_weight, vector_weight) in &a.weights {
                fusions.push((
                    format!("hybrid {fts_weight}/{vector_weight}"),
                    Fusion {
                        fts_weight: *fts_weight,
                        vector_weight: *vector_weight,
                        ..default
                    },
                ));
            }
            fusions.extend(a.fusions.iter().cloned());
            for (label, fusion) in fusions {
                let m = memory.clone().with_fusion(fusion);
                let hybrid = m.evaluate(&queries, a.k, SearchMode::Hybrid).await?;
                if hybrid.fell_back > 0 {
                    bail!(
                        "{} hybrid queries fell back to full text (embeddings failed)",
                        hybrid.fell_back
                    );
                }
                reports.push((label, hybrid));
            }
        }
        if a.json {
            let v: Vec<serde_json::Value> = reports
                .iter()
                .map(|(l, r)| serde_json::json!({"label": l, "report": r}))
                .collect();
            println!("{}", serde_json::to_string_pretty(&v)?);
        } else {
            println!("recall@{} (hits/queries), {} notes", a.k, index.files_seen);
            println!(
                "(hybrid: the default fusion; a/b: with full-text weight a, vector weight b; others: --fusion)"
            );
            print_table(&reports);
        }
        if a.misses {
            for (label, r) in &reports {
                for (id, got) in &r.misses {
                    println!("miss [{label}] {id}: {}", got.join(", "));
                }
            }
        }
        Ok(())
    })
}
