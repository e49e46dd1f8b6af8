//! Crash cycles: `kill -9` of the real daemon at random points of message processing, 50 times
//! (`BATTERY_CYCLES`), with traffic from all three outside sources (the control FIFO through
//! `agent-send`, HTTP `/notify`, Telegram through the fake Bot API).
//!
//! Each cycle picks one of five points (seeded RNG, `BATTERY_SEED`):
//! - **intake**: while `agent-send`, HTTP requests and Telegram polls are being taken in;
//! - **model**: while a model call is held open by the fake LLM;
//! - **tool**: while an `exec` tool call (a 1 s `sleep`) runs;
//! - **delivery**: while the fake Telegram holds a `sendMessage` in a flood wait, or right
//!   after it accepted one;
//! - **snapshot**: a few milliseconds after a held model call is released, when the final
//!   message, the state snapshot and the delivery records are being written.
//!
//! After every kill, on the files as the crash left them (before the restart repairs anything):
//! every trail line and state file parses, `agentd.db` and `memory.db` pass
//! `PRAGMA integrity_check`, every acknowledged message (agent-send exit 0, HTTP 202, a
//! Telegram update below the offset saved in `agentd.db`) has exactly one intake record, no
//! message is taken in twice, answered twice, or started twice, and no reply reached Telegram
//! twice. At the end, after every hold is released: every
//! acknowledged message and every Telegram update has exactly one final reply (failures are not
//! expected here), every Telegram reply was sent exactly once — except one whose send a kill
//! interrupted (an `intent` record without an outcome, which SPEC §5.2 never repeats) — and a
//! further restart neither calls the model nor sends anything again.

use std::collections::{BTreeMap, HashMap};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use tokio::sync::Semaphore;

use super::{
    StateFiles, assert_db_intact, check_state_files, completes, free_port, http, lists,
    outcome_text,
};
use crate::support::daemon::TestDaemon;
use crate::support::e2e::{agentd_toml, provider_toml};
use crate::support::fake_llm::{FakeLlm, Reply, Wire, last_user_text};
use crate::support::fake_telegram::FakeTelegram;
use crate::support::wait_until;

const TG_TOKEN: &str = "123456:TEST-battery-token";
const HTTP_TOKEN: &str = "battery-http-token";
const ALICE: i64 = 1001;
const BOB: i64 = 1002;
const WAIT: Duration = Duration::from_secs(60);
const DEFAULT_CYCLES: usize = 50;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Point {
    Intake,
    Model,
    Tool,
    Delivery,
    Snapshot,
}

const POINTS: [Point; 5] = [
    Point::Intake,
    Point::Model,
    Point::Tool,
    Point::Delivery,
    Point::Snapshot,
];

#[derive(Clone, Copy, Debug, PartialEq)]
enum Channel {
    Fifo,
    Http,
    Telegram,
}

/// One message sent to the daemon, known by a unique token in its text.
struct Msg {
    token: String,
    channel: Channel,
    /// `Some(true)`: the source acknowledged it (agent-send exit 0, HTTP 202). Telegram updates
    /// stay `None`: they are acknowledged by the offset the daemon saved (checked after every
    /// kill), and every one of them must be taken in by the end (the fake keeps an update
    /// until a poll confirms it).
    acked: Option<bool>,
    /// The Telegram update id.
    update_id: Option<i64>,
}

/// The fake LLM's behaviour, changed by the test between cycles.
#[derive(Default)]
struct ModelControl {
    /// `Some`: every answer waits for a permit of this semaphore.
    gate: Mutex<Option<Arc<Semaphore>>>,
    calls: AtomicU64,
}

impl ModelControl {
    /// Answers wait for a permit from now on. An earlier gate is closed, so whatever still waits
    /// on it answers (into a connection that a kill has closed).
    fn hold(&self) -> Arc<Semaphore> {
        let g = Arc::new(Semaphore::new(0));
        if let Some(old) = self.gate.lock().unwrap().replace(g.clone()) {
            old.close();
        }
        g
    }

    /// Answers flow freely; every waiting one is released.
    fn release(&self) {
        if let Some(old) = self.gate.lock().unwrap().take() {
            old.close();
        }
    }
}

