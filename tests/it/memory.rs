//! Long-term memory against the real binaries (SPEC §13): `agentd index` on the retrieval test
//! workspace (incremental by content hash, embeddings through a fake OpenAI-compatible
//! `/embeddings` server), the memory tools and recall in a running daemon, and
//! `agentd consolidate` with its watermark.

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::daemon::{TestDaemon, copy_dir_recursive};
use crate::support::e2e::{agentd_toml, provider_toml};
use crate::support::fake_embed::FakeEmbed;
use crate::support::fake_llm::{FakeLlm, Reply, Wire, last_user_text};
use crate::support::wait_until;

/// The retrieval test set (tests/fixtures/retrieval).
pub fn fixture_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/retrieval")
}

/// Config sections for memory: the fixture's globs and, with `embed`, an inline `embeddings`
/// model served by the fake.
pub fn memory_toml(embed: Option<&FakeEmbed>, extra: &str) -> String {
    let model = embed.map_or(String::new(), |e| {
        format!(
            "\n[models.embeddings]\ntype = \"openai\"\nbase_url = \"{}\"\nmodel = \"fake-embed\"\ncost_per_mtok = {{ input = 0.02, output = 0.0, cache_read = 0.0, cache_write = 0.0 }}\n",
            e.base_url()
        )
    });
    format!("{model}\n[memory.indexer]\ninclude = [\"MEMORY.md\", \"memory/**/*.md\"]\n{extra}")
}

/// A daemon layout (not started) whose workspace holds the retrieval fixture's notes.
pub fn memory_daemon(llm: &FakeLlm, embed: Option<&FakeEmbed>, extra: &str) -> TestDaemon {
    let config = format!("{}{}", agentd_toml("fake"), memory_toml(embed, extra));
    let d = TestDaemon::new(
        &config,
        &[("fake", &provider_toml("anthropic", &llm.base_url()))],
    );
    copy_dir_recursive(&fixture_dir().join("workspace"), &d.workspace());
    d
}

/// `agentd <args> -c <config>` with the daemon's state directory; blocking.
pub fn agentd(d: &TestDaemon, args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_agentd"));
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("AGENTD_") {
            cmd.env_remove(k);
        }
    }
    cmd.args(args)
        .arg("-c")
        .arg(&d.config_path)
        .env("AGENTD_STATE_DIR", &d.state_dir)
        .output()
        .expect("agentd runs")
}

/// `agentd index --json`, which must succeed; its report.
pub fn index(d: &TestDaemon) -> Value {
    let out = agentd(d, &["index", "--json"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "agentd index failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"))
}

fn n(v: &Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} missing in {v}"))
}

fn count_md(dir: &Path) -> u64 {
    let mut n = 0;
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            n += count_md(&p);
        } else if p.extension().is_some_and(|x| x == "md") {
            n += 1;
        }
    }
    n
}

