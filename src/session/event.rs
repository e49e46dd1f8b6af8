//! The JSONL audit trail's event format (SPEC §7). One line = one `TrailLine`.
//!
//! Completion rules (SPEC §5.2, used by recovery and by `agent-send --wait`): an `intake` event
//! is complete once an assistant `message` with `final: true` or a `failure` lists its id in
//! `reply_to`. A user `message` lists in `reply_to` the intake ids its turn carries.

use serde::{Deserialize, Serialize};

use crate::message::call::{CallOptions, ClientTool, ClientToolChoice};
use crate::message::{Address, Message, ToolResult};

/// Format version of trail lines.
pub const TRAIL_VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrailLine {
    pub v: u32,
    /// Per-session sequence number, strictly increasing across the session's files.
    pub seq: u64,
    /// RFC 3339.
    pub ts: String,
    #[serde(flatten)]
    pub event: Event,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    /// First event of a session.
    Session {
        session_id: String,
        key: String,
        model: String,
    },
    /// Durable intake of one inbound item: written before the item is acknowledged.
    Intake(Intake),
    /// A conversation message (user turn or assistant response).
    Message(MessageEvent),
    /// Results of one batch of tool calls (one neutral `tool_results` message).
    ToolResult {
        results: Vec<ToolResult>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        notice: Option<String>,
    },
    /// A reply delivery (SPEC §16.1): `intent` (with the number of `parts`) before the first
    /// send; per part an `attempt` before it is sent and `sent` once the channel accepted it;
    /// `done`, `failed` or `unknown` closes it. (Trails written before the outbox have
    /// `intent` and `done`/`failed` without parts.)
    Delivery {
        reply_to: Vec<String>,
        channel: String,
        status: DeliveryStatus,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        detail: Option<String>,
        /// On `intent`: how many parts the reply is sent as.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        parts: Option<usize>,
        /// On `attempt`/`sent` (and a closing `failed`/`unknown`): which part, from 0.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        part: Option<usize>,
    },
    /// Processing of these intake ids failed; `reply` is what the sender was told.
    Failure {
        reply_to: Vec<String>,
        error: String,
        reply: String,
    },
    /// The oldest `removed` messages were replaced by `summary`.
    Compaction { summary: String, removed: usize },
    /// The session was reset (its files move to `.archive/` right after this event).
    Reset { reason: String },
    /// A tool call waits for a person's yes (SPEC §18.1).
    Approval(super::approval::ApprovalRequest),
    /// The decision on an `approval`, who gave it and through which channel.
    ApprovalDecision(super::approval::ApprovalDecided),
    /// The session's model was pinned (`model`), or given back to routing (`None`) (SPEC
    /// §18.2).
    SessionModel(SessionModelEvent),
    /// A skill was turned on or off for this session (SPEC §18.2).
    SessionSkill(SessionSkillEvent),
    /// A schedule entry's precheck exited 1: the job was skipped, no provider call (SPEC §20).
    Skipped(PrecheckEvent),
    /// A schedule entry's precheck let the job run (exit 0, or another outcome with a
    /// warning); written before the job's intake.
    Precheck(PrecheckEvent),
}

/// What a `[[schedule]]` precheck did (SPEC §20): the `skipped` and `precheck` events.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PrecheckEvent {
    /// The `[[schedule]]` entry's name.
    pub schedule: String,
    pub outcome: PrecheckOutcome,
    /// The command's exit code; none when it timed out or could not start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// How long it ran.
    pub ms: u64,
    /// `skipped` only: the estimated saving, the job's last cost in USD (none before it ever
    /// ran).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub saved_usd: Option<f64>,
}

/// A precheck's outcome: exit 0 `run`, exit 1 `skip`, anything else `warn` (the job runs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PrecheckOutcome {
    Run,
    Skip,
    Warn,
}

impl PrecheckOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            PrecheckOutcome::Run => "run",
            PrecheckOutcome::Skip => "skip",
            PrecheckOutcome::Warn => "warn",
        }
    }

    /// Exit 0 runs the job, exit 1 skips it, anything else (another code, a timeout, a
    /// sandbox that could not start: `None`) runs it with a warning.
    pub fn of_exit(code: Option<i32>) -> PrecheckOutcome {
        match code {
            Some(0) => PrecheckOutcome::Run,
            Some(1) => PrecheckOutcome::Skip,
            _ => PrecheckOutcome::Warn,
        }
    }
}

