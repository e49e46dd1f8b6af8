//! The loop against a scripted in-process provider: turn limit, wrap-up notice, forced final
//! answer, repair of dangling calls, cost rows and budgets, and sub-agents. Assertions are on
//! the requests the provider received, the outcome, the trail and the cost ledger.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::*;
use crate::config::{ModelSpec, Pricing, ProviderKind};
use crate::llm::testutil::model_spec;
use crate::llm::{
    ChatRequest, ChatResponse, Llm, LlmError, Provider, StopReason, ToolChoice, ToolSpec,
};
use crate::message::ToolCall;
use crate::monitor::Monitor;
use crate::session::SessionStore;
use crate::store::Db;
use crate::tools::{Tool, ToolContext, ToolError, ToolRegistry};

/// What a scripted answer looks like.
#[derive(Clone)]
enum Say {
    Text(&'static str),
    /// Tool calls by name (with these arguments), and the answer's text.
    Call(Vec<(&'static str, Value)>),
    /// One `echo` call in an answer cut at `max_tokens`.
    CutCall,
}

/// A provider that answers from a script (the last entry repeats) and keeps every request.
struct Scripted {
    script: Mutex<VecDeque<Say>>,
    seen: Mutex<Vec<ChatRequest>>,
    /// Unique call ids across every answer.
    next_id: Mutex<u32>,
}

impl Scripted {
    fn new(script: Vec<Say>) -> Arc<Scripted> {
        Arc::new(Scripted {
            script: Mutex::new(script.into()),
            seen: Mutex::new(Vec::new()),
            next_id: Mutex::new(0),
        })
    }

    fn requests(&self) -> Vec<ChatRequest> {
        self.seen.lock().unwrap().clone()
    }
}

impl Provider for Scripted {
    fn chat<'a>(&'a self, req: &'a ChatRequest) -> BoxFuture<'a, Result<ChatResponse, LlmError>> {
        self.seen.lock().unwrap().push(req.clone());
        let say = {
            let mut s = self.script.lock().unwrap();
            if s.len() > 1 {
                s.pop_front().unwrap()
            } else {
                s.front().cloned().expect("a script")
            }
        };
        let usage = Usage {
            input_tokens: 1000,
            output_tokens: 100,
            cache_read_tokens: 0,
            cache_write_tokens: 0,
            cache_write_1h_tokens: 0,
        };
        let resp = match say {
            Say::Text(t) => ChatResponse {
                text: t.to_string(),
                tool_calls: vec![],
                thinking: vec![],
                stop_reason: StopReason::EndTurn,
                usage,
                model: "fake".into(),
            },
            Say::CutCall => {
                let mut n = self.next_id.lock().unwrap();
                *n += 1;
                ChatResponse {
                    text: String::new(),
                    tool_calls: vec![ToolCall {
                        id: format!("call_{n}"),
                        name: "echo".into(),
                        arguments: json!({"text": "cut"}),
                    }],
                    thinking: vec![],
                    stop_reason: StopReason::MaxTokens,
                    usage,
                    model: "fake".into(),
                }
            }
            Say::Call(calls) => ChatResponse {
                text: "calling".into(),
                tool_calls: calls
                    .into_iter()
                    .map(|(name, arguments)| {
                        let mut n = self.next_id.lock().unwrap();
                        *n += 1;
                        ToolCall {
                            id: format!("call_{n}"),
                            name: name.to_string(),
                            arguments,
                        }
                    })
                    .collect(),
                thinking: vec![],
                stop_reason: StopReason::ToolUse,
                usage,
                model: "fake".into(),
            },
        };
        Box::pin(async move { Ok(resp) })
    }
}

/// A tool that answers `echo: <text>`.
struct Echo;

impl Tool for Echo {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "echo".into(),
            description: "Echo the text".into(),
            input_schema: json!({"type": "object", "properties": {"text": {"type": "string"}}}),
        }
    }

    fn call<'a>(
        &'a self,
        args: Value,
        _ctx: &'a ToolContext,
    ) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(async move { Ok(format!("echo: {}", args["text"].as_str().unwrap_or(""))) })
    }
}