/// Must-show (issue #5): index the test workspace twice — the second run re-embeds nothing;
/// after editing one file only that file's chunks change (and only they are embedded, each
/// long one in windows: issue 20).
#[test]
fn index_is_incremental_by_content_hash() {
    let llm = FakeLlm::spawn(Wire::Anthropic);
    let embed = FakeEmbed::spawn();
    let d = memory_daemon(&llm, Some(&embed), "");
    let files = 1 + count_md(&d.workspace().join("memory"));
    assert!(files >= 50, "the fixture has {files} notes");

    let first = index(&d);
    assert_eq!(n(&first, "files_seen"), files, "{first}");
    assert_eq!(n(&first, "files_changed"), files);
    let chunks = n(&first, "chunks_added");
    assert!(chunks >= files, "{first}");
    // Every chunk once; a chunk longer than one window (issue 20) as several inputs, none
    // longer than a window unless it is a single line.
    assert_eq!(n(&first, "embedded"), chunks, "{first}");
    let inputs = embed.inputs();
    assert!(inputs.len() as u64 > chunks, "the long notes are windowed");
    let window = agentd::memory::chunk::WINDOW_CHARS;
    assert!(
        inputs
            .iter()
            .all(|t| t.chars().count() <= window || t.lines().count() <= 2),
        "an input is longer than a window"
    );
    assert!(first["embed_error"].is_null(), "{first}");
    let requests = embed.requests();
    assert!(requests >= 2, "batched: {requests} request(s)");

    let second = index(&d);
    assert_eq!(n(&second, "files_unchanged"), files, "{second}");
    assert_eq!(n(&second, "files_changed"), 0);
    assert_eq!(n(&second, "chunks_added") + n(&second, "chunks_removed"), 0);
    assert_eq!(n(&second, "embedded"), 0);
    assert_eq!(
        embed.requests(),
        requests,
        "the second run called the embeddings server"
    );

    // Edit one file: a new paragraph at its end.
    let edited = d.workspace().join("memory/recipes/sourdough.md");
    let mut text = std::fs::read_to_string(&edited).unwrap();
    text.push_str("\nNew note: feed the starter twice a day in summer; zephyrine flour works.\n");
    std::fs::write(&edited, text).unwrap();
    let before = embed.inputs().len();
    let third = index(&d);
    assert_eq!(n(&third, "files_changed"), 1, "{third}");
    assert_eq!(n(&third, "files_unchanged"), files - 1);
    let added = n(&third, "chunks_added");
    assert!(
        added >= 1 && n(&third, "chunks_removed") == added,
        "{third}"
    );
    let new_inputs = &embed.inputs()[before..];
    assert_eq!(
        n(&third, "embedded"),
        added,
        "only the changed chunks are embedded"
    );
    assert!(new_inputs.len() as u64 >= added, "{new_inputs:?}");
    assert!(
        new_inputs
            .iter()
            .all(|t| t.starts_with("memory/recipes/sourdough\n")),
        "{new_inputs:?}"
    );
    assert!(new_inputs.iter().any(|t| t.contains("zephyrine")));

    // A removed file leaves the index.
    std::fs::remove_file(d.workspace().join("memory/recipes/zwetschgenkuchen.md")).unwrap();
    let fourth = index(&d);
    assert_eq!(n(&fourth, "files_removed"), 1, "{fourth}");
    assert_eq!(n(&fourth, "embedded"), 0);

    // --status shows the counts.
    let out = agentd(&d, &["index", "--status"]);
    let status = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{status}");
    assert!(
        status.contains(&format!("files           {}", files - 1)),
        "{status}"
    );
    assert!(
        status.contains("(fake-embed; 0 text(s) waiting)"),
        "{status}"
    );
    assert!(status.contains("index run       idle"), "{status}");
}