/// Messages are answered `reply-<n>` (unique per call, so a reply sent twice is visible in the
/// fake Telegram); a user turn containing `[tool]` first gets an `exec` call of a 1 s sleep.
fn responder(ctl: Arc<ModelControl>) -> impl Fn(&Value) -> Option<Reply> + Send + Sync {
    move |body| {
        let n = ctl.calls.fetch_add(1, Ordering::SeqCst) + 1;
        let last_is_tool = body["messages"]
            .as_array()
            .and_then(|m| m.last())
            .is_some_and(|m| m["role"] == "tool");
        let reply = if !last_is_tool && last_user_text(body).contains("[tool]") {
            Reply::tool_calls(vec![(
                &format!("call_{n}"),
                "exec",
                json!({"command": "sleep 1; echo tool-ran"}),
            )])
        } else {
            Reply::text(format!("reply-{n:05}"))
        };
        let gate = ctl.gate.lock().unwrap().clone();
        Some(match gate {
            Some(g) => reply.gated(&g),
            None => reply,
        })
    }
}

/// Everything a cycle has in flight towards the daemon.
#[derive(Default)]
struct InFlight {
    /// agent-send processes and the index of their message.
    sends: Vec<(usize, Child)>,
    /// HTTP `/notify` requests and the index of their message.
    posts: Vec<(usize, JoinHandle<bool>)>,
}

struct Battery {
    d: TestDaemon,
    llm: FakeLlm,
    tg: FakeTelegram,
    ctl: Arc<ModelControl>,
    port: u16,
    msgs: Vec<Msg>,
    flight: InFlight,
    rng: StdRng,
}

impl Battery {
    /// Sends one message and returns the key of the session it goes to.
    fn send(&mut self, cycle: usize, channel: Channel, tool: bool) -> String {
        let idx = self.msgs.len();
        let token = format!("m{cycle:03}-{idx:04}#");
        let text = format!("{token} {}", if tool { "[tool] run it" } else { "hello" });
        let mut update_id = None;
        let key = match channel {
            Channel::Fifo => {
                let from = if tool {
                    "fifo-tool".to_string()
                } else {
                    format!("fifo-{}", self.rng.random_range(0..2))
                };
                let child = Command::new(env!("CARGO_BIN_EXE_agent-send"))
                    .arg("--state-dir")
                    .arg(&self.d.state_dir)
                    .arg("-c")
                    .arg(&self.d.config_path)
                    .args(["-m", &text, "--from", &from, "--timeout", "5"])
                    .env_remove("AGENTD_STATE_DIR")
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("spawn agent-send");
                self.flight.sends.push((idx, child));
                from
            }
            Channel::Http => {
                let port = self.port;
                let body = json!({"message": text, "source": "battery"});
                let h = std::thread::spawn(move || {
                    matches!(
                        http(
                            port,
                            "POST",
                            "/api/v1/notify",
                            Some(HTTP_TOKEN),
                            Some(&body)
                        ),
                        Ok((202, _))
                    )
                });
                self.flight.posts.push((idx, h));
                "system".to_string()
            }
            Channel::Telegram => {
                let (user, name) = if self.rng.random_bool(0.5) {
                    (ALICE, "Alice")
                } else {
                    (BOB, "Bob")
                };
                update_id = Some(self.tg.push_text(user, user, &text).update_id);
                name.to_string()
            }
        };
        self.msgs.push(Msg {
            token,
            channel,
            acked: None,
            update_id,
        });
        key
    }

    /// 1 to 4 plain messages over random channels.
    fn send_some(&mut self, cycle: usize) {
        for _ in 0..self.rng.random_range(1..=4) {
            let channel = match self.rng.random_range(0..3) {
                0 => Channel::Fifo,
                1 => Channel::Http,
                _ => Channel::Telegram,
            };
            self.send(cycle, channel, false);
        }
    }

    fn pause(&mut self, max_ms: u64) {
        let ms = self.rng.random_range(0..=max_ms);
        std::thread::sleep(Duration::from_millis(ms));
    }

    fn sendmessage_calls(&self) -> usize {
        self.tg
            .requests()
            .iter()
            .filter(|(m, _)| m == "sendmessage")
            .count()
    }

