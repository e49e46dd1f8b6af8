//! Cache efficiency: a scripted 20-message conversation with tool calls, run through the real
//! daemon against a fake Anthropic server that applies the documented prompt-caching rules,
//! and the conversation's cost at Sonnet-class prices with and without caching.
//!
//! The rules the fake applies (Anthropic's prompt-caching documentation):
//! - the prompt is the sequence tools → system → messages, cut into blocks (each tool, each
//!   system block, each content block; a string content is one block); a cache entry is a
//!   prefix ending at a block boundary, identified by everything before it (with
//!   `cache_control` markers stripped; a message boundary and `tool_choice`, which
//!   invalidates the message part, are part of the identity);
//! - entries are written only at `cache_control` breakpoints (at most 4), and only for
//!   prefixes of at least the minimum cacheable length (1024 tokens for Sonnet);
//! - a read looks back from each breakpoint over at most 20 block boundaries for the longest
//!   live entry; the longest hit over all breakpoints is read;
//! - `cache_read_input_tokens` = the hit; `cache_creation_input_tokens` = from the hit to the
//!   last cacheable breakpoint; `input_tokens` = the rest;
//! - entries live 5 minutes (`ttl: "1h"`: an hour) from their last write or read.
//!
//! The ideal is a client that could cache at every block boundary of every request: its read
//! for a request is the longest live prefix any earlier request had (same minimum and TTL).
//! Tokens are estimated at 4 characters per token plus 4 per block (the same estimate for the
//! actual and the ideal, so the ratio does not depend on it).
//!
//! Time is virtual: the bench sets the clock before each message (the gaps of a real
//! conversation, one of them longer than the TTL) and each call inside a message adds 3 s.

use std::collections::{HashMap, VecDeque};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex};

use anyhow::{Result, bail};
use serde_json::{Value, json};

use crate::client::{Chat, runtime};
use crate::fake_provider::{Answer, FakeProvider, Usage};
use crate::launch::{Daemon, Setup};
use crate::runs::Opts;

const MIN_CACHEABLE: u64 = 1024;
const LOOKBACK: usize = 20;
const TTL_5M: u64 = 300;
const TTL_1H: u64 = 3600;
const CALL_SECONDS: u64 = 3;

/// Sonnet-class prices, USD per million tokens.
const PRICE_IN: f64 = 3.0;
const PRICE_OUT: f64 = 15.0;
const PRICE_READ: f64 = 0.30;
const PRICE_WRITE: f64 = 3.75;

/// One block of the flattened prompt.
struct Block {
    /// Hash of everything up to and including this block.
    chain: u64,
    /// Tokens up to and including this block.
    cum: u64,
    /// `Some(ttl seconds)` when the block carries `cache_control`.
    breakpoint: Option<u64>,
}

fn tokens_of(v: &Value) -> u64 {
    let chars = match v {
        Value::String(s) => s.chars().count(),
        other => {
            let mut o = other.clone();
            if let Some(m) = o.as_object_mut() {
                m.remove("cache_control");
            }
            match (o.get("type").and_then(Value::as_str), &o) {
                (Some("text"), _) => o["text"].as_str().map_or(0, |s| s.chars().count()),
                (Some("tool_result"), _) => match &o["content"] {
                    Value::String(s) => s.chars().count(),
                    c => c.to_string().chars().count(),
                },
                _ => o.to_string().chars().count(),
            }
        }
    };
    (chars as u64).div_ceil(4) + 4
}

fn breakpoint_of(v: &Value) -> Option<u64> {
    let cc = v.get("cache_control")?;
    Some(match cc.get("ttl").and_then(Value::as_str) {
        Some("1h") => TTL_1H,
        _ => TTL_5M,
    })
}

fn canonical(v: &Value) -> String {
    let mut o = v.clone();
    if let Some(m) = o.as_object_mut() {
        m.remove("cache_control");
    }
    o.to_string()
}