/// $1 per million input tokens, $10 per million output: each scripted call costs $0.002.
const PRICING: Pricing = Pricing {
    input: 1.0,
    output: 10.0,
    cache_read: 0.0,
    cache_write: 0.0,
    cache_write_1h: 0.0,
    per_minute: 0.0,
    per_1k_chars: 0.0,
};
const CALL_USD: f64 = 0.002;

fn spec(name: &str) -> Arc<ModelSpec> {
    let mut s = model_spec(name, ProviderKind::Anthropic, "http://127.0.0.1:9");
    s.pricing = PRICING;
    Arc::new(s)
}

struct Fixture {
    _dir: tempfile::TempDir,
    agent: Agent,
    store: SessionStore,
    db: Db,
}

/// An agent whose `primary` model answers from `primary` and whose `subagent` model (when
/// given) answers from `sub`; `tune` adjusts the config before the agent is built.
fn fixture(
    primary: &Arc<Scripted>,
    sub: Option<&Arc<Scripted>>,
    tune: impl FnOnce(&mut Config),
) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    for d in ["config", "providers.d", "home", "workspace", "state"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    std::fs::write(
        root.join("config/agentd.toml"),
        "[agent]\nname = \"test\"\nworkspace = \"../workspace\"\n[providers]\ndir = \"../providers.d\"\n",
    )
    .unwrap();
    std::fs::write(
        root.join("providers.d/anthropic.toml"),
        "type = \"anthropic\"\napi_key_env = \"AGENTD_ANTHROPIC_KEY\"\n[models.primary]\nmodel = \"claude\"\n",
    )
    .unwrap();
    let env = BTreeMap::from([
        ("HOME".to_string(), root.join("home").display().to_string()),
        ("AGENTD_ANTHROPIC_KEY".to_string(), "sk-test".to_string()),
    ]);
    let mut cfg = crate::config::load_with_env(&root.join("config/agentd.toml"), env).unwrap();
    cfg.behavior.max_turns_per_message = 4;
    cfg.behavior.message_retries = 0;
    let mut providers: BTreeMap<String, Arc<dyn Provider>> = BTreeMap::new();
    cfg.models.loaded.clear();
    cfg.models.loaded.insert("primary".into(), spec("primary"));
    providers.insert("primary".into(), primary.clone());
    if let Some(sub) = sub {
        cfg.models
            .loaded
            .insert("subagent".into(), spec("subagent"));
        providers.insert("subagent".into(), sub.clone());
    }
    tune(&mut cfg);
    let cfg = Arc::new(cfg);
    let llm = Llm::with_providers(cfg.models.clone(), providers);
    let db = Db::open(&root.join("state/agentd.db")).unwrap();
    let ledger = crate::cost::Ledger::new(db.clone(), &cfg);
    let metrics = Arc::new(crate::metrics::Metrics::new());
    let gateway = Arc::new(crate::gateway::Gateway::with_llm(llm, ledger, metrics));
    let spawn = Arc::new(crate::tools::spawn::SpawnTool::new(cfg.clone()));
    let tools = Arc::new(
        ToolRegistry::new(
            vec![Arc::new(Echo), spawn.clone()],
            Duration::from_secs(30),
            10_000,
        )
        .unwrap(),
    );
    let agent = Agent::new(
        cfg.clone(),
        gateway,
        tools,
        Arc::new(crate::skills::SkillSet::load(&root.join("skills"), &[])),
        Arc::new(Monitor::new(root.join("state/monitor.json"))),
    )
    .started_at(Instant::now());
    spawn.connect(Arc::new(agent.clone()));
    let store =
        SessionStore::open(&root.join("state/sessions"), cfg.agent.timezone.clone()).unwrap();
    Fixture {
        _dir: dir,
        agent,
        store,
        db,
    }
}

fn work(text: &str) -> Work {
    Work::new(vec![Intake {
        id: "m1".into(),
        source: crate::control::Source::User,
        from: "tester".into(),
        text: text.into(),
        tier: None,
        attachments: vec![],
        route: None,
        notify_meta: None,
        relayed_from: None,
    }])
}