    /// Drives the daemon to `point`, then returns (the caller kills).
    fn reach(&mut self, cycle: usize, point: Point) {
        match point {
            Point::Intake => {
                self.ctl.release();
                self.send_some(cycle);
                self.pause(60);
            }
            Point::Model => {
                self.ctl.hold();
                let before = self.llm.requests().len();
                self.send_some(cycle);
                wait_until(WAIT, "a model call in flight", || {
                    (self.llm.requests().len() > before).then_some(())
                });
                self.pause(30);
            }
            Point::Tool => {
                self.ctl.release();
                let channel = if self.rng.random_bool(0.5) {
                    Channel::Fifo
                } else {
                    Channel::Telegram
                };
                let idx = self.msgs.len();
                let key = self.send(cycle, channel, true);
                let token = self.msgs[idx].token.clone();
                // The assistant message with the exec call is recorded right before the call
                // runs; the call sleeps 1 s.
                wait_until(WAIT, "the exec tool call to start", || {
                    let trail = self.d.trail(&key);
                    let id = trail.iter().find(|l| {
                        l["type"] == "intake" && l["text"].as_str().unwrap_or("").contains(&token)
                    })?["id"]
                        .as_str()?
                        .to_string();
                    let turn = trail.iter().position(|l| {
                        l["type"] == "message" && l["role"] == "user" && lists(l, &id)
                    })?;
                    trail[turn..]
                        .iter()
                        .any(|l| l["tool_calls"].as_array().is_some_and(|c| !c.is_empty()))
                        .then_some(())
                });
                self.pause(700);
            }
            Point::Delivery => {
                self.ctl.release();
                let flood = self.rng.random_bool(0.5);
                let before_calls = self.sendmessage_calls();
                let before_sent = self.tg.sent().len();
                if flood {
                    // The next sendMessage answers 429 retry_after 2: the daemon waits 2 s
                    // between its intent record and the send that will succeed.
                    self.tg.flood(2);
                }
                for _ in 0..self.rng.random_range(1..=2) {
                    self.send(cycle, Channel::Telegram, false);
                }
                if flood {
                    wait_until(WAIT, "a sendMessage held by a flood wait", || {
                        (self.sendmessage_calls() > before_calls).then_some(())
                    });
                    self.pause(1500);
                } else {
                    wait_until(WAIT, "a reply accepted by Telegram", || {
                        (self.tg.sent().len() > before_sent).then_some(())
                    });
                    self.pause(5);
                }
            }
            Point::Snapshot => {
                let gate = self.ctl.hold();
                let before = self.llm.requests().len();
                self.send_some(cycle);
                wait_until(WAIT, "a model call in flight", || {
                    (self.llm.requests().len() > before).then_some(())
                });
                gate.add_permits(1000);
                self.pause(15);
            }
        }
    }

    /// Starts the daemon and waits until all three sources are up (the FIFO is ready when
    /// `start` returns; the HTTP listener binds right after it), so that every cycle's traffic
    /// can reach it.
    fn start(&mut self) {
        self.d.start();
        let port = self.port;
        wait_until(WAIT, "the HTTP API", || {
            matches!(
                http(port, "GET", "/api/v1/status", None, None),
                Ok((200, _))
            )
            .then_some(())
        });
    }

    /// Collects what the sources acknowledged: finished HTTP requests (all of them: the kill
    /// ended the rest) and agent-send processes that have exited (`wait` = all of them).
    fn collect_acks(&mut self, wait: bool) {
        for (idx, h) in std::mem::take(&mut self.flight.posts) {
            self.msgs[idx].acked = Some(h.join().expect("HTTP thread"));
        }
        let mut still = Vec::new();
        for (idx, mut child) in std::mem::take(&mut self.flight.sends) {
            let status = if wait {
                Some(child.wait().expect("wait for agent-send"))
            } else {
                child.try_wait().expect("poll agent-send")
            };
            match status {
                Some(s) => self.msgs[idx].acked = Some(s.success()),
                None => still.push((idx, child)),
            }
        }
        self.flight.sends = still;
    }

    /// The invariants on the state directory as it is now (see the module doc). `end`: every
    /// acknowledged message and every Telegram update must be answered by now.
    fn check(&self, when: &str, end: bool) -> Report {
        let files = check_state_files(&self.d.state_dir);
        let db = self.d.state_dir.join("agentd.db");
        assert_db_intact(&db);
        assert_db_intact(&self.d.state_dir.join("memory.db"));
        let offset = telegram_offset(&db);
        check_messages(&files, &self.msgs, offset, &self.tg.sent(), when, end)
    }
}

/// The Telegram offset the daemon saved (kv `telegram.<bot id>.offset` in agentd.db): every
/// update below it counts as acknowledged.
fn telegram_offset(db: &std::path::Path) -> Option<i64> {
    let conn = rusqlite::Connection::open(db).ok()?;
    conn.query_row(
        "SELECT value FROM kv WHERE key LIKE 'telegram.%offset'",
        [],
        |r| r.get::<_, String>(0),
    )
    .ok()
    .and_then(|v| v.parse().ok())
}

/// Figures of one check, printed at the end.
#[derive(Debug, Default)]
struct Report {
    answered: usize,
    telegram_sent: usize,
    /// Telegram replies whose send a kill interrupted (intent without outcome: never repeated).
    telegram_interrupted: usize,
    temp_files: Vec<std::path::PathBuf>,
}