/// tools → system → messages, as blocks with running hashes and token sums.
fn flatten(body: &Value) -> Vec<Block> {
    let mut out = Vec::new();
    let mut h = DefaultHasher::new();
    let mut cum = 0;
    let mut push = |h: &mut DefaultHasher, item: &Value, tag: &str, out: &mut Vec<Block>| {
        tag.hash(h);
        canonical(item).hash(h);
        cum += tokens_of(item);
        out.push(Block {
            chain: h.finish(),
            cum,
            breakpoint: breakpoint_of(item),
        });
    };
    for t in body["tools"].as_array().into_iter().flatten() {
        push(&mut h, t, "tool", &mut out);
    }
    match &body["system"] {
        Value::String(s) => push(&mut h, &json!(s), "system", &mut out),
        Value::Array(blocks) => {
            for b in blocks {
                push(&mut h, b, "system", &mut out);
            }
        }
        _ => {}
    }
    // tool_choice changes invalidate the message part of the cache.
    body["tool_choice"].to_string().hash(&mut h);
    for m in body["messages"].as_array().into_iter().flatten() {
        let role = m["role"].as_str().unwrap_or("?");
        let mut first = true;
        let blocks: Vec<Value> = match &m["content"] {
            Value::Array(b) => b.clone(),
            other => vec![other.clone()],
        };
        for b in &blocks {
            let tag = if first {
                format!("new-message:{role}")
            } else {
                role.to_string()
            };
            first = false;
            push(&mut h, b, &tag, &mut out);
        }
    }
    out
}

/// What the fake computed for one call.
#[derive(Clone, Copy, Debug, Default)]
pub struct CallUsage {
    pub prompt: u64,
    pub read: u64,
    pub write: u64,
    pub input: u64,
    pub ideal_read: u64,
    /// The part of `write` up to the last cacheable 1-hour breakpoint (priced as a 1-hour
    /// write; `bench cost`).
    pub write_1h: u64,
}

/// The cache state of the fake and of the ideal client.
#[derive(Default)]
pub struct Sim {
    pub now: u64,
    actual: HashMap<u64, u64>,
    ideal: HashMap<u64, u64>,
}

impl Sim {
    /// Applies the rules to one request at `self.now`.
    pub fn call(&mut self, body: &Value) -> CallUsage {
        let now = self.now;
        let blocks = flatten(body);
        let total = blocks.last().map_or(0, |b| b.cum);
        let live = |m: &HashMap<u64, u64>, k: u64| m.get(&k).is_some_and(|exp| *exp > now);

        // Actual: look back from each breakpoint.
        let bps: Vec<usize> = (0..blocks.len())
            .filter(|&i| blocks[i].breakpoint.is_some())
            .collect();
        let mut hit: Option<usize> = None;
        for &b in &bps {
            let lo = b.saturating_sub(LOOKBACK - 1);
            if let Some(j) = (lo..=b)
                .rev()
                .find(|&j| live(&self.actual, blocks[j].chain))
                && hit.is_none_or(|h| j > h)
            {
                hit = Some(j);
            }
        }
        let read = hit.map_or(0, |j| blocks[j].cum);
        if let Some(j) = hit {
            // A read refreshes the entry (with the longest TTL of the breakpoints covering it).
            let ttl = bps
                .iter()
                .filter(|&&b| b >= j)
                .filter_map(|&b| blocks[b].breakpoint)
                .max()
                .unwrap_or(TTL_5M);
            self.actual.insert(blocks[j].chain, now + ttl);
        }
        let mut last_cacheable = None;
        for &b in &bps {
            if blocks[b].cum >= MIN_CACHEABLE {
                let ttl = blocks[b].breakpoint.unwrap_or(TTL_5M);
                let e = self.actual.entry(blocks[b].chain).or_insert(0);
                *e = (*e).max(now + ttl);
                last_cacheable = Some(b);
            }
        }
        let write = last_cacheable.map_or(0, |b| blocks[b].cum.saturating_sub(read));
        let write_1h = bps
            .iter()
            .rev()
            .find(|&&b| blocks[b].breakpoint == Some(TTL_1H) && blocks[b].cum >= MIN_CACHEABLE)
            .map_or(0, |&b| blocks[b].cum.saturating_sub(read))
            .min(write);

        // Ideal: the longest live prefix at any boundary; every boundary cached.
        let ideal_read = (0..blocks.len())
            .rev()
            .find(|&j| live(&self.ideal, blocks[j].chain))
            .map_or(0, |j| blocks[j].cum);
        for b in &blocks {
            if b.cum >= MIN_CACHEABLE {
                self.ideal.insert(b.chain, now + TTL_5M);
            }
        }
        CallUsage {
            prompt: total,
            read,
            write,
            input: total - read - write,
            ideal_read,
            write_1h,
        }
    }
}