impl Fixture {
    fn session(&self) -> (Arc<SessionHandle>, SessionState) {
        let h = self.store.get_or_create("test:key", "primary").unwrap();
        let state = h.load_state("primary").unwrap();
        (h, state)
    }

    async fn run(&self, text: &str) -> (Finish, SessionState) {
        let (h, mut state) = self.session();
        let finish = self
            .agent
            .process(
                &h,
                &mut state,
                &work(text),
                "primary",
                &CancellationToken::new(),
            )
            .await;
        (finish, state)
    }

    /// (API model, calls) of the ledger: each scripted call has 1,000 input tokens.
    async fn cost_rows(&self) -> Vec<(String, u64)> {
        let summary = self.db.cost_summary(None).await.unwrap();
        let mut rows: Vec<(String, u64)> = summary
            .models
            .iter()
            .map(|m| (m.model.clone(), m.input_tokens / 1000))
            .collect();
        rows.sort();
        rows
    }
}

fn echo_call() -> Say {
    Say::Call(vec![("echo", json!({"text": "x"}))])
}

fn last_notice(req: &ChatRequest) -> Option<String> {
    match req.messages.last() {
        Some(Message::ToolResults { notice, .. }) => notice.clone(),
        _ => None,
    }
}

#[tokio::test]
async fn a_plain_answer_is_one_call_and_one_chat_row() {
    let primary = Scripted::new(vec![Say::Text("hello back")]);
    let f = fixture(&primary, None, |_| {});
    let (finish, state) = f.run("hi").await;
    let Finish::Reply { text, cost_usd, .. } = finish else {
        panic!("{finish:?}")
    };
    assert_eq!(text, "hello back");
    assert!((cost_usd - CALL_USD).abs() < 1e-12, "{cost_usd}");
    let reqs = primary.requests();
    assert_eq!(reqs.len(), 1);
    assert_eq!(reqs[0].tool_choice, ToolChoice::Auto);
    assert_eq!(reqs[0].messages.len(), 1);
    assert!(reqs[0].tools.iter().any(|t| t.name == "echo"));
    assert_eq!(state.messages.len(), 2);
    assert_eq!(f.cost_rows().await, [("primary-model".to_string(), 1)]);
}

#[tokio::test]
async fn the_turn_limit_ends_with_a_forced_final_answer_without_tools() {
    // The model calls a tool on every turn, the last one included.
    let primary = Scripted::new(vec![echo_call()]);
    let f = fixture(&primary, None, |c| c.behavior.max_turns_per_message = 3);
    let (finish, state) = f.run("loop forever").await;
    let reqs = primary.requests();
    assert_eq!(reqs.len(), 3, "one call per turn, no more");
    assert_eq!(reqs[0].tool_choice, ToolChoice::Auto);
    assert_eq!(reqs[1].tool_choice, ToolChoice::Auto);
    assert_eq!(reqs[2].tool_choice, ToolChoice::None, "tools withheld");
    // The calls of the last answer were dropped: it is the final reply.
    let Finish::Reply { text, cost_usd, .. } = finish else {
        panic!("{finish:?}")
    };
    assert_eq!(text, "calling");
    assert!((cost_usd - 3.0 * CALL_USD).abs() < 1e-12, "{cost_usd}");
    match state.messages.last() {
        Some(Message::Assistant { tool_calls, .. }) => assert!(tool_calls.is_empty()),
        other => panic!("{other:?}"),
    }
    // user, (assistant + results) × 2, final assistant
    assert_eq!(state.messages.len(), 6);
    assert_eq!(f.cost_rows().await, [("primary-model".to_string(), 3)]);
}

