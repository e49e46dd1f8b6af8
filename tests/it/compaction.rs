//! Compaction against the real daemon (SPEC §15): a 200-message conversation over HTTP `/chat`
//! with a small `threshold_tokens`, answered by the fake LLM (Anthropic wire) whose usage
//! reports about one token per four bytes of the request, so several compactions happen. One
//! stretch of summary calls fails with 500s: the session keeps answering and compaction is
//! retried later. Memory consolidation runs before each compaction, so a fact from the first
//! message is still found with `memory_search` at the end.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::daemon::TestDaemon;
use crate::support::e2e::{agentd_toml, provider_toml};
use crate::support::fake_llm::{FakeLlm, Reply, Usage, Wire, last_user_text};
use crate::support::{free_port, wait_until};

const MESSAGES: usize = 200;
/// Messages from which the summary calls fail (until one failure was seen and two more
/// messages were answered).
const FAIL_FROM: usize = 110;
const PROMPT_MARK: &str = "COMPACTION-INSTRUCTIONS";
const SCHEMA: &str = include_str!("../fixtures/specs/anthropic-messages-request.schema.json");

fn is_summary_request(body: &Value) -> bool {
    body["system"][0]["text"]
        .as_str()
        .is_some_and(|t| t.starts_with(PROMPT_MARK))
}

/// A memory consolidation call (SPEC §13), made before each compaction when enabled.
fn is_consolidation_request(body: &Value) -> bool {
    body["system"][0]["text"]
        .as_str()
        .is_some_and(|t| t.starts_with("You maintain the long-term memory"))
}

/// The early fact of the long conversation, and the call that looks it up at the end.
const EARLY_FACT: &str = "remember this: the vault code is 4417";
const SEARCH_CALL: &str = "call-memory-search";

/// `N` from the `MSG-N-END` marker of the newest user text.
fn message_number(body: &Value) -> Option<usize> {
    let text = last_user_text(body);
    let start = text.rfind("MSG-")? + 4;
    let end = start + text[start..].find("-END")?;
    text[start..end].parse().ok()
}

fn last_message_has_tool_result(body: &Value) -> bool {
    body["messages"]
        .as_array()
        .and_then(|m| m.last())
        .and_then(|m| m["content"].as_array())
        .is_some_and(|blocks| blocks.iter().any(|b| b["type"] == "tool_result"))
}

/// Realistic usage: about one token per four bytes of the request body.
fn usage_for(body: &Value, output: u64) -> Usage {
    Usage::new(body.to_string().len() as u64 / 4, output, 0, 0)
}

/// Structural validity of an Anthropic request: roles alternate starting with user, every
/// `tool_use` is answered by a `tool_result` in the next message and every `tool_result`
/// answers a `tool_use` of the message before it.
fn check_pairs(i: usize, body: &Value) {
    let wire = body["messages"].as_array().expect("messages");
    for (k, m) in wire.iter().enumerate() {
        let want = if k % 2 == 0 { "user" } else { "assistant" };
        assert_eq!(m["role"], want, "request {i}: wire message {k}");
        let blocks = m["content"].as_array().expect("content blocks");
        let ids = |t: &str, key: &str, blocks: &[Value]| -> HashSet<String> {
            blocks
                .iter()
                .filter(|b| b["type"] == t)
                .filter_map(|b| b[key].as_str().map(str::to_string))
                .collect()
        };
        let uses = ids("tool_use", "id", blocks);
        if !uses.is_empty() {
            let next = wire
                .get(k + 1)
                .and_then(|n| n["content"].as_array())
                .unwrap_or_else(|| panic!("request {i}: tool_use in the last message {k}"));
            assert_eq!(
                ids("tool_result", "tool_use_id", next),
                uses,
                "request {i}: results after message {k}"
            );
        }
        let results = ids("tool_result", "tool_use_id", blocks);
        if !results.is_empty() {
            let prev = k
                .checked_sub(1)
                .and_then(|p| wire[p]["content"].as_array())
                .unwrap_or_else(|| panic!("request {i}: tool_result in the first message"));
            assert_eq!(
                ids("tool_use", "id", prev),
                results,
                "request {i}: orphaned results in message {k}"
            );
        }
    }
}

/// The request without its cache breakpoints (they move from call to call by design).
fn strip_cache_control(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| *k != "cache_control")
                .map(|(k, v)| (k.clone(), strip_cache_control(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(strip_cache_control).collect()),
        other => other.clone(),
    }
}