/// Without an answer from the embeddings server the full-text index is still complete, the
/// command fails with a clear message, and the next run embeds what is missing.
#[test]
fn a_failed_embedding_run_keeps_the_full_text_index_and_resumes() {
    let llm = FakeLlm::spawn(Wire::Anthropic);
    let embed = FakeEmbed::spawn();
    let d = memory_daemon(&llm, Some(&embed), "");
    embed.fail_next(1000, 503);
    let out = agentd(&d, &["index"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("embeddings"), "{stderr}");
    assert!(stderr.contains("503"), "{stderr}");
    assert!(stderr.contains("run `agentd index` again"), "{stderr}");
    assert!(embed.inputs().is_empty());

    let status = agentd(&d, &["index", "--status", "--json"]);
    let v: Value = serde_json::from_slice(&status.stdout).unwrap();
    assert!(v["status"]["chunks"].as_u64().unwrap() > 0, "{v}");
    assert_eq!(v["status"]["embedded_chunks"], 0, "{v}");
    let waiting = v["unembedded_texts"].as_u64().unwrap();
    assert!(waiting > 0);

    embed.fail_next(0, 200);
    let r = index(&d);
    assert_eq!(n(&r, "files_changed"), 0, "{r}");
    assert_eq!(n(&r, "embedded"), waiting);
}

/// Unit-free errors: memory disabled, and a bad glob, are reported with the key to fix.
#[test]
fn index_reports_configuration_problems() {
    let llm = FakeLlm::spawn(Wire::Anthropic);
    let d = memory_daemon(&llm, None, "\n[memory]\nenabled = false\n");
    let out = agentd(&d, &["index"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("[memory] enabled = false"));

    let bad = format!(
        "{}\n[memory.indexer]\ninclude = [\"../secrets/*.md\"]\n",
        agentd_toml("fake")
    );
    let d = TestDaemon::new(
        &bad,
        &[("fake", &provider_toml("anthropic", &llm.base_url()))],
    );
    let out = agentd(&d, &["index"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("memory.indexer.include"), "{stderr}");
}

/// Send `text` from alice and wait for its reply, then for the fake model to have seen
/// `requests` requests in all; returns them.
pub fn ask(d: &TestDaemon, llm: &FakeLlm, text: &str, requests: usize) -> Vec<Value> {
    let out = d.agent_send(&["-m", text, "--from", "alice", "--wait", "30"]);
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        d.log()
    );
    llm.wait_for_requests(requests, Duration::from_secs(20))
        .await_blocking()
}

/// The last tool result's text in a request (Anthropic wire).
pub fn last_tool_result(body: &Value) -> String {
    let msgs = body["messages"].as_array().unwrap();
    for m in msgs.iter().rev() {
        for b in m["content"].as_array().into_iter().flatten() {
            if b["type"] == "tool_result" {
                return match &b["content"] {
                    Value::String(s) => s.clone(),
                    Value::Array(parts) => parts
                        .iter()
                        .filter_map(|p| p["text"].as_str())
                        .collect::<Vec<_>>()
                        .join(""),
                    other => other.to_string(),
                };
            }
        }
    }
    String::new()
}

/// The memory tools in a running daemon, hybrid search, alias resolution, supersede and
/// forget, commitments, and recall in the next message's dynamic context.
#[test]
fn tools_and_recall_in_the_daemon() {
    let llm = FakeLlm::spawn(Wire::Anthropic);
    let embed = FakeEmbed::spawn();
    let mut d = memory_daemon(&llm, Some(&embed), "");
    index(&d);
    d.start();

    let call = |name: &str, args: Value| Reply::ToolCalls {
        text: None,
        calls: vec![(format!("c-{name}"), name.to_string(), args)],
        usage: Default::default(),
    };
    llm.push(call(
        "memory_write",
        json!({"entity": "Anna Schmidt", "attribute": "birthday", "value": "3 May", "aliases": ["Mum"]}),
    ));
    llm.push(call(
        "memory_write",
        json!({"entity": "mum", "attribute": "birthday", "value": "4 May"}),
    ));
    llm.push(call(
        "memory_search",
        json!({"query": "when is Mum's birthday?"}),
    ));
    llm.push(call(
        "memory_get",
        json!({"entity": "Mum", "history": true}),
    ));
    llm.push(call(
        "commitment_update",
        json!({"description": "Order the birthday cake", "owner": "agent", "due": "2026-05-01"}),
    ));
    llm.push(call(
        "memory_search",
        json!({"query": "E18 error drain pump blocked"}),
    ));
    llm.push(call(
        "memory_get",
        json!({"path": "memory/home/washing-machine.md", "from": 1, "lines": 3}),
    ));
    llm.push(Reply::text("noted"));
    let reqs = ask(&d, &llm, "Mum's birthday is on 4 May, not 3 May", 8);
    let result = |i: usize| last_tool_result(&reqs[i]);
    assert!(
        result(1).contains("Saved fact #1: Anna Schmidt · birthday: 3 May"),
        "{}",
        result(1)
    );
    assert!(
        result(1).contains("Alias \"Mum\" → Anna Schmidt"),
        "{}",
        result(1)
    );
    assert!(
        result(2).contains("supersedes #1: 3 May"),
        "alias resolved and superseded: {}",
        result(2)
    );
    let search = result(3);
    assert!(search.contains("hybrid"), "{search}");
    let facts = section(&search, "Facts:");
    assert!(facts.contains("Anna Schmidt · birthday: 4 May"), "{search}");
    assert!(
        !facts.contains("3 May"),
        "superseded values are not current: {search}"
    );
    let history = result(4);
    assert!(
        history.contains("3 May") && history.contains("superseded by #2"),
        "{history}"
    );
    assert!(
        result(5).contains("Recorded commitment #1"),
        "{}",
        result(5)
    );
    let exact = result(6);
    assert!(exact.contains("memory/home/washing-machine.md"), "{exact}");
    let lines = result(7);
    assert!(lines.contains("     1\t"), "{lines}");
    assert!(lines.contains("lines 1-3 of"), "{lines}");

    // The next message recalls the fact and the open commitment in its dynamic context.
    llm.push(Reply::text("it is on 4 May"));
    let reqs = ask(&d, &llm, "remind me, when is Mum's birthday?", 9);
    let turn = last_user_text(&reqs[8]);
    let recall = turn
        .split("<memory-recall>")
        .nth(1)
        .and_then(|r| r.split("</memory-recall>").next())
        .unwrap_or_else(|| panic!("no recall in {turn}"));
    let facts = section(recall, "Known facts:");
    assert!(facts.contains("Anna Schmidt · birthday: 4 May"), "{recall}");
    assert!(!facts.contains("3 May"), "{recall}");
    assert!(
        section(recall, "Open commitments:").contains("Order the birthday cake"),
        "{recall}"
    );
    // Recall sits in the user turn, never in the system prompt.
    assert!(!reqs[8]["system"].to_string().contains("memory-recall"));

    // Forget: the fact leaves search; the embedding calls were billed.
    llm.push(call(
        "memory_forget",
        json!({"entity": "Anna Schmidt", "attribute": "birthday"}),
    ));
    llm.push(call("memory_search", json!({"query": "Mum birthday"})));
    llm.push(Reply::text("forgotten"));
    let reqs = ask(&d, &llm, "forget her birthday", 12);
    assert!(
        last_tool_result(&reqs[10]).contains("Forgot 1 fact(s)"),
        "{}",
        last_tool_result(&reqs[10])
    );
    let after = last_tool_result(&reqs[11]);
    assert!(!section(&after, "Facts:").contains("4 May"), "{after}");
    let cost = d.agent_send(&["--cost", "all", "--json"]);
    let cost = String::from_utf8_lossy(&cost.stdout);
    assert!(
        cost.contains("fake-embed"),
        "embedding calls recorded: {cost}"
    );

    // An alias may not take the name of an entity with facts; the model is told why.
    llm.push(call(
        "memory_write",
        json!({"entity": "Bob", "attribute": "employer", "value": "ACME"}),
    ));
    llm.push(call(
        "memory_write",
        json!({"entity": "Carl", "attribute": "city", "value": "Rome", "aliases": ["bob"]}),
    ));
    llm.push(Reply::text("ok"));
    let reqs = ask(&d, &llm, "Bob works at ACME; Carl lives in Rome", 15);
    let refused = last_tool_result(&reqs[14]);
    assert!(
        refused.contains("Alias refused") && refused.contains("\"Bob\""),
        "{refused}"
    );
    assert!(d.sigterm().success());
}

/// An embeddings server that fails costs one request, not one per search: recall and
/// `memory_search` fall back to full text at once and say so, and vectors are skipped for a
/// while after the failure.
#[test]
fn a_failing_embeddings_server_degrades_search_to_full_text() {
    let llm = FakeLlm::spawn(Wire::Anthropic);
    let embed = FakeEmbed::spawn();
    let mut d = memory_daemon(&llm, Some(&embed), "");
    index(&d);
    d.start();
    embed.fail_next(1000, 500);
    let before = embed.requests();
    let search = |id: &str| Reply::ToolCalls {
        text: None,
        calls: vec![(
            id.to_string(),
            "memory_search".into(),
            json!({"query": "E18 error drain pump"}),
        )],
        usage: Default::default(),
    };
    llm.push(search("s1"));
    llm.push(search("s2"));
    llm.push(Reply::text("done"));
    let out = d.agent_send(&["-m", "what did the washing machine show?", "--wait", "30"]);
    assert!(out.status.success(), "{}", d.log());
    let reqs = llm
        .wait_for_requests(3, Duration::from_secs(20))
        .await_blocking();
    for r in &reqs[1..3] {
        let result = last_tool_result(r);
        assert!(result.contains("Memory search (full text)"), "{result}");
        assert!(result.contains("vectors unavailable"), "{result}");
        assert!(
            result.contains("memory/home/washing-machine.md"),
            "{result}"
        );
    }
    assert_eq!(
        embed.requests(),
        before + 1,
        "one failed query embedding (the recall), then none"
    );
    assert!(d.sigterm().success());
}

/// A damaged memory.db does not keep the daemon from answering: memory is off for that run,
/// the log says why, and `agentd doctor` fails on it.
#[test]
fn a_damaged_memory_db_turns_memory_off_not_the_daemon() {
    let llm = FakeLlm::spawn(Wire::Anthropic);
    let mut d = memory_daemon(&llm, None, "");
    std::fs::create_dir_all(&d.state_dir).unwrap();
    std::fs::write(d.state_dir.join("memory.db"), vec![0x5a; 8192]).unwrap();
    d.start();
    let out = d.agent_send(&["-m", "hello", "--wait", "30"]);
    assert!(out.status.success(), "{}", d.log());
    assert!(
        d.log().contains("long-term memory is off for this run"),
        "{}",
        d.log()
    );
    let tools = llm.requests()[0]["tools"].to_string();
    assert!(!tools.contains("memory_search"), "{tools}");
    let doctor = agentd(&d, &["doctor"]);
    let table = String::from_utf8_lossy(&doctor.stdout);
    assert!(table.contains("FAIL  memory.db"), "{table}");
    assert!(d.sigterm().success());
}

const CONSOLIDATION_MARK: &str = "You maintain the long-term memory";

/// Whether `body` is a consolidation call (its system prompt).
pub fn is_consolidation(body: &Value) -> bool {
    body["system"].to_string().contains(CONSOLIDATION_MARK)
}

/// `agentd consolidate`: facts extracted from a session's trail once (the watermark), with a
/// `consolidation` cost row; a second run sends nothing; later messages are picked up.
#[test]
fn consolidate_extracts_each_message_once() {
    let llm = FakeLlm::spawn(Wire::Anthropic);
    llm.set_responder(|body| {
        if !is_consolidation(body) {
            return Some(Reply::text("ok"));
        }
        let input = last_user_text(body);
        let mut facts = Vec::new();
        if input.contains("my sister Clara") {
            facts.push(json!({"entity": "Clara", "attribute": "relation", "value": "the user's sister", "confidence": 0.95}));
        }
        if input.contains("Clara moved to Hamburg") {
            facts.push(json!({"entity": "Clara", "attribute": "city", "value": "Hamburg", "confidence": 0.9}));
        }
        facts.push(json!({"entity": "Clara", "attribute": "mood", "value": "unsure", "confidence": 0.1}));
        Some(Reply::text(
            json!({"facts": facts, "episodes": [{"summary": format!("Talked about Clara ({} chars)", input.len())}]}).to_string(),
        ))
    });
    let mut d = memory_daemon(&llm, None, "\n[memory.consolidation]\nmin_messages = 4\n");
    d.start();
    for text in ["my sister Clara visits next week", "she likes jazz"] {
        let out = d.agent_send(&["-m", text, "--from", "bob", "--wait", "30"]);
        assert!(out.status.success());
    }

    let run = |d: &TestDaemon| {
        let out = agentd(d, &["consolidate", "--json"]);
        assert!(
            out.status.success(),
            "{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        v
    };
    // Session calls only: the workspace notes are consolidated too, in their own calls.
    let is_session_call =
        |b: &Value| is_consolidation(b) && !last_user_text(b).contains("<note path=");
    let calls = || llm.requests().iter().filter(|b| is_session_call(b)).count();
    let note_calls = || {
        llm.requests()
            .iter()
            .filter(|b| is_consolidation(b) && last_user_text(b).contains("<note path="))
            .count()
    };
    let first = run(&d);
    let outcome = &first["sessions"][0][1];
    assert_eq!(outcome["outcome"], "done", "{first}");
    assert_eq!(
        outcome["applied"]["facts_new"], 1,
        "low confidence dropped: {first}"
    );
    assert_eq!(calls(), 1);
    // The fixture's 228 notes share a handful of calls, and are not read again unchanged.
    let notes = note_calls();
    assert!((1..=12).contains(&notes), "{notes} calls for the notes");
    assert_eq!(
        first["files"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b[0].as_array().unwrap().len())
            .sum::<usize>(),
        1 + count_md(&d.workspace().join("memory")) as usize
    );

    let second = run(&d);
    assert_eq!(second["sessions"][0][1]["outcome"], "waiting", "{second}");
    assert_eq!(calls(), 1, "nothing sent twice");
    assert_eq!(
        note_calls(),
        notes,
        "unchanged notes are not consolidated again"
    );

    // Two more messages are fewer than min_messages = 4 new ones; four are enough.
    for text in ["Clara moved to Hamburg", "ok", "thanks", "bye"] {
        assert!(
            d.agent_send(&["-m", text, "--from", "bob", "--wait", "30"])
                .status
                .success()
        );
    }
    let third = run(&d);
    assert_eq!(third["sessions"][0][1]["outcome"], "done", "{third}");
    assert_eq!(
        third["sessions"][0][1]["applied"]["facts_new"], 1,
        "{third}"
    );
    assert_eq!(calls(), 2);
    let sent = llm
        .requests()
        .into_iter()
        .filter(|b| is_session_call(b))
        .nth(1)
        .unwrap();
    let input = last_user_text(&sent);
    assert!(input.contains("Clara moved to Hamburg"), "{input}");
    assert!(
        !input.contains("she likes jazz"),
        "already consolidated: {input}"
    );
    assert!(!input.contains("<agentd-context>"), "{input}");
    assert!(input.contains("Known entities: Clara"), "{input}");

    let status = agentd(&d, &["index", "--status", "--json"]);
    let v: Value = serde_json::from_slice(&status.stdout).unwrap();
    // Clara's two facts; the note calls' answers carry only the dropped low-confidence fact.
    assert_eq!(v["status"]["facts"], 2, "{v}");
    let cost =
        String::from_utf8_lossy(&d.agent_send(&["--cost", "all", "--json"]).stdout).to_string();
    assert!(cost.contains("fake-model"), "{cost}");
    let types = crate::compaction::cost_types(&d.state_dir);
    assert_eq!(
        types.iter().filter(|t| *t == "consolidation").count(),
        2 + notes,
        "{types:?}"
    );
    assert!(d.sigterm().success());
}

/// A reset closes the session; with consolidation enabled the daemon consolidates it from
/// the archive in the background.
#[test]
fn a_closed_session_is_consolidated() {
    let llm = FakeLlm::spawn(Wire::Anthropic);
    llm.set_responder(|body| {
        is_consolidation(body).then(|| {
            Reply::text(r#"{"facts": [{"entity": "Dora", "attribute": "pet", "value": "a cat named Mio"}]}"#)
        })
    });
    let mut d = memory_daemon(
        &llm,
        None,
        "\n[memory.consolidation]\nenabled = true\nmin_messages = 2\n",
    );
    d.start();
    assert!(
        d.agent_send(&[
            "-m",
            "Dora has a cat named Mio",
            "--from",
            "dora",
            "--wait",
            "30"
        ])
        .status
        .success()
    );
    assert!(d.agent_send(&["--reset", "dora"]).status.success());
    wait_until(
        Duration::from_secs(20),
        "the closed session consolidated",
        || {
            d.log()
                .contains("closed session consolidated")
                .then_some(())
        },
    );
    assert!(llm.requests().iter().any(is_consolidation));
    assert!(d.sigterm().success());
    let status = agentd(&d, &["index", "--status", "--json"]);
    let v: Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(v["status"]["facts"], 1, "{v}");
}

/// The lines under `heading` up to the next blank line or heading (a line ending in ':').
fn section(text: &str, heading: &str) -> String {
    let Some(start) = text.find(heading) else {
        return String::new();
    };
    text[start + heading.len()..]
        .lines()
        .skip(1)
        .take_while(|l| !l.trim().is_empty() && !l.ends_with(':'))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Blocking wait on a fake's request count from a `#[test]` function.
trait Blocking {
    type Out;
    fn await_blocking(self) -> Self::Out;
}

impl<F: std::future::Future> Blocking for F {
    type Out = F::Output;
    fn await_blocking(self) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(self)
    }
}

/// The retrieval test set in CI: recall@5 per class, full text (the figures this build gives
/// without an embeddings model) and hybrid with the deterministic fake (a wiring check: fused
/// results, no fallback). The quality comparison with a real model is
/// `scripts/retrieval-eval.sh` (docs/memory.md, "Retrieval quality").
#[test]
fn retrieval_recall_at_5() {
    use agentd::memory::eval::{EvalReport, load_queries};
    use agentd::memory::{Memory, SearchMode};

    let embed = FakeEmbed::spawn();
    let tmp = tempfile::tempdir().unwrap();
    let toml = format!(
        "[agent]\nname = \"eval\"\nworkspace = {:?}\ntimezone = \"UTC\"\n\n[providers]\nload = []\n\n[models.primary]\ntype = \"openai\"\nbase_url = \"http://127.0.0.1:9/v1\"\nmodel = \"unused\"\n\n[paths]\nstate_dir = {:?}\n\n[logging]\nfile = false\n{}",
        fixture_dir().join("workspace"),
        tmp.path().join("state"),
        memory_toml(Some(&embed), "")
    );
    let config = tmp.path().join("agentd.toml");
    std::fs::write(&config, toml).unwrap();
    let cfg = agentd::config::load(&config).unwrap();
    std::fs::create_dir_all(&cfg.paths.state_dir).unwrap();
    let queries = load_queries(&fixture_dir().join("queries.json")).unwrap();
    assert!(queries.len() >= 50);

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (fts, hybrid): (EvalReport, EvalReport) = rt.block_on(async {
        // The embedding calls go through the provider gateway, billed to this state's ledger.
        let db = agentd::store::Db::open(&cfg.paths.state_dir.join("agentd.db")).unwrap();
        let ledger = agentd::cost::Ledger::new(db, &cfg);
        let metrics = std::sync::Arc::new(agentd::metrics::Metrics::new());
        let gateway = std::sync::Arc::new(agentd::gateway::Gateway::new(&cfg, ledger, metrics));
        let memory = Memory::open(&cfg, gateway).unwrap();
        let r = memory
            .index(&mut agentd::memory::index::NoProgress)
            .await
            .unwrap();
        assert!(r.files_seen >= 200 && r.embed_error.is_none(), "{r:?}");
        (
            memory
                .evaluate(&queries, 5, SearchMode::FullText)
                .await
                .unwrap(),
            memory
                .evaluate(&queries, 5, SearchMode::Hybrid)
                .await
                .unwrap(),
        )
    });
    for (label, r) in [("full text", &fts), ("hybrid (fake vectors)", &hybrid)] {
        let line: Vec<String> = r
            .classes
            .iter()
            .map(|(c, s)| format!("{c} {}/{}", s.hits, s.total))
            .collect();
        eprintln!("recall@5 {label}: {}", line.join(", "));
    }
    let recall = |r: &EvalReport, class: &str| r.classes[class].recall();
    // Full text finds the literal terms and most questions; paraphrases need vectors.
    assert!(recall(&fts, "exact") >= 0.95, "{fts:?}");
    assert!(recall(&fts, "question") >= 0.85, "{fts:?}");
    assert_eq!(hybrid.fell_back, 0, "every hybrid query was embedded");
    assert!(recall(&hybrid, "exact") >= 0.9, "{hybrid:?}");
}