#[tokio::test]
async fn the_wrap_up_notice_comes_with_two_calls_left() {
    let primary = Scripted::new(vec![echo_call()]);
    let f = fixture(&primary, None, |c| c.behavior.max_turns_per_message = 4);
    let (finish, _) = f.run("work").await;
    assert!(matches!(finish, Finish::Reply { .. }), "{finish:?}");
    let reqs = primary.requests();
    assert_eq!(reqs.len(), 4);
    // After turn 1: 3 calls left, no notice. After turn 2: 2 left, the notice.
    assert_eq!(last_notice(&reqs[1]), None);
    let notice = last_notice(&reqs[2]).expect("notice after the second turn");
    assert!(notice.contains("Only 2 model calls remain"), "{notice}");
    assert_eq!(last_notice(&reqs[3]), None);
    // The tool ran and its result reached the model.
    match reqs[1].messages.last() {
        Some(Message::ToolResults { results, .. }) => {
            assert_eq!(results.len(), 1);
            assert_eq!(results[0].content, "echo: x");
            assert!(!results[0].is_error);
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn dangling_tool_calls_are_answered_before_the_next_call() {
    let primary = Scripted::new(vec![Say::Text("recovered")]);
    let f = fixture(&primary, None, |_| {});
    let (h, _) = f.session();
    // A crash left a tool call without its result.
    h.append(Event::Message(MessageEvent::new(Message::user_text(
        "earlier",
    ))))
    .unwrap();
    h.append(Event::Message(MessageEvent::new(Message::Assistant {
        text: String::new(),
        tool_calls: vec![ToolCall {
            id: "call_old".into(),
            name: "echo".into(),
            arguments: json!({}),
        }],
        thinking: vec![],
        usage: None,
    })))
    .unwrap();
    drop(h);
    let (finish, _) = f.run("again").await;
    assert!(matches!(finish, Finish::Reply { .. }), "{finish:?}");
    let reqs = primary.requests();
    assert_eq!(reqs.len(), 1);
    let msgs = &reqs[0].messages;
    assert_eq!(msgs.len(), 4, "{msgs:?}");
    match &msgs[2] {
        Message::ToolResults { results, .. } => {
            assert_eq!(results.len(), 1);
            assert_eq!(results[0].tool_call_id, "call_old");
            assert!(results[0].is_error);
            assert!(results[0].content.contains("did not finish"));
        }
        other => panic!("{other:?}"),
    }
    assert!(msgs[3].is_user());
    // The repair is in the trail.
    let (h, _) = f.session();
    let lines = h.read_trail().unwrap();
    assert!(
        lines
            .iter()
            .any(|l| matches!(&l.event, Event::ToolResult { results, .. } if results[0].tool_call_id == "call_old"))
    );
}

#[tokio::test]
async fn the_per_message_budget_stops_the_next_call() {
    let primary = Scripted::new(vec![echo_call()]);
    // Two calls reach $0.004.
    let f = fixture(&primary, None, |c| c.budget.per_message_usd = 0.004);
    let (finish, _) = f.run("spend").await;
    let Finish::Failed { reply, .. } = finish else {
        panic!("{finish:?}")
    };
    assert!(reply.starts_with("per-message budget"), "{reply}");
    assert_eq!(primary.requests().len(), 2);
    assert_eq!(f.cost_rows().await, [("primary-model".to_string(), 2)]);
}

#[tokio::test]
async fn the_daily_budget_is_checked_before_the_first_call() {
    let primary = Scripted::new(vec![Say::Text("never")]);
    let f = fixture(&primary, None, |c| c.budget.daily_usd = 0.001);
    let (first, _) = f.run("one").await;
    assert!(matches!(first, Finish::Reply { .. }), "{first:?}");
    let (second, _) = f.run("two").await;
    let Finish::Failed { reply, .. } = second else {
        panic!("{second:?}")
    };
    assert!(reply.starts_with("daily budget"), "{reply}");
    assert_eq!(primary.requests().len(), 1);
}

#[tokio::test]
async fn a_sub_agent_runs_with_its_model_scoped_tools_and_the_deny_list() {
    let primary = Scripted::new(vec![
        Say::Call(vec![(
            "sessions_spawn",
            json!({"prompt": "find out", "tools": ["echo", "sessions_spawn"]}),
        )]),
        Say::Text("main done"),
    ]);
    let sub = Scripted::new(vec![
        Say::Call(vec![
            ("echo", json!({"text": "s"})),
            ("sessions_spawn", json!({"prompt": "recurse"})),
        ]),
        Say::Text("sub result"),
    ]);
    let f = fixture(&primary, Some(&sub), |_| {});
    let (finish, _) = f.run("delegate").await;
    let Finish::Reply { text, .. } = finish else {
        panic!("{finish:?}")
    };
    assert_eq!(text, "main done");

    let sub_reqs = sub.requests();
    assert_eq!(sub_reqs.len(), 2);
    // The sub-agent's own prompt, and sessions_spawn hidden from it.
    assert!(sub_reqs[0].system[0].text.contains("sub-agent"));
    assert_eq!(sub_reqs[0].messages, vec![Message::user_text("find out")]);
    let names: Vec<&str> = sub_reqs[0].tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["echo"]);
    // The denied call was refused at execution; the allowed one ran.
    match sub_reqs[1].messages.last() {
        Some(Message::ToolResults { results, .. }) => {
            assert_eq!(results.len(), 2);
            assert_eq!(results[0].content, "echo: s");
            assert!(results[1].is_error);
            assert!(results[1].content.contains("not allowed for sub-agents"));
        }
        other => panic!("{other:?}"),
    }
    // The main agent got the sub-agent's answer as the tool result.
    let main_reqs = primary.requests();
    assert_eq!(main_reqs.len(), 2);
    match main_reqs[1].messages.last() {
        Some(Message::ToolResults { results, .. }) => {
            assert_eq!(results[0].content, "sub result");
            assert!(!results[0].is_error);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        f.cost_rows().await,
        [
            ("primary-model".to_string(), 2),
            ("subagent-model".to_string(), 2)
        ]
    );
}

#[tokio::test]
async fn the_per_message_budget_counts_the_sub_agents_calls() {
    let primary = Scripted::new(vec![
        Say::Call(vec![("sessions_spawn", json!({"prompt": "dig"}))]),
        Say::Text("never"),
    ]);
    let sub = Scripted::new(vec![echo_call(), Say::Text("dug")]);
    // Main call + two sub-agent calls = $0.006: the main agent's second call is refused,
    // though its own calls cost only $0.002.
    let f = fixture(&primary, Some(&sub), |c| c.budget.per_message_usd = 0.005);
    let (finish, _) = f.run("delegate").await;
    let Finish::Failed { reply, .. } = finish else {
        panic!("{finish:?}")
    };
    assert!(reply.contains("($0.006 spent on this message)"), "{reply}");
    assert_eq!(sub.requests().len(), 2);
    assert_eq!(primary.requests().len(), 1);
}

#[tokio::test]
async fn a_sub_agent_stops_at_the_per_message_budget() {
    let primary = Scripted::new(vec![
        Say::Call(vec![("sessions_spawn", json!({"prompt": "dig"}))]),
        Say::Text("main done"),
    ]);
    let sub = Scripted::new(vec![echo_call()]);
    let f = fixture(&primary, Some(&sub), |c| c.budget.per_message_usd = 0.005);
    let (finish, _) = f.run("delegate").await;
    // After main + two sub-agent calls ($0.006) the sub-agent's third call is refused (the
    // tool call fails with the budget's message), and so is the main agent's next call.
    assert!(matches!(finish, Finish::Failed { .. }), "{finish:?}");
    assert_eq!(sub.requests().len(), 2);
    let reqs = primary.requests();
    assert_eq!(reqs.len(), 1);
}

#[tokio::test]
async fn an_answer_cut_at_max_tokens_gets_the_wrap_up_notice() {
    let primary = Scripted::new(vec![Say::CutCall, Say::Text("short")]);
    let f = fixture(&primary, None, |c| c.behavior.max_turns_per_message = 10);
    let (finish, _) = f.run("go").await;
    assert!(matches!(finish, Finish::Reply { .. }), "{finish:?}");
    let notice = last_notice(&primary.requests()[1]).expect("notice");
    assert!(notice.contains("max_tokens"), "{notice}");
    assert!(!notice.contains("Only 2"), "{notice}");
}

#[tokio::test]
async fn a_silent_token_is_a_silent_final_answer() {
    let primary = Scripted::new(vec![Say::Text("NO_REPLY")]);
    let f = fixture(&primary, None, |c| {
        c.behavior.silent_tokens = vec!["NO_REPLY".into()]
    });
    let (finish, _) = f.run("psst").await;
    assert!(
        matches!(finish, Finish::Reply { silent: true, .. }),
        "{finish:?}"
    );
    let (h, _) = f.session();
    let last = h
        .read_trail()
        .unwrap()
        .into_iter()
        .rev()
        .find_map(|l| match l.event {
            Event::Message(m) => Some(m),
            _ => None,
        })
        .unwrap();
    assert!(last.is_final && last.silent);
    assert_eq!(last.reply_to, ["m1"]);
}

/// Make every insert into the cost ledger fail, as a full disk would (`RAISE(FAIL)` in a
/// trigger, through a second connection), or let them through again.
fn cost_inserts_fail(f: &Fixture, fail: bool) {
    let conn = rusqlite::Connection::open(f._dir.path().join("state/agentd.db")).unwrap();
    let sql = if fail {
        "CREATE TRIGGER disk_full BEFORE INSERT ON costs BEGIN \
         SELECT RAISE(FAIL, 'database or disk is full'); END;"
    } else {
        "DROP TRIGGER disk_full;"
    };
    conn.execute_batch(sql).unwrap();
}

/// SPEC §16.4: a cost row that cannot be written is kept; while it cannot be written no
/// provider call is made and the user is told the disk is the problem; once the disk
/// recovers, the kept row is written before the next call.
#[tokio::test]
async fn no_provider_call_while_a_cost_row_cannot_be_written() {
    let primary = Scripted::new(vec![echo_call(), Say::Text("after recovery")]);
    let f = fixture(&primary, None, |_| {});
    cost_inserts_fail(&f, true);
    // The first call is made (nothing pending yet); its row cannot be written, so the second
    // call of the same message is not made.
    let (finish, _) = f.run("work").await;
    let Finish::Failed { reply, .. } = finish else {
        panic!("{finish:?}")
    };
    assert!(reply.contains("could not be written"), "{reply}");
    assert!(reply.contains("check the disk"), "{reply}");
    assert_eq!(primary.requests().len(), 1);
    // Still failing: the next message makes no call at all.
    let (finish, _) = f.run("again").await;
    assert!(
        matches!(&finish, Finish::Failed { reply, .. } if reply.contains("check the disk")),
        "{finish:?}"
    );
    assert_eq!(
        primary.requests().len(),
        1,
        "no call while the row is pending"
    );
    assert!(f.cost_rows().await.is_empty());
    // The disk recovers: the kept row is written first, then the message runs.
    cost_inserts_fail(&f, false);
    let (finish, _) = f.run("now").await;
    assert!(matches!(finish, Finish::Reply { .. }), "{finish:?}");
    assert_eq!(primary.requests().len(), 2);
    assert_eq!(
        f.cost_rows().await,
        [("primary-model".to_string(), 2)],
        "the kept row and the new call's row, each once"
    );
}

/// SPEC §16.4: a compaction inside a message (the request would not fit the context window)
/// counts toward `per_message_usd`: compaction ($0.002) + the first call ($0.002) reach the
/// $0.003 limit, so the second call is refused, though the loop's own calls cost only $0.002.
#[tokio::test]
async fn the_per_message_budget_counts_a_compaction_in_the_message() {
    let primary = Scripted::new(vec![
        Say::Text("first answer"),
        Say::Text("the summary"),
        echo_call(),
        Say::Text("never"),
    ]);
    let f = fixture(&primary, None, |c| c.budget.per_message_usd = 0.003);
    let (first, _) = f.run("first question").await;
    assert!(matches!(first, Finish::Reply { .. }), "{first:?}");
    // The last call reported a context far beyond the model's window: the next request must
    // be compacted before it is sent.
    let (h, mut state) = f.session();
    state.context_tokens = 1_000_000;
    let finish = f
        .agent
        .process(
            &h,
            &mut state,
            &work("second question"),
            "primary",
            &CancellationToken::new(),
        )
        .await;
    assert_eq!(state.compaction_count, 1, "compacted inside the message");
    let Finish::Failed { reply, .. } = finish else {
        panic!("{finish:?}")
    };
    assert!(reply.starts_with("per-message budget"), "{reply}");
    assert!(reply.contains("($0.004 spent on this message)"), "{reply}");
    let reqs = primary.requests();
    assert_eq!(
        reqs.len(),
        3,
        "first answer, summary, one call of the message"
    );
    assert!(reqs[1].tools.is_empty(), "the summary call has no tools");
    assert_eq!(f.cost_rows().await, [("primary-model".to_string(), 3)]);
}

/// An empty answer is asked again once, with a nudge the model reads as the last user turn;
/// an answer after it is the reply, and the empty one left no message in the history.
#[tokio::test]
async fn an_empty_answer_is_asked_again_once() {
    let primary = Scripted::new(vec![Say::Text("  \n"), Say::Text("here it is")]);
    let f = fixture(&primary, None, |_| {});
    let (finish, state) = f.run("hi").await;
    let Finish::Reply { text, cost_usd, .. } = finish else {
        panic!("{finish:?}")
    };
    assert_eq!(text, "here it is");
    // Both calls are billed to the message.
    assert!((cost_usd - 2.0 * CALL_USD).abs() < 1e-12, "{cost_usd}");
    let reqs = primary.requests();
    assert_eq!(reqs.len(), 2);
    match reqs[1].messages.last() {
        Some(Message::User { content }) => assert!(
            matches!(&content[0], crate::message::UserBlock::Text { text } if text == answer::EMPTY_ANSWER_NUDGE),
            "{content:?}"
        ),
        other => panic!("{other:?}"),
    }
    // user turn, nudge, answer: no empty assistant message.
    assert_eq!(state.messages.len(), 3, "{:?}", state.messages);
}

/// Two empty answers: the message fails (the failure path: the sender is told, the trail
/// has a failure, `agent-send --wait` exits non-zero).
#[tokio::test]
async fn two_empty_answers_fail_the_message() {
    let primary = Scripted::new(vec![Say::Text("")]);
    let f = fixture(&primary, None, |_| {});
    let (finish, _) = f.run("hi").await;
    let Finish::Failed { error, cause, .. } = finish else {
        panic!("{finish:?}")
    };
    assert!(error.contains("empty text twice"), "{error}");
    assert_eq!(cause, FailCause::Model);
    assert_eq!(primary.requests().len(), 2);
}

/// A compatible request's work asking for `format` (SPEC §17).
fn structured_work(text: &str, format: crate::message::call::OutputFormat) -> Work {
    let mut w = work(text);
    w.intakes[0].source = crate::control::Source::Api;
    w.intakes[0].route = Some(crate::session::Route::Api(
        crate::session::event::ApiRoute {
            options: crate::llm::CallOptions {
                format: Some(Box::new(format)),
                ..Default::default()
            },
            ..Default::default()
        },
    ));
    w
}

fn city_format() -> crate::message::call::OutputFormat {
    crate::message::call::OutputFormat::JsonSchema {
        name: "city".into(),
        schema: json!({"type": "object", "properties": {"name": {"type": "string"}},
                       "required": ["name"]}),
        strict: None,
        description: None,
    }
}

impl Fixture {
    async fn run_work(&self, w: &Work) -> (Finish, SessionState) {
        let (h, mut state) = self.session();
        let finish = self
            .agent
            .process(&h, &mut state, w, "primary", &CancellationToken::new())
            .await;
        (finish, state)
    }
}

/// The text of the last user turn of `req`.
fn last_user_note(req: &ChatRequest) -> String {
    match req.messages.last() {
        Some(Message::User { content }) => match &content[0] {
            crate::message::UserBlock::Text { text } => text.clone(),
            other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    }
}

/// Structured output: every call of the message carries the format (a tool turn is not
/// checked), and a fenced final answer is the reply without its fence.
#[tokio::test]
async fn a_structured_answer_is_checked_and_unfenced() {
    let primary = Scripted::new(vec![
        echo_call(),
        Say::Text("```json\n{\"name\": \"Oslo\"}\n```"),
    ]);
    let f = fixture(&primary, None, |_| {});
    let (finish, state) = f.run_work(&structured_work("a city", city_format())).await;
    let Finish::Reply { text, .. } = finish else {
        panic!("{finish:?}")
    };
    assert_eq!(text, "{\"name\": \"Oslo\"}");
    let reqs = primary.requests();
    assert_eq!(reqs.len(), 2);
    assert!(
        reqs.iter()
            .all(|r| r.options.format.as_deref() == Some(&city_format()))
    );
    let Some(Message::Assistant { text, .. }) = state.messages.last() else {
        panic!("{:?}", state.messages)
    };
    assert_eq!(
        text, "{\"name\": \"Oslo\"}",
        "the trail holds what the client got"
    );
}

/// An answer that does not fit is asked again once, with the reason as a user-side note in
/// the trail; the answer after it is the reply.
#[tokio::test]
async fn a_misfit_answer_is_asked_again_once_with_the_reason() {
    let primary = Scripted::new(vec![
        Say::Text("The city is Oslo."),
        Say::Text("{\"name\": \"Oslo\"}"),
    ]);
    let f = fixture(&primary, None, |_| {});
    let (finish, state) = f.run_work(&structured_work("a city", city_format())).await;
    let Finish::Reply { text, .. } = finish else {
        panic!("{finish:?}")
    };
    assert_eq!(text, "{\"name\": \"Oslo\"}");
    let reqs = primary.requests();
    assert_eq!(reqs.len(), 2);
    let note = last_user_note(&reqs[1]);
    assert!(note.starts_with(answer::FORMAT_NOTE), "{note}");
    assert!(note.contains("not JSON"), "{note}");
    // user turn, the misfit answer (not final), the note, the answer.
    assert_eq!(state.messages.len(), 4, "{:?}", state.messages);
}

/// Two answers that do not fit: the message fails as the model's failure, naming the reason.
#[tokio::test]
async fn two_misfit_answers_fail_the_message() {
    let primary = Scripted::new(vec![Say::Text("{\"town\": \"Oslo\"}")]);
    let f = fixture(&primary, None, |_| {});
    let (finish, _) = f.run_work(&structured_work("a city", city_format())).await;
    let Finish::Failed { error, cause, .. } = finish else {
        panic!("{finish:?}")
    };
    assert_eq!(cause, FailCause::Model);
    assert!(error.contains("also when asked again"), "{error}");
    assert!(error.contains("name"), "{error}");
    assert_eq!(primary.requests().len(), 2);
}

/// Without a format nothing is checked: prose is the reply.
#[tokio::test]
async fn without_a_format_prose_is_the_reply() {
    let primary = Scripted::new(vec![Say::Text("The city is Oslo.")]);
    let f = fixture(&primary, None, |_| {});
    let (finish, _) = f.run("a city").await;
    assert!(matches!(finish, Finish::Reply { .. }), "{finish:?}");
    assert_eq!(primary.requests()[0].options.format, None);
}

/// A session pinned to a model without `structured_output`: a structured request passes it
/// over for the route (checked when the request arrived); other work keeps the pin.
#[tokio::test]
async fn a_structured_request_passes_over_a_pinned_model_without_structured_output() {
    let (primary, sub) = (Scripted::new(vec![]), Scripted::new(vec![]));
    let f = fixture(&primary, Some(&sub), |cfg| {
        let mut s = (*cfg.models.loaded["subagent"]).clone();
        s.structured_output = false;
        cfg.models.loaded.insert("subagent".into(), Arc::new(s));
    });
    let structured = structured_work("a city", city_format());
    assert_eq!(f.agent.route_work(&structured, Some("subagent")), "primary");
    assert_eq!(
        f.agent.route_work(&work("hi"), Some("subagent")),
        "subagent"
    );
}