/// `session_model`: who pinned which model, through which channel.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionModelEvent {
    /// The model config name; none = `default`, routing decides again.
    pub model: Option<String>,
    /// Where the change came from: `telegram`, `http`, `fifo`.
    pub channel: String,
    /// The request's id (agent-send's line id), when it had one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
}

/// `session_skill`: a skill turned on or off for the session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionSkillEvent {
    pub name: String,
    pub enabled: bool,
    /// Where the change came from: `telegram`, `http`, `fifo`.
    pub channel: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Intake {
    /// Client-chosen id (agent-send: a UUID) or one the daemon assigned.
    pub id: String,
    /// Recorded as `user`, `system`, `telegram`, `http`, `terminal` or `scheduler`.
    pub source: crate::control::Source,
    /// Sender name (`--from`, contact name, ...).
    pub from: String,
    pub text: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attachments: Vec<String>,
    /// Where the reply goes when that is not implied by the source and sender (the chat a
    /// chat channel's message came from). Recorded so a restart delivers to the same place.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route: Option<Route>,
    /// A notification's `{source, ref, data}` as received (FIFO `notify`, HTTP `/notify`),
    /// for the webhook's `notify_meta` (SPEC §10.2). Recorded so a restart keeps it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notify_meta: Option<serde_json::Value>,
    /// A scheduled message (source `scheduler`) that another session scheduled for this one:
    /// that session's key. The message is delivered marked as coming from it, never as this
    /// conversation's assistant's own words (SPEC §14).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relayed_from: Option<String>,
}

/// A reply destination recorded with the intake: a chat on a chat channel, or the client of an
/// OpenAI- or Anthropic-compatible request (SPEC §17) with how it asked for the reply to be made.
///
/// On the wire both are one object tagged by `channel`: a chat is
/// `{"channel":"telegram","chat":"1001","thread"?:…,"message"?:"7"}` (any channel name but
/// [`API_CHANNEL`]), a compatible request `{"channel":"api", …ApiRoute}`. Trails written before
/// neutral addresses have Telegram chats as `{"channel":"telegram","chat_id":1001,
/// "message_id":7}` (numbers): read as the same chat.
#[derive(Debug, Clone, PartialEq)]
pub enum Route {
    /// A chat: replies go to `to`; `message` is the message being answered there, as the
    /// channel spells its ids (for reactions and reply threading).
    Chat {
        to: Address,
        message: Option<String>,
    },
    /// The HTTP answer of `/v1/chat/completions` or `/v1/messages`.
    Api(ApiRoute),
}

/// The `channel` of a compatible request's route; no chat channel may be named so.
pub const API_CHANNEL: &str = "api";

impl Route {
    /// The chat a message with this route is answered in, if it came from one.
    pub fn address(&self) -> Option<&Address> {
        match self {
            Route::Chat { to, .. } => Some(to),
            Route::Api(_) => None,
        }
    }

    /// The id of the message this route answers, on its channel.
    pub fn message(&self) -> Option<&str> {
        match self {
            Route::Chat { message, .. } => message.as_deref(),
            Route::Api(_) => None,
        }
    }
}

/// A chat route as written.
#[derive(Serialize)]
struct ChatOut<'a> {
    channel: &'a str,
    chat: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    thread: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<&'a str>,
}

/// A compatible request's route as written.
#[derive(Serialize)]
struct ApiOut<'a> {
    channel: &'static str,
    #[serde(flatten)]
    route: &'a ApiRoute,
}

/// A chat route as read: today's fields, or the release before neutral addresses' numeric
/// `chat_id` / `message_id` (Telegram's).
#[derive(Deserialize)]
struct ChatIn {
    channel: String,
    #[serde(default)]
    chat: Option<String>,
    #[serde(default)]
    thread: Option<String>,
    #[serde(default)]
    message: Option<String>,
    #[serde(default)]
    chat_id: Option<i64>,
    #[serde(default)]
    message_id: Option<i64>,
}