pub fn cost_types(state_dir: &std::path::Path) -> Vec<String> {
    let conn = rusqlite::Connection::open(state_dir.join("agentd.db")).unwrap();
    let mut st = conn
        .prepare("SELECT call_type FROM costs ORDER BY id")
        .unwrap();
    st.query_map([], |r| r.get::<_, String>(0))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

fn compactions(trail: &[Value]) -> Vec<Value> {
    trail
        .iter()
        .filter(|l| l["type"] == "compaction")
        .cloned()
        .collect()
}

#[test]
fn long_conversation_compacts_keeps_identity_and_survives_failed_summaries() {
    let started = Instant::now();
    let fake = FakeLlm::spawn(Wire::Anthropic);
    let fail = Arc::new(AtomicBool::new(false));
    let failed = Arc::new(AtomicUsize::new(0));
    let summaries = Arc::new(AtomicUsize::new(0));
    {
        let (fail, failed, summaries) = (fail.clone(), failed.clone(), summaries.clone());
        fake.set_responder(move |body| {
            if is_consolidation_request(body) {
                let facts = if last_user_text(body).contains(EARLY_FACT) {
                    json!([{"entity": "vault", "attribute": "code", "value": "4417", "confidence": 0.95}])
                } else {
                    json!([])
                };
                return Some(Reply::Text {
                    text: json!({ "facts": facts }).to_string(),
                    usage: usage_for(body, 30),
                });
            }
            if is_summary_request(body) {
                if fail.load(Ordering::SeqCst) {
                    failed.fetch_add(1, Ordering::SeqCst);
                    return Some(Reply::error(500, "summary backend down"));
                }
                let k = summaries.fetch_add(1, Ordering::SeqCst) + 1;
                return Some(Reply::Text {
                    text: format!("SUMMARY-{k}: the user sent numbered messages; all answered."),
                    usage: usage_for(body, 40),
                });
            }
            let n = message_number(body)?;
            if n == MESSAGES - 1 && !last_message_has_tool_result(body) {
                return Some(Reply::ToolCalls {
                    text: None,
                    calls: vec![(
                        SEARCH_CALL.into(),
                        "memory_search".into(),
                        json!({"query": "what is the vault code?"}),
                    )],
                    usage: usage_for(body, 20),
                });
            }
            if n % 10 == 3 && !last_message_has_tool_result(body) {
                return Some(Reply::ToolCalls {
                    text: None,
                    calls: vec![(format!("call-{n}"), "session_status".into(), json!({}))],
                    usage: usage_for(body, 20),
                });
            }
            Some(Reply::Text {
                text: format!("reply {n} {}", "r".repeat(300)),
                usage: usage_for(body, 80),
            })
        });
    }

    let port = free_port();
    // Memory consolidation runs before each compaction; memory_search finds the early fact.
    let config = format!(
        "{}\n[http]\nenabled = true\nport = {port}\nrate_limit = 100000\n\n[behavior.compaction]\nthreshold_tokens = 6000\nprompt = \"{PROMPT_MARK}: summarise the conversation.\"\n\n[tools]\nenabled = [\"session_status\", \"memory_search\"]\n\n[memory.consolidation]\nenabled = true\nmin_messages = 2\n",
        agentd_toml("fake")
    );
    let mut d = TestDaemon::new(
        &config,
        &[("fake", &provider_toml("anthropic", &fake.base_url()))],
    );
    d.set_env("AGENTD_HTTP_TOKEN", "tok");
    d.start();
    let base = format!("http://127.0.0.1:{port}");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = reqwest::Client::new();
    let chat = |n: usize| -> Value {
        let fact = if n == 0 { EARLY_FACT } else { "" };
        let body = json!({
            "message": format!("MSG-{n}-END {fact} {}", "u".repeat(300)),
            "sender": "long",
        });
        rt.block_on(async {
            let r = client
                .post(format!("{base}/api/v1/chat"))
                .bearer_auth("tok")
                .json(&body)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200, "message {n}");
            r.json().await.unwrap()
        })
    };

    // (message index when the failure stretch ended, compactions in the trail then)
    let mut recovered: Option<(usize, usize)> = None;
    let mut first_failure_at: Option<usize> = None;
    for n in 0..MESSAGES {
        if n == FAIL_FROM {
            fail.store(true, Ordering::SeqCst);
        }
        let r = chat(n);
        let reply = r["reply"].as_str().unwrap_or_default();
        assert!(
            reply.starts_with(&format!("reply {n} ")),
            "message {n}: {r}\n{}",
            d.log()
        );
        if fail.load(Ordering::SeqCst) {
            if first_failure_at.is_none() && failed.load(Ordering::SeqCst) > 0 {
                first_failure_at = Some(n);
            }
            if first_failure_at.is_some_and(|f| n >= f + 2) {
                fail.store(false, Ordering::SeqCst);
                recovered = Some((n, compactions(&d.trail("http-long")).len()));
            }
        }
    }
    let (recovered_at, compactions_then) =
        recovered.expect("summary calls failed at least once during the failure stretch");

    // Compactions are recorded in the trail and the cost ledger, one row each.
    let trail = wait_until(Duration::from_secs(30), "costs match the trail", || {
        let trail = d.trail("http-long");
        let costs = cost_types(&d.state_dir);
        let n = costs.iter().filter(|t| *t == "compaction").count();
        (n == compactions(&trail).len()).then_some(trail)
    });
    let done = compactions(&trail);
    assert!(done.len() >= 4, "only {} compactions", done.len());
    for c in &done {
        assert!(c["removed"].as_u64().unwrap() > 0, "{c}");
        assert!(c["summary"].as_str().unwrap().contains("SUMMARY-"), "{c}");
    }
    // Retried after the failures, and the failures were bounded (one attempt per message,
    // each with the configured two retries).
    assert!(
        done.len() > compactions_then,
        "no compaction after the failure stretch ended at message {recovered_at}"
    );
    let failed = failed.load(Ordering::SeqCst);
    // A message's compaction runs after its reply has gone out, so the compaction of the
    // message just before the stretch may start after the switch too: one more message's
    // attempts count.
    let stretch = recovered_at + 1 - FAIL_FROM + 1;
    assert!(
        failed >= 3 && failed <= 3 * stretch,
        "{failed} failed summary calls over {stretch} messages"
    );
    d.wait_log("compaction failed");

    // Every request is valid against the published schema and structurally; the stable and
    // semi_stable system blocks of every chat request are byte-identical.
    let schema: Value = serde_json::from_str(SCHEMA).unwrap();
    let validator = jsonschema::options()
        .with_draft(jsonschema::Draft::Draft202012)
        .build(&schema)
        .unwrap();
    let requests = fake.requests();
    let chats: Vec<(usize, &Value)> = requests
        .iter()
        .enumerate()
        .filter(|(_, b)| !is_summary_request(b) && !is_consolidation_request(b))
        .collect();
    assert!(chats.len() >= MESSAGES, "{} chat requests", chats.len());
    let identity = &chats[0].1["system"];
    assert!(identity.as_array().unwrap().len() >= 2, "{identity}");
    let mut notices = 0;
    let mut noticed = std::collections::BTreeSet::new();
    for (i, body) in &requests.iter().enumerate().collect::<Vec<_>>() {
        let errors: Vec<String> = validator
            .iter_errors(body)
            .map(|e| format!("{} at {}", e, e.instance_path()))
            .take(3)
            .collect();
        assert!(errors.is_empty(), "request {i} invalid: {errors:?}");
        if is_summary_request(body) || is_consolidation_request(body) {
            assert!(body.get("tools").is_none(), "summary request {i} has tools");
            continue;
        }
        check_pairs(*i, body);
        assert_eq!(body["system"][0], identity[0], "request {i}: stable block");
        assert_eq!(
            body["system"][1], identity[1],
            "request {i}: semi_stable block"
        );
        // Counted per message: the calls of one message (a tool round) repeat its user turn.
        if last_user_text(body).contains("close to its compaction threshold")
            && noticed.insert(message_number(body))
        {
            notices += 1;
        }
    }
    // The 80 % notice is given, at most once per compaction cycle.
    assert!(
        notices >= 1 && notices <= done.len() + 1,
        "{notices} notices, {} compactions",
        done.len()
    );
    // Caching: between two chat calls with no summary call in between, the earlier request's
    // messages are a prefix of the later one's (cache markers aside).
    for w in chats.windows(2) {
        let ((a, ra), (b, rb)) = (w[0], w[1]);
        if b != a + 1 {
            continue;
        }
        let (ma, mb) = (
            strip_cache_control(&ra["messages"]),
            strip_cache_control(&rb["messages"]),
        );
        let (ma, mb) = (ma.as_array().unwrap(), mb.as_array().unwrap());
        assert!(
            mb.len() >= ma.len() && mb[..ma.len()] == ma[..],
            "request {b} does not extend request {a}"
        );
    }
    // After the first compaction a summary message leads every conversation.
    let first = chats.last().unwrap().1["messages"][0]["content"][0]["text"]
        .as_str()
        .unwrap();
    assert!(
        first.contains("Summary of the earlier conversation"),
        "{first}"
    );

    // The early fact: consolidated before it was summarised away, gone from the conversation
    // the model sees at the end, and found again with memory_search.
    let consolidations = requests
        .iter()
        .filter(|b| is_consolidation_request(b))
        .count();
    assert!(
        consolidations >= done.len(),
        "{consolidations} consolidations"
    );
    let (search_at, asked) = chats
        .iter()
        .rev()
        .find(|(_, b)| !last_message_has_tool_result(b))
        .expect("the last message's first request");
    assert!(
        !asked.to_string().contains("4417"),
        "request {search_at} still holds the early fact"
    );
    let answered = chats.last().unwrap().1;
    let found = answered["messages"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|m| m["content"].as_array().cloned().unwrap_or_default())
        .find(|b| b["type"] == "tool_result" && b["tool_use_id"] == SEARCH_CALL)
        .expect("the memory_search result");
    assert!(
        found.to_string().contains("vault · code: 4417"),
        "memory_search result: {found}"
    );

    eprintln!(
        "{} requests, {} compactions, {consolidations} consolidations, {failed} failed summary calls, {notices} notices, recovered at message {recovered_at}",
        requests.len(),
        done.len()
    );
    assert!(d.sigterm().success());
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "took {:?}",
        started.elapsed()
    );
}