/// Deterministic pseudo-random numbers (splitmix64).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
}

const WORDS: &[&str] = &[
    "the",
    "agent",
    "keeps",
    "notes",
    "about",
    "projects",
    "deadlines",
    "and",
    "people",
    "it",
    "answers",
    "briefly",
    "prefers",
    "plain",
    "language",
    "checks",
    "calendar",
    "before",
    "scheduling",
    "anything",
    "server",
    "backup",
    "weekly",
    "report",
    "invoice",
    "garden",
    "travel",
    "train",
    "budget",
    "meeting",
    "draft",
    "review",
    "deploy",
    "monitor",
    "logs",
    "disk",
    "memory",
    "weather",
    "tomorrow",
    "morning",
    "evening",
    "family",
    "birthday",
    "reminder",
    "summary",
    "list",
    "priority",
    "urgent",
    "later",
    "done",
];

fn prose(rng: &mut Rng, chars: usize) -> String {
    let mut s = String::with_capacity(chars + 16);
    let mut sentence = 0;
    while s.len() < chars {
        let w = WORDS[(rng.next() % WORDS.len() as u64) as usize];
        if sentence == 0 {
            let mut c = w.chars();
            if let Some(f) = c.next() {
                s.extend(f.to_uppercase());
                s.push_str(c.as_str());
            }
        } else {
            s.push_str(w);
        }
        sentence += 1;
        if sentence > 6 && rng.next().is_multiple_of(5) {
            s.push_str(". ");
            sentence = 0;
        } else {
            s.push(' ');
        }
    }
    s.trim_end().to_string() + "."
}

/// A workspace of realistic size (a few thousand tokens of identity and memory).
fn workspace(rng: &mut Rng) -> Vec<(String, String)> {
    [
        ("SOUL.md", 3000),
        ("AGENTS.md", 6000),
        ("USER.md", 1200),
        ("IDENTITY.md", 400),
        ("TOOLS.md", 2000),
        ("MEMORY.md", 2500),
    ]
    .into_iter()
    .map(|(name, n)| (name.to_string(), format!("# {name}\n\n{}\n", prose(rng, n))))
    .collect()
}

/// One message of the script: the user's text, the virtual gap before it, the tool rounds
/// and the final answer.
struct Step {
    gap: u64,
    text: String,
    rounds: Vec<Vec<(String, String, Value)>>,
    reply: String,
}

fn script(rng: &mut Rng, ws: &str) -> Vec<Step> {
    // Tool rounds per message: 0-3, 9 of 20 messages use tools.
    let rounds = [0, 1, 0, 2, 0, 1, 3, 0, 0, 1, 0, 2, 1, 0, 0, 1, 0, 2, 1, 0];
    let files = ["MEMORY.md", "USER.md", "TOOLS.md", "AGENTS.md"];
    let mut call = 0;
    rounds
        .iter()
        .enumerate()
        .map(|(k, &r)| {
            let gap = match k {
                0 => 0,
                12 => 420, // a break longer than the 5-minute TTL
                _ => rng.range(20, 240),
            };
            let len = rng.range(40, 300) as usize;
            let text = format!("BENCHID={} {}", k + 1, prose(rng, len));
            let rounds = (0..r)
                .map(|_| {
                    (0..rng.range(1, 3))
                        .map(|_| {
                            call += 1;
                            let id = format!("toolu_bench{call:04}");
                            if rng.next().is_multiple_of(3) {
                                (id, "session_status".to_string(), json!({}))
                            } else {
                                let f = files[(rng.next() % files.len() as u64) as usize];
                                (id, "read".to_string(), json!({"path": format!("{ws}/{f}")}))
                            }
                        })
                        .collect()
                })
                .collect();
            let len = rng.range(150, 1200) as usize;
            let reply = prose(rng, len);
            Step {
                gap,
                text,
                rounds,
                reply,
            }
        })
        .collect()
}