fn check_messages(
    files: &StateFiles,
    msgs: &[Msg],
    offset: Option<i64>,
    sent: &[crate::support::fake_telegram::SentMessage],
    when: &str,
    end: bool,
) -> Report {
    let lines = &files.lines;
    let mut report = Report {
        temp_files: files.temp_files.clone(),
        ..Report::default()
    };
    let intakes: Vec<&Value> = lines.iter().filter(|l| l["type"] == "intake").collect();
    for m in msgs {
        let ids: Vec<&str> = intakes
            .iter()
            .filter(|l| l["text"].as_str().unwrap_or("").contains(&m.token))
            .filter_map(|l| l["id"].as_str())
            .collect();
        assert!(
            ids.len() <= 1,
            "{when}: {} was taken in {} times: {ids:?}",
            m.token,
            ids.len()
        );
        let below_offset = m.update_id.zip(offset).is_some_and(|(u, o)| u < o);
        let must = m.acked == Some(true) || below_offset || (end && m.channel == Channel::Telegram);
        if must {
            assert_eq!(
                ids.len(),
                1,
                "{when}: {} ({:?}) was acknowledged but has no intake record: lost",
                m.token,
                m.channel
            );
        }
        let Some(id) = ids.first() else { continue };
        let outcomes: Vec<&Value> = lines.iter().filter(|l| completes(l, id)).collect();
        assert!(
            outcomes.len() <= 1,
            "{when}: {} answered {} times: {outcomes:#?}",
            m.token,
            outcomes.len()
        );
        let turns = lines
            .iter()
            .filter(|l| l["type"] == "message" && l["role"] == "user" && lists(l, id))
            .count();
        assert!(
            turns <= 1,
            "{when}: the user turn of {} was appended {turns} times",
            m.token
        );
        if let Some(o) = outcomes.first() {
            assert_eq!(
                o["type"], "message",
                "{when}: {} ended in a failure, not a reply: {o}",
                m.token
            );
            report.answered += 1;
        } else if end && must {
            panic!(
                "{when}: acknowledged message {} ({:?}) was never answered",
                m.token, m.channel
            );
        }
    }

    // Telegram deliveries: each reply at most once; at the end exactly once unless a kill cut
    // its send (intent recorded, no outcome).
    let mut sent_count: HashMap<&str, usize> = HashMap::new();
    for s in sent {
        *sent_count.entry(s.plain.as_str()).or_default() += 1;
    }
    let mut outcome_texts = std::collections::HashSet::new();
    for o in lines
        .iter()
        .filter(|l| l["final"] == true || l["type"] == "failure")
    {
        let ids: Vec<&str> = o["reply_to"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        if !ids.iter().any(|i| i.starts_with("tg-")) || o["silent"] == true {
            continue;
        }
        let text = outcome_text(o);
        outcome_texts.insert(text.clone());
        let n = sent_count.get(text.as_str()).copied().unwrap_or(0);
        assert!(
            n <= 1,
            "{when}: the reply {text:?} reached Telegram {n} times"
        );
        let records: Vec<&Value> = lines
            .iter()
            .filter(|l| l["type"] == "delivery" && l["reply_to"] == o["reply_to"])
            .collect();
        let status = |s: &str| records.iter().filter(|r| r["status"] == s).count();
        assert!(
            status("intent") <= 1,
            "{when}: {text:?} has {} intent records",
            status("intent")
        );
        report.telegram_sent += n;
        if end && n == 0 {
            assert!(
                status("intent") == 1 && status("done") == 0,
                "{when}: the reply {text:?} never reached Telegram and no kill interrupted its send: {records:#?}"
            );
            report.telegram_interrupted += 1;
        }
    }
    for s in sent {
        // The outbox's notice after a restart skipped an attempted part (SPEC §16.1).
        if s.plain
            .starts_with("(agentd restarted while sending the reply above")
        {
            continue;
        }
        assert!(
            outcome_texts.contains(&s.plain),
            "{when}: Telegram got {:?}, which is no reply in the trails",
            s.plain
        );
    }
    report
}

fn cycles() -> usize {
    std::env::var("BATTERY_CYCLES")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(DEFAULT_CYCLES)
}

#[test]
fn kill9_cycles_lose_nothing_acknowledged_and_repeat_nothing() {
    let seed = super::seed("kill9_cycles");
    let started = Instant::now();
    let llm = FakeLlm::spawn(Wire::OpenAi);
    let ctl = Arc::new(ModelControl::default());
    llm.set_responder(responder(ctl.clone()));
    let tg = FakeTelegram::spawn(TG_TOKEN);
    let port = free_port();
    let toml = agentd_toml("fake").replace(
        "[behavior]",
        &format!(
            "[channel.telegram]\nenabled = true\napi_url = \"{}\"\nallow_from = [{ALICE}, {BOB}]\n\
             poll_timeout_seconds = 1\nformat = \"plain\"\ncontacts = {{ Alice = {ALICE}, Bob = {BOB} }}\n\n\
             [http]\nenabled = true\nport = {port}\nrate_limit = 10000\n\n\
             [behavior]\ndebounce_ms = 50",
            tg.api_url()
        ),
    );
    let mut d = TestDaemon::new(
        &toml,
        &[("fake", &provider_toml("openai", &llm.base_url()))],
    );
    d.set_env("AGENTD_TELEGRAM_TOKEN", TG_TOKEN);
    d.set_env("AGENTD_HTTP_TOKEN", HTTP_TOKEN);
    let mut b = Battery {
        d,
        llm,
        tg,
        ctl,
        port,
        msgs: Vec::new(),
        flight: InFlight::default(),
        rng: StdRng::seed_from_u64(seed),
    };
    b.start();

    let n = cycles();
    let mut points: BTreeMap<String, usize> = BTreeMap::new();
    for cycle in 0..n {
        let point = POINTS[b.rng.random_range(0..POINTS.len())];
        *points.entry(format!("{point:?}")).or_default() += 1;
        eprintln!("kill9 cycle {cycle}: {point:?}");
        b.reach(cycle, point);
        b.d.kill9();
        b.collect_acks(false);
        let r = b.check(
            &format!("after the kill of cycle {cycle} ({point:?}, seed {seed})"),
            false,
        );
        if cycle % 10 == 9 {
            eprintln!("kill9 cycle {cycle}: {r:?}");
        }
        b.start();
    }

    // Release everything and let the daemon finish; then a graceful stop (it waits for messages
    // and deliveries in flight).
    b.ctl.release();
    b.collect_acks(true);
    wait_until(Duration::from_secs(180), "every message answered", || {
        let lines = check_state_files(&b.d.state_dir).lines;
        b.msgs
            .iter()
            .filter(|m| m.acked == Some(true) || m.channel == Channel::Telegram)
            .all(|m| {
                lines
                    .iter()
                    .find(|l| {
                        l["type"] == "intake" && l["text"].as_str().unwrap_or("").contains(&m.token)
                    })
                    .and_then(|l| l["id"].as_str())
                    .is_some_and(|id| lines.iter().any(|l| completes(l, id)))
            })
            .then_some(())
    });
    // The poll after the last finished update confirms it to Telegram.
    wait_until(
        Duration::from_secs(60),
        "every Telegram update confirmed",
        || b.tg.pending_update_ids().is_empty().then_some(()),
    );
    assert!(b.d.sigterm().success(), "graceful stop");
    let report = b.check(&format!("at the end (seed {seed})"), true);
    assert!(
        b.tg.pending_update_ids().is_empty(),
        "every Telegram update was confirmed"
    );
    let last_update = b.msgs.iter().filter_map(|m| m.update_id).max();
    assert!(
        telegram_offset(&b.d.state_dir.join("agentd.db")) > last_update,
        "the saved offset is past every update"
    );

    // One more start and stop: recovery finds nothing to do, so nothing is sent or asked again.
    let calls = b.llm.requests().len();
    let sent = b.tg.sent().len();
    b.d.start();
    assert!(b.d.sigterm().success());
    assert_eq!(
        b.llm.requests().len(),
        calls,
        "a clean restart calls no model"
    );
    assert_eq!(
        b.tg.sent().len(),
        sent,
        "a clean restart sends nothing again"
    );
    let after = b.check(&format!("after a clean restart (seed {seed})"), true);
    assert!(
        after.temp_files.is_empty(),
        "temp files of atomic writes are cleaned up at start: {:?}",
        after.temp_files
    );

    let acked = b.msgs.iter().filter(|m| m.acked == Some(true)).count();
    eprintln!(
        "kill9 battery: {n} cycles {points:?}; {} messages sent, {acked} acknowledged by agent-send/HTTP, \
         {} Telegram updates; {} answered; Telegram replies sent {} (interrupted sends not repeated: {}); \
         {} model calls; {:.0?} (seed {seed})",
        b.msgs.len(),
        b.msgs
            .iter()
            .filter(|m| m.channel == Channel::Telegram)
            .count(),
        report.answered,
        report.telegram_sent,
        report.telegram_interrupted,
        calls,
        started.elapsed()
    );
    assert!(
        report.answered > n,
        "the battery exercised the daemon ({} answers)",
        report.answered
    );
}