impl Serialize for Route {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Route::Chat { to, message } => ChatOut {
                channel: &to.channel,
                chat: &to.chat,
                thread: to.thread.as_deref(),
                message: message.as_deref(),
            }
            .serialize(s),
            Route::Api(route) => ApiOut {
                channel: API_CHANNEL,
                route,
            }
            .serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for Route {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Route, D::Error> {
        use serde::de::Error;
        let v = serde_json::Value::deserialize(d)?;
        if v.get("channel").and_then(serde_json::Value::as_str) == Some(API_CHANNEL) {
            return ApiRoute::deserialize(v)
                .map(Route::Api)
                .map_err(D::Error::custom);
        }
        let c = ChatIn::deserialize(v).map_err(D::Error::custom)?;
        let chat = match (c.chat, c.chat_id) {
            (Some(chat), _) => chat,
            (None, Some(id)) => id.to_string(),
            (None, None) => return Err(D::Error::missing_field("chat")),
        };
        Ok(Route::Chat {
            to: Address {
                channel: c.channel,
                chat,
                thread: c.thread,
            },
            message: c.message.or(c.message_id.map(|m| m.to_string())),
        })
    }
}

/// What a compatible request asked for (SPEC §17), recorded with its intake so that a message
/// resumed after a restart is made the same way.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ApiRoute {
    /// The model config name of `agentd:<name>`; none = the source's route.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The client's system text: client instructions in the dynamic context.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<String>,
    /// A one-off session's history (the request's earlier messages), recorded before the user
    /// turn.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<Message>,
    #[serde(default, skip_serializing_if = "CallOptions::is_empty")]
    pub options: CallOptions,
    /// A one-off session (no session key in the request): archived once answered, and never
    /// consolidated into long-term memory.
    #[serde(default, skip_serializing_if = "is_false")]
    pub one_off: bool,
    /// SHA-256 (hex) of the request body, for a request with an `Idempotency-Key`: a retry
    /// is answered from this message only when its body has the same digest, also after a
    /// restart. Absent in trails written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_digest: Option<String>,
    /// A Responses request with `store: false`: its answer cannot be continued with
    /// `previous_response_id`.
    #[serde(default, skip_serializing_if = "is_false")]
    pub unstored: bool,
    /// The client's function tools, offered to the model beside the agent's own for this
    /// message only (SPEC §17).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<ClientTool>,
    /// The client's `tool_choice`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<ClientToolChoice>,
    /// The results of the client's tools this request brings: the answers to the session's
    /// open client calls, recorded (as untrusted content) before the loop goes on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_results: Vec<ToolResult>,
}

/// The key prefix of one-off sessions of the compatible endpoints (SPEC §17).
pub const ONE_OFF_PREFIX: &str = "api-once-";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MessageEvent {
    #[serde(flatten)]
    pub message: Message,
    /// User turn: the intake ids it carries. Final assistant message: the ids it answers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reply_to: Vec<String>,
    /// Assistant only: this is the reply (no further calls for this turn).
    #[serde(default, rename = "final", skip_serializing_if = "is_false")]
    pub is_final: bool,
    /// Assistant final only: the reply matched a silent token and is not delivered.
    #[serde(default, skip_serializing_if = "is_false")]
    pub silent: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// Assistant only: config name of the model that answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<String>,
    /// Assistant only: loop turn (1-based) within the message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn: Option<u32>,
    /// Assistant only: how many messages the request that produced it carried (restores the
    /// cache breakpoint position on rebuild).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sent_messages: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_usd: Option<f64>,
    /// Assistant only: the config name of the model asked for, when `model` answered as its
    /// fallback (SPEC §18.3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback_from: Option<String>,
    /// Assistant only, with `fallback_from`: why that model did not answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback_reason: Option<String>,
    /// Final assistant message only: what the whole message cost, every cost row billed to it
    /// (its calls, its sub-agents', compactions, embeddings): what its reply reports. Absent
    /// in trails written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_cost_usd: Option<f64>,
    /// Final assistant message only: the tokens of those rows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_usage: Option<crate::message::Usage>,
    /// Final assistant message only: the ids of its calls that are a compatible endpoint's
    /// client tools (SPEC §17). The turn ended on them; they stay open until the client's
    /// next request brings their results.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub client_calls: Vec<String>,
}

