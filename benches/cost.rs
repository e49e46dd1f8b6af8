//! `bench cost` (SPEC §20): what the cost autopilot saves, in simulated time. Requests are the
//! daemon's own: built as the agent loop builds them (stable and semi_stable system blocks,
//! tools, the growing conversation, the breakpoint of the previous call), with the TTL the
//! agent picks (`agent::prompt::stable_ttl` over the session's turn times), rendered by the
//! real Anthropic renderer, answered by the fake provider's cache simulation (`cache::Sim`,
//! Anthropic's documented rules, 5-minute and 1-hour entries), and priced by `cost::cost_usd`
//! at the shipped `providers.d/anthropic.toml` prices of `primary`.
//!
//! Scenarios:
//! - a day of a 30-minute heartbeat that finds nothing to do in 85 % of runs, without and with
//!   a precheck (a skipped run makes no call);
//! - a chat with messages 10–20 minutes apart, `ttl = "5m"` against `auto`;
//! - a chat with messages 30 s apart, `ttl = "5m"` against `auto`.

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::{Context, Result};
use serde_json::{Value, json};

use agentd::config::{CachingTtl, ModelSpec};
use agentd::llm::{ChatRequest, SystemBlock, SystemTier, ToolChoice, ToolSpec};
use agentd::message::{Message, Usage};

use crate::cache::Sim;

/// Seconds one call takes in simulated time.
const CALL_SECONDS: u64 = 5;