/// The context-window guard: a request that would not fit `context_window - max_tokens` is
/// compacted before it is sent; one that cannot fit even then fails with a clear error and is
/// never sent.
#[test]
fn request_over_the_context_window_is_compacted_first_or_refused() {
    let fake = FakeLlm::spawn(Wire::Anthropic);
    fake.set_responder(|body| {
        if is_summary_request(body) {
            return Some(Reply::Text {
                text: "SUMMARY: earlier long messages.".into(),
                usage: usage_for(body, 10),
            });
        }
        Some(Reply::Text {
            text: format!("reply {}", message_number(body)?),
            usage: usage_for(body, 10),
        })
    });
    let port = free_port();
    // Threshold far away: only the guard compacts.
    let config = format!(
        "{}\n[http]\nenabled = true\nport = {port}\nrate_limit = 100000\n\n[behavior.compaction]\nthreshold_tokens = 1000000\nprompt = \"{PROMPT_MARK}: summarise.\"\n\n[tools]\nenabled = [\"session_status\"]\n",
        agentd_toml("fake")
    );
    let provider = provider_toml("anthropic", &fake.base_url()).replace(
        "max_tokens = 1024",
        "max_tokens = 1024\ncontext_window = 6000",
    );
    let mut d = TestDaemon::new(&config, &[("fake", &provider)]);
    d.set_env("AGENTD_HTTP_TOKEN", "tok");
    d.start();
    let base = format!("http://127.0.0.1:{port}");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = reqwest::Client::new();
    let chat = |n: usize, size: usize| -> (u16, Value) {
        let body = json!({"message": format!("MSG-{n}-END {}", "u".repeat(size)), "sender": "big"});
        rt.block_on(async {
            let r = client
                .post(format!("{base}/api/v1/chat"))
                .bearer_auth("tok")
                .json(&body)
                .send()
                .await
                .unwrap();
            (r.status().as_u16(), r.json().await.unwrap())
        })
    };

    // ~1,000 tokens per message: the fifth no longer fits 6000 - 1024 without compaction.
    for n in 0..8 {
        let (status, r) = chat(n, 4000);
        assert_eq!(status, 200, "message {n}: {r}\n{}", d.log());
        assert_eq!(r["reply"], format!("reply {n}"));
    }
    let trail = d.trail("http-big");
    assert!(
        !compactions(&trail).is_empty(),
        "no compaction by the guard"
    );
    let limit = 6000 - 1024;
    for (i, body) in fake.requests().iter().enumerate() {
        if !is_summary_request(body) {
            let estimate = body.to_string().len() / 4;
            assert!(
                estimate < limit + 500,
                "request {i}: about {estimate} tokens"
            );
            check_pairs(i, body);
        }
    }

    // A single message larger than the window cannot fit, compaction or not.
    let before = fake.requests().len();
    let (status, r) = chat(99, 40_000);
    assert_eq!(status, 500, "{r}");
    let error = r["error"].as_str().unwrap();
    assert!(
        error.contains("does not fit the context window of model 'primary'"),
        "{error}"
    );
    let sent_after: Vec<Value> = fake.requests()[before..].to_vec();
    assert!(
        sent_after.iter().all(is_summary_request),
        "the oversized request was sent"
    );
    // The session still answers.
    let (status, r) = chat(100, 100);
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["reply"], "reply 100");
    assert!(d.sigterm().success());
}