impl MessageEvent {
    pub fn new(message: Message) -> Self {
        MessageEvent {
            message,
            reply_to: Vec::new(),
            is_final: false,
            silent: false,
            source: None,
            from: None,
            model: None,
            stop_reason: None,
            turn: None,
            sent_messages: None,
            cost_usd: None,
            fallback_from: None,
            fallback_reason: None,
            message_cost_usd: None,
            message_usage: None,
            client_calls: Vec::new(),
        }
    }

    /// Whether this message starts the work of the intakes in `reply_to`: their user turn,
    /// or the results of a compatible endpoint's client tools that open it (SPEC §17).
    pub fn starts_work(&self) -> bool {
        !self.reply_to.is_empty()
            && matches!(
                self.message,
                Message::User { .. } | Message::ToolResults { .. }
            )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryStatus {
    Intent,
    Attempt,
    Sent,
    Done,
    Failed,
    /// The channel may or may not have delivered a part (a timeout after the request was
    /// written); it is never sent again.
    Unknown,
}

impl DeliveryStatus {
    /// `done`, `failed` and `unknown` close a delivery.
    pub fn closes(self) -> bool {
        matches!(
            self,
            DeliveryStatus::Done | DeliveryStatus::Failed | DeliveryStatus::Unknown
        )
    }
}

fn is_false(b: &bool) -> bool {
    !*b
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{ToolCall, Usage};

    fn roundtrip(e: Event) {
        let line = TrailLine {
            v: TRAIL_VERSION,
            seq: 7,
            ts: "2026-11-03T14:05:00+01:00".into(),
            event: e,
        };
        let s = serde_json::to_string(&line).unwrap();
        let back: TrailLine = serde_json::from_str(&s).unwrap();
        assert_eq!(back, line, "{s}");
    }

    #[test]
    fn every_event_roundtrips() {
        roundtrip(Event::Session {
            session_id: "s".into(),
            key: "alice".into(),
            model: "primary".into(),
        });
        roundtrip(Event::Intake(Intake {
            id: "i1".into(),
            source: crate::control::Source::User,
            from: "alice".into(),
            text: "hi".into(),
            tier: Some("full".into()),
            attachments: vec![],
            route: None,
            notify_meta: None,
            relayed_from: None,
        }));
        roundtrip(Event::Intake(Intake {
            id: "idem-1".into(),
            source: crate::control::Source::Api,
            from: "sdk".into(),
            text: "what is my name?".into(),
            tier: None,
            attachments: vec![],
            route: Some(Route::Api(ApiRoute {
                model: Some("cheap".into()),
                instructions: Some("Be brief.".into()),
                history: vec![Message::user_text("my name is Zed")],
                options: CallOptions {
                    max_tokens: Some(100),
                    format: Some(Box::new(crate::message::call::OutputFormat::JsonSchema {
                        name: "name".into(),
                        schema: serde_json::json!({"type": "object"}),
                        strict: None,
                        description: None,
                    })),
                    ..Default::default()
                },
                one_off: true,
                request_digest: Some("ab12".into()),
                unstored: true,
                ..ApiRoute::default()
            })),
            notify_meta: None,
            relayed_from: None,
        }));
        let mut m = MessageEvent::new(Message::Assistant {
            text: "ok".into(),
            tool_calls: vec![ToolCall {
                id: "t1".into(),
                name: "read".into(),
                arguments: serde_json::json!({"path":"a"}),
            }],
            thinking: vec![],
            usage: Some(Usage {
                input_tokens: 1,
                output_tokens: 2,
                cache_read_tokens: 3,
                cache_write_tokens: 4,
                cache_write_1h_tokens: 0,
            }),
        });
        m.is_final = true;
        m.reply_to = vec!["i1".into()];
        m.sent_messages = Some(3);
        m.model = Some("local".into());
        m.fallback_from = Some("primary".into());
        m.fallback_reason = Some("provider returned 529: overloaded".into());
        roundtrip(Event::Message(m));
        roundtrip(Event::Message(MessageEvent::new(Message::user_text(
            "hello",
        ))));
        roundtrip(Event::ToolResult {
            results: vec![ToolResult {
                tool_call_id: "t1".into(),
                content: "x".into(),
                is_error: true,
                images: Vec::new(),
            }],
            notice: Some("wrap up".into()),
        });
        roundtrip(Event::Delivery {
            reply_to: vec!["i1".into()],
            channel: "telegram".into(),
            status: DeliveryStatus::Intent,
            detail: None,
            parts: Some(2),
            part: None,
        });
        roundtrip(Event::Delivery {
            reply_to: vec!["i1".into()],
            channel: "telegram".into(),
            status: DeliveryStatus::Sent,
            detail: None,
            parts: None,
            part: Some(1),
        });
        roundtrip(Event::Failure {
            reply_to: vec!["i1".into()],
            error: "e".into(),
            reply: "sorry".into(),
        });
        roundtrip(Event::Compaction {
            summary: "s".into(),
            removed: 4,
        });
        roundtrip(Event::Reset {
            reason: "agent-send".into(),
        });
        roundtrip(Event::SessionModel(SessionModelEvent {
            model: Some("cheap".into()),
            channel: "telegram".into(),
            id: None,
        }));
        roundtrip(Event::SessionModel(SessionModelEvent {
            model: None,
            channel: "fifo".into(),
            id: Some("u-1".into()),
        }));
        roundtrip(Event::SessionSkill(SessionSkillEvent {
            name: "weather".into(),
            enabled: false,
            channel: "http".into(),
            id: None,
        }));
    }

    #[test]
    fn chat_routes_are_neutral_and_read_the_release_before() {
        let route = Route::Chat {
            to: Address::new("telegram", "-100200").in_thread("7"),
            message: Some("42".into()),
        };
        let v = serde_json::to_value(&route).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"channel": "telegram", "chat": "-100200", "thread": "7", "message": "42"})
        );
        assert_eq!(serde_json::from_value::<Route>(v).unwrap(), route);
        let room = Route::Chat {
            to: Address::new("matrix", "!abc:example.org"),
            message: None,
        };
        let v = serde_json::to_value(&room).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"channel": "matrix", "chat": "!abc:example.org"})
        );
        assert_eq!(serde_json::from_value::<Route>(v).unwrap(), room);
        // A trail line of the release before neutral addresses.
        let old = r#"{"v":1,"seq":2,"ts":"2026-12-07T06:12:51.777+00:00","type":"intake","id":"tg-123456-100000","source":"telegram","from":"Alice","text":"hello","route":{"channel":"telegram","chat_id":1001,"message_id":1}}"#;
        let line: TrailLine = serde_json::from_str(old).unwrap();
        let Event::Intake(i) = line.event else {
            panic!("{line:?}")
        };
        assert_eq!(
            i.route,
            Some(Route::Chat {
                to: Address::new("telegram", "1001"),
                message: Some("1".into())
            })
        );
        let err = serde_json::from_value::<Route>(serde_json::json!({"channel": "telegram"}));
        assert!(err.unwrap_err().to_string().contains("chat"));
        // A compatible request's route keeps its shape.
        let api = serde_json::json!({"channel": "api", "model": "cheap", "one_off": true});
        let r: Route = serde_json::from_value(api.clone()).unwrap();
        assert!(matches!(&r, Route::Api(a) if a.one_off && a.model.as_deref() == Some("cheap")));
        assert_eq!(serde_json::to_value(&r).unwrap(), api);
    }

    #[test]
    fn wire_shape_is_flat() {
        let line = TrailLine {
            v: 1,
            seq: 1,
            ts: "t".into(),
            event: Event::Message(MessageEvent::new(Message::user_text("hi"))),
        };
        let v = serde_json::to_value(&line).unwrap();
        assert_eq!(v["type"], "message");
        assert_eq!(v["role"], "user");
        assert_eq!(v["content"][0]["text"], "hi");
    }
}