struct Run {
    calls: Vec<(usize, CallUsage, u64)>,
}

pub fn cache(o: &Opts) -> Result<()> {
    let mut rng = Rng(0x00A6_E47D);
    let sim = Arc::new(Mutex::new(Sim::default()));
    let queue: Arc<Mutex<VecDeque<(usize, Answer, u64)>>> = Arc::default();
    let run = Arc::new(Mutex::new(Run { calls: Vec::new() }));
    let fake = {
        let (sim, queue, run) = (sim.clone(), queue.clone(), run.clone());
        FakeProvider::spawn(Box::new(move |raw| {
            let body: Value = serde_json::from_slice(raw).unwrap_or(Value::Null);
            let mut sim = sim.lock().unwrap_or_else(|p| p.into_inner());
            let u = sim.call(&body);
            sim.now += CALL_SECONDS;
            let (step, answer, output) = queue
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .pop_front()
                .unwrap_or((0, Answer::Text("(script exhausted)".into()), 5));
            run.lock()
                .unwrap_or_else(|p| p.into_inner())
                .calls
                .push((step, u, output));
            (
                answer,
                Usage {
                    input: u.input,
                    output,
                    cache_read: u.read,
                    cache_write: u.write,
                },
            )
        }))?
    };
    let ws_files = workspace(&mut rng);
    let mut d = Daemon::new(
        &o.agentd,
        &o.dir,
        &Setup {
            provider_url: fake.base_url(),
            workspace_files: ws_files.clone(),
            ..Setup::default()
        },
    )?;
    let ws = d.workspace().display().to_string();
    let steps = script(&mut rng, &ws);
    d.start()?;
    let chat = Chat::new(&d.base_url())?;
    let rt = runtime()?;
    for (k, s) in steps.iter().enumerate() {
        {
            let mut q = queue.lock().unwrap_or_else(|p| p.into_inner());
            for calls in &s.rounds {
                let out = calls
                    .iter()
                    .map(|c| c.2.to_string().len() as u64 / 4 + 20)
                    .sum();
                q.push_back((k + 1, Answer::Tools(calls.clone()), out));
            }
            q.push_back((
                k + 1,
                Answer::Text(s.reply.clone()),
                s.reply.len() as u64 / 4,
            ));
        }
        sim.lock().unwrap_or_else(|p| p.into_inner()).now += s.gap;
        let (_, v) = rt.block_on(chat.send("cache", &s.text))?;
        if v["reply"] != s.reply {
            bail!("message {}: unexpected reply {}", k + 1, v["reply"]);
        }
    }
    let ledger = rt.block_on(chat.get("/api/v1/cost?period=all"))?;
    d.stop()?;

    let calls = run.lock().unwrap_or_else(|p| p.into_inner()).calls.clone();
    let system_chars: usize = ws_files.iter().map(|(_, c)| c.len()).sum();
    println!(
        "cache: 20 messages, {} calls ({} with tool use), workspace {} chars, Sonnet-class prices",
        calls.len(),
        calls.len() - steps.len(),
        system_chars
    );
    println!("  msg calls   prompt    read   write   input   ideal");
    let mut tot = CallUsage::default();
    let mut out_tokens = 0;
    for (k, s) in steps.iter().enumerate() {
        let mine: Vec<&(usize, CallUsage, u64)> = calls.iter().filter(|c| c.0 == k + 1).collect();
        let mut m = CallUsage::default();
        for (_, u, out) in &mine {
            m.prompt += u.prompt;
            m.read += u.read;
            m.write += u.write;
            m.input += u.input;
            m.ideal_read += u.ideal_read;
            out_tokens += out;
        }
        println!(
            "  {:>3} {:>5} {:>8} {:>7} {:>7} {:>7} {:>7}{}",
            k + 1,
            mine.len(),
            m.prompt,
            m.read,
            m.write,
            m.input,
            m.ideal_read,
            if s.gap > TTL_5M {
                format!("   (after a {} min pause: cache expired)", s.gap / 60)
            } else {
                String::new()
            }
        );
        tot.prompt += m.prompt;
        tot.read += m.read;
        tot.write += m.write;
        tot.input += m.input;
        tot.ideal_read += m.ideal_read;
    }
    let eff = tot.read as f64 / tot.ideal_read.max(1) as f64;
    println!(
        "  total prompt {} tokens: read {}, written {}, uncached {}; ideal read {}; output {}",
        tot.prompt, tot.read, tot.write, tot.input, tot.ideal_read, out_tokens
    );
    println!("  cache efficiency (read / ideal read): {eff:.4}");
    let usd = |t: f64, p: f64| t * p / 1e6;
    let with = usd(tot.input as f64, PRICE_IN)
        + usd(tot.read as f64, PRICE_READ)
        + usd(tot.write as f64, PRICE_WRITE)
        + usd(out_tokens as f64, PRICE_OUT);
    let without = usd(tot.prompt as f64, PRICE_IN) + usd(out_tokens as f64, PRICE_OUT);
    println!(
        "  cost: ${with:.4} with caching vs ${without:.4} without ({:.0} % saved); daemon's ledger: ${:.4}",
        (1.0 - with / without) * 100.0,
        ledger["total_cost"].as_f64().unwrap_or(f64::NAN)
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(system: &str, msgs: &[(&str, &str)], marks: &[usize]) -> Value {
        let messages: Vec<Value> = msgs
            .iter()
            .enumerate()
            .map(|(i, (role, text))| {
                let mut b = json!({"type": "text", "text": text});
                if marks.contains(&i) {
                    b["cache_control"] = json!({"type": "ephemeral"});
                }
                json!({"role": role, "content": [b]})
            })
            .collect();
        json!({
            "system": [{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}],
            "messages": messages,
        })
    }

    #[test]
    fn breakpoints_write_then_read_and_short_prefixes_are_not_cached() {
        let big = "x".repeat(8000); // 2004 tokens
        let mut sim = Sim::default();
        let u = sim.call(&req(&big, &[("user", "hi")], &[0]));
        assert_eq!(u.read, 0);
        assert_eq!(
            u.write, u.prompt,
            "everything up to the last breakpoint is written"
        );
        sim.now += 10;
        let u2 = sim.call(&req(
            &big,
            &[("user", "hi"), ("assistant", "yo"), ("user", "more")],
            &[0, 2],
        ));
        assert_eq!(u2.read, u.prompt);
        assert_eq!(u2.read + u2.write, u2.prompt);
        // Short system prompt: nothing cacheable.
        let mut sim = Sim::default();
        let u = sim.call(&req("short", &[("user", "hi")], &[0]));
        assert_eq!((u.read, u.write), (0, 0));
    }

    #[test]
    fn ttl_expires_and_lookback_is_20_blocks() {
        let big = "x".repeat(8000);
        let mut sim = Sim::default();
        let first = req(&big, &[("user", "a")], &[0]);
        sim.call(&first);
        sim.now += TTL_5M + 1;
        let u = sim.call(&first);
        assert_eq!(u.read, 0, "expired");
        // 25 more blocks, a breakpoint only on the last: beyond the lookback from it.
        let mut sim = Sim::default();
        let mut msgs = vec![("user", "a")];
        sim.call(&req(&big, &msgs, &[0]));
        for _ in 0..25 {
            msgs.push(("assistant", "b"));
        }
        let u = sim.call(&req(&big, &msgs, &[msgs.len() - 1]));
        // Only the system breakpoint's entry is found (from the system block's own mark).
        assert!(u.read > 0 && u.read < u.ideal_read, "{u:?}");
    }
}