/// The shipped `primary` model of `providers.d/anthropic.toml`, loaded through the config.
fn shipped_primary() -> Result<Arc<ModelSpec>> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = std::env::temp_dir().join(format!("agentd-bench-cost-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("agentd.toml");
    std::fs::write(
        &path,
        format!(
            "[agent]\nname = \"bench\"\nworkspace = \"{}\"\n[providers]\ndir = \"{}\"\nload = [\"anthropic\"]\n",
            dir.display(),
            root.join("providers.d").display()
        ),
    )?;
    let env = BTreeMap::from([
        ("HOME".to_string(), dir.display().to_string()),
        ("AGENTD_ANTHROPIC_KEY".to_string(), "bench".to_string()),
    ]);
    let cfg = agentd::config::load_with_env(&path, env).context("load the shipped providers");
    let _ = std::fs::remove_dir_all(&dir);
    let cfg = cfg?;
    cfg.models
        .get("primary")
        .cloned()
        .context("no primary model in providers.d/anthropic.toml")
}

/// Deterministic filler text of `chars` characters.
fn text(seed: u64, chars: usize) -> String {
    let words = [
        "agent",
        "memory",
        "schedule",
        "budget",
        "session",
        "workspace",
        "reply",
        "context",
        "tool",
        "cache",
        "notes",
        "calendar",
        "mail",
        "project",
        "weather",
        "reminder",
    ];
    let mut s = String::with_capacity(chars + 16);
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    while s.len() < chars {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.push_str(words[(x % words.len() as u64) as usize]);
        s.push(' ');
    }
    s.truncate(chars);
    s
}

/// The prompt head every call carries: a workspace-sized identity (stable), the skills index
/// (semi_stable), and a dozen tools.
fn head() -> (Vec<SystemBlock>, Vec<ToolSpec>) {
    let system = vec![
        SystemBlock {
            tier: SystemTier::Stable,
            text: text(1, 14_000),
        },
        SystemBlock {
            tier: SystemTier::SemiStable,
            text: text(2, 3_000),
        },
    ];
    let tools = (0..12)
        .map(|i| ToolSpec {
            name: format!("tool_{i}"),
            description: text(10 + i, 400),
            input_schema: json!({"type": "object", "properties": {"arg": {"type": "string"}}}),
        })
        .collect();
    (system, tools)
}

/// One session in simulated time: its messages and the times of its user turns.
struct Session {
    spec: Arc<ModelSpec>,
    ttl: CachingTtl,
    system: Vec<SystemBlock>,
    tools: Vec<ToolSpec>,
    messages: Vec<Message>,
    turns: Vec<i64>,
    previous: Option<usize>,
    calls: u64,
    usage: Usage,
    cost: f64,
}

impl Session {
    fn new(spec: &Arc<ModelSpec>, ttl: CachingTtl) -> Session {
        let (system, tools) = head();
        Session {
            spec: spec.clone(),
            ttl,
            system,
            tools,
            messages: Vec::new(),
            turns: Vec::new(),
            previous: None,
            calls: 0,
            usage: Usage::default(),
            cost: 0.0,
        }
    }

    /// One user turn at `sim.now`: one call per tool round in `rounds` (a tool and the
    /// length of its result), then the final call answering `reply` (`output` tokens).
    fn turn(
        &mut self,
        sim: &mut Sim,
        user: String,
        rounds: &[(&str, usize)],
        reply: String,
        output: u64,
    ) -> Result<()> {
        self.turns.push(sim.now as i64);
        if self.turns.len() > agentd::session::state::RECENT_TURNS {
            self.turns.remove(0);
        }
        self.messages.push(Message::user_text(user));
        for (k, (tool, result)) in rounds.iter().enumerate() {
            self.call(sim, 40)?;
            let id = format!("call_{}_{k}", self.calls);
            self.messages.push(Message::Assistant {
                text: String::new(),
                tool_calls: vec![agentd::message::ToolCall {
                    id: id.clone(),
                    name: (*tool).to_string(),
                    arguments: json!({"arg": "HEARTBEAT.md"}),
                }],
                thinking: Vec::new(),
                usage: None,
            });
            self.messages.push(Message::ToolResults {
                results: vec![agentd::message::ToolResult {
                    tool_call_id: id,
                    content: text(self.calls * 7 + k as u64, *result),
                    is_error: false,
                    images: Vec::new(),
                }],
                notice: None,
            });
            self.previous = Some(self.messages.len() - 1);
        }
        self.call(sim, output)?;
        self.messages.push(Message::Assistant {
            text: reply,
            tool_calls: Vec::new(),
            thinking: Vec::new(),
            usage: None,
        });
        self.previous = Some(self.messages.len());
        Ok(())
    }

    /// One call with the messages so far, priced at the shipped rates.
    fn call(&mut self, sim: &mut Sim, output: u64) -> Result<()> {
        let stable_ttl = agentd::agent::prompt::stable_ttl(self.ttl, &self.turns);
        let req = ChatRequest {
            session_id: "bench".into(),
            system: self.system.clone(),
            messages: self.messages.clone(),
            tools: self.tools.clone().into(),
            tool_choice: ToolChoice::Auto,
            previous_messages: self.previous,
            rendered: Default::default(),
            options: Default::default(),
            deltas: None,
            stable_ttl: Some(stable_ttl),
        };
        let body: Value =
            serde_json::from_slice(&agentd::llm::anthropic::render_body(&self.spec, &req)?)?;
        let u = sim.call(&body);
        sim.now += CALL_SECONDS;
        let usage = Usage {
            input_tokens: u.input,
            output_tokens: output,
            cache_read_tokens: u.read,
            cache_write_tokens: u.write,
            cache_write_1h_tokens: u.write_1h,
        };
        self.cost += agentd::cost::cost_usd(&self.spec.pricing, &usage);
        self.usage.add(&usage);
        self.calls += 1;
        Ok(())
    }

    fn hit_ratio(&self) -> f64 {
        agentd::store::hit_ratio(
            self.usage.input_tokens,
            self.usage.cache_read_tokens,
            self.usage.cache_write_tokens,
        )
        .unwrap_or(0.0)
    }
}

/// Whether heartbeat run `i` of the day finds something to do: 15 % of runs.
fn finds_something(i: u64) -> bool {
    matches!(i % 20, 0 | 7 | 14)
}

/// A day of 48 heartbeats 30 minutes apart. Without a precheck every run checks for itself:
/// it reads `HEARTBEAT.md` and runs a check through `exec` (two tool rounds) before it answers;
/// with one, the runs that find nothing make no call, and the others start from the
/// precheck's output in their message and answer in one call.
fn heartbeat_day(spec: &Arc<ModelSpec>, precheck: bool) -> Result<(Session, u64)> {
    let mut sim = Sim::default();
    let mut s = Session::new(spec, CachingTtl::Auto);
    let mut skipped = 0;
    for i in 0..48u64 {
        sim.now = i * 1800;
        let something = finds_something(i);
        if precheck && !something {
            skipped += 1;
            continue;
        }
        let (reply, output) = if something {
            (text(100 + i, 1200), 300)
        } else {
            ("HEARTBEAT_OK".to_string(), 5)
        };
        if precheck {
            let user = format!(
                "Execute HEARTBEAT.md\n\nThe precheck's output:\n{}",
                text(i, 600)
            );
            s.turn(&mut sim, user, &[], reply, output)?;
        } else {
            let rounds = [("read", 1500), ("exec", 800)];
            s.turn(
                &mut sim,
                "Execute HEARTBEAT.md".into(),
                &rounds,
                reply,
                output,
            )?;
        }
    }
    Ok((s, skipped))
}

/// A 20-message chat with gaps from `gaps` (seconds, cycled).
fn chat(spec: &Arc<ModelSpec>, ttl: CachingTtl, gaps: &[u64]) -> Result<Session> {
    let mut sim = Sim::default();
    let mut s = Session::new(spec, ttl);
    for i in 0..20u64 {
        if i > 0 {
            sim.now += gaps[(i as usize) % gaps.len()];
        }
        s.turn(&mut sim, text(200 + i, 300), &[], text(300 + i, 800), 200)?;
    }
    Ok(s)
}

fn line(name: &str, s: &Session) {
    println!(
        "  {name:<34} {:>3} calls  ${:>8.4}  cache hit {:>5.1}%  (1h writes {} of {} written tokens)",
        s.calls,
        s.cost,
        s.hit_ratio() * 100.0,
        s.usage.cache_write_1h_tokens,
        s.usage.cache_write_tokens
    );
}

pub fn cost() -> Result<()> {
    let spec = shipped_primary()?;
    let p = &spec.pricing;
    println!(
        "cost: simulated time, {} ({}) at the shipped prices: input ${}/MTok, output ${}, cache read ${}, write 5m ${}, write 1h ${}",
        spec.name, spec.model, p.input, p.output, p.cache_read, p.cache_write, p.cache_write_1h
    );

    let (plain, _) = heartbeat_day(&spec, false)?;
    let (checked, skipped) = heartbeat_day(&spec, true)?;
    println!("heartbeat every 30 min for a day, 85 % of runs find nothing (ttl = auto):");
    line("without prechecks", &plain);
    line(
        &format!("with prechecks ({skipped} runs skipped)"),
        &checked,
    );
    let ratio = checked.cost / plain.cost;
    println!(
        "  with prechecks: {:.1} % of the cost (target ≤ 20 %): {}",
        ratio * 100.0,
        if ratio <= 0.2 { "ok" } else { "MISSED" }
    );

    let gaps_slow = [600, 900, 1200, 720, 1080];
    let five = chat(&spec, CachingTtl::FiveMinutes, &gaps_slow)?;
    let auto = chat(&spec, CachingTtl::Auto, &gaps_slow)?;
    println!("chat, 20 messages 10–20 min apart:");
    line("ttl = \"5m\"", &five);
    line("ttl = \"auto\"", &auto);
    println!(
        "  auto saves {:.1} %: {}",
        (1.0 - auto.cost / five.cost) * 100.0,
        if auto.cost < five.cost {
            "ok"
        } else {
            "MISSED"
        }
    );

    let five = chat(&spec, CachingTtl::FiveMinutes, &[30])?;
    let auto = chat(&spec, CachingTtl::Auto, &[30])?;
    println!("chat, 20 messages 30 s apart:");
    line("ttl = \"5m\"", &five);
    line("ttl = \"auto\"", &auto);
    println!(
        "  auto costs {:+.2} % against 5m: {}",
        (auto.cost / five.cost - 1.0) * 100.0,
        if auto.cost <= five.cost {
            "ok"
        } else {
            "MISSED"
        }
    );
    Ok(())
}
