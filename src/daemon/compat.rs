//! The daemon side of the OpenAI- and Anthropic-compatible endpoints (SPEC §17): which
//! session a request goes to (a persistent `api:<KEY>` or a one-off `api-once-…`), the intake
//! id (`Idempotency-Key`, so a client's retry is recorded once and answered from the same
//! message), the intake itself (source `api`, images saved as attachments, the request's
//! choices on its `Route::Api`), and the wait for the answer, which runs in a task of its
//! own: a client that goes away never stops it.

use std::collections::VecDeque;
use std::sync::Mutex;

use futures::future::BoxFuture;
use tokio::sync::oneshot;

use super::http_backend::{AttachmentSaver, DaemonBackend, backend_error};
use crate::agent::{FailCause, Finish};
use crate::api::backend::{AttachmentIn, BackendError, CompatIn, CompatOutcome, CompatTicket};
use crate::channels::intake::Completion;
use crate::control::Source;
use crate::llm::compat::{
    self, Api, CompatAttachment, CompatReply, CompatRequest, ErrorKind, FinishReason, Invalid,
    ModelChoice, OutputFormat,
};
use crate::message::{Message, Usage};
use crate::session::event::{ApiRoute, ONE_OFF_PREFIX};
use crate::session::{Ending, Event, Intake, Route, TrailLine};

/// The longest session name kept as it is in `api:<KEY>` (the key is at most 64 characters);
/// a longer one, or one with control characters or slashes, is hashed.
pub const MAX_SESSION_NAME: usize = 60;

/// How many answers to requests with an `Idempotency-Key` are remembered, so a retry that
/// comes after a one-off session was archived is still answered from the same message.
pub const RECENT_ANSWERS: usize = 256;

/// The session key for a client's session name: `api:<name>`, or `api:h-<hash>` for a name
/// that is too long or has characters a key may not have. `None` for an empty name.
pub fn session_key(name: &str) -> Option<String> {
    let name = name.trim();
    if name.is_empty() {
        return None;
    }
    let plain = name.chars().count() <= MAX_SESSION_NAME
        && !name
            .chars()
            .any(|c| c.is_control() || c == '/' || c == '\\');
    Some(if plain {
        format!("api:{name}")
    } else {
        format!("api:h-{}", &hex(name)[..32])
    })
}

/// The key of a one-off session: from the `Idempotency-Key` when there is one (a retry finds
/// the same session), else fresh.
pub fn one_off_key(idempotency_key: Option<&str>) -> String {
    match idempotency_key {
        Some(k) => format!("{ONE_OFF_PREFIX}{}", &hex(k)[..32]),
        None => format!("{ONE_OFF_PREFIX}{}", uuid::Uuid::now_v7().simple()),
    }
}

fn hex(s: &str) -> String {
    crate::llm::compat::sha256_hex(s.as_bytes())
}

/// An `Idempotency-Key` as an intake id: the rule of client ids (`control::valid_id`, 1 to
/// 128 characters of `A-Z a-z 0-9 . _ : -`).
pub fn idempotency_id(key: &str) -> Result<String, String> {
    if crate::control::valid_id(key) {
        Ok(key.to_string())
    } else {
        Err(format!(
            "Idempotency-Key must be 1 to {} characters of A-Z, a-z, 0-9, '.', '_', ':' or '-' (a UUID works), got {}",
            crate::control::MAX_ID_LEN,
            crate::control::escaped_preview(key)
        ))
    }
}

/// What an `Idempotency-Key` is bound to: the session its request went to and the SHA-256 of
/// its body. A request with the same key and another binding is refused (409), never answered
/// from the first request's message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binding {
    pub session: String,
    pub digest: String,
}

/// One keyed request: its binding, and its answer once there is one.
struct Entry {
    key: String,
    binding: Binding,
    outcome: Option<CompatOutcome>,
}

/// The message of a 409 for a reused key (it names neither the other session nor its body).
fn reused(key: &str) -> BackendError {
    BackendError::Conflict(format!(
        "Idempotency-Key {} was already used for another request (another body or session); a retry must send the same body to the same session, a new request needs a new key",
        crate::control::escaped_preview(key)
    ))
}

/// The keyed requests of this run, newest last, bounded: those in flight (so a concurrent
/// reuse of a key is refused) and the answers of recent ones (so a retry that comes after a
/// one-off session was archived is still answered from the same message).
#[derive(Default)]
pub struct RecentAnswers(Mutex<VecDeque<Entry>>);

impl RecentAnswers {
    fn list(&self) -> std::sync::MutexGuard<'_, VecDeque<Entry>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Bind `key` to `binding`, or check it against the binding it has: `Ok(Some)` the answer
    /// already made, `Ok(None)` go on (new, or the same request still in flight), `Err` the
    /// key belongs to another request.
    fn claim(&self, key: &str, binding: &Binding) -> Result<Option<CompatOutcome>, BackendError> {
        let mut list = self.list();
        if let Some(e) = list.iter().find(|e| e.key == key) {
            return if e.binding == *binding {
                Ok(e.outcome.clone())
            } else {
                Err(reused(key))
            };
        }
        Self::make_room(&mut list);
        list.push_back(Entry {
            key: key.to_string(),
            binding: binding.clone(),
            outcome: None,
        });
        Ok(None)
    }

    /// Drop the oldest answered entry when full (the oldest of all when none is answered).
    fn make_room(list: &mut VecDeque<Entry>) {
        if list.len() < RECENT_ANSWERS {
            return;
        }
        let at = list.iter().position(|e| e.outcome.is_some()).unwrap_or(0);
        list.remove(at);
    }

    /// Forget a claim whose request was not accepted (nothing recorded: the key is free).
    fn release(&self, key: &str, binding: &Binding) {
        self.list()
            .retain(|e| !(e.key == key && e.binding == *binding && e.outcome.is_none()));
    }

    #[cfg(test)]
    fn get(&self, key: &str, binding: &Binding) -> Option<CompatOutcome> {
        self.list()
            .iter()
            .find(|e| e.key == key && e.binding == *binding)
            .and_then(|e| e.outcome.clone())
    }

    fn put(&self, key: &str, binding: &Binding, outcome: CompatOutcome) {
        let mut list = self.list();
        list.retain(|e| e.key != key);
        Self::make_room(&mut list);
        list.push_back(Entry {
            key: key.to_string(),
            binding: binding.clone(),
            outcome: Some(outcome),
        });
    }
}

/// Whether intake `id` recorded in `lines` is the request bound by `binding`: its recorded
/// digest is the same, or (an intake recorded before digests were) its text is `text`.
/// `None` when `id` is not in the trail.
pub fn recorded_matches(lines: &[TrailLine], id: &str, digest: &str, text: &str) -> Option<bool> {
    lines.iter().find_map(|l| match &l.event {
        Event::Intake(i) if i.id == id => Some(match &i.route {
            Some(Route::Api(ApiRoute {
                request_digest: Some(d),
                ..
            })) => d == digest,
            _ => i.text == text,
        }),
        _ => None,
    })
}

/// What the answer says besides the text: the id and `model` the client sees, and when.
struct Answering {
    id: String,
    /// The session that takes the message (known once it is accepted).
    session_id: String,
    model: String,
    created: i64,
}

impl Answering {
    /// A finished message as the client's outcome.
    fn outcome(&self, finish: Finish) -> CompatOutcome {
        match finish {
            Finish::Reply {
                text,
                silent,
                usage,
                truncated,
                client_calls,
                ..
            } => CompatOutcome::Reply(CompatReply {
                id: self.id.clone(),
                session_id: self.session_id.clone(),
                model: self.model.clone(),
                created: self.created,
                // A silent reply (the agent chose not to answer) is an empty answer.
                text: if silent { String::new() } else { text },
                finish: if !client_calls.is_empty() {
                    FinishReason::ToolCalls
                } else if truncated {
                    FinishReason::Length
                } else {
                    FinishReason::Stop
                },
                calls: client_calls,
                usage,
            }),
            Finish::Failed {
                reply,
                error,
                cause,
            } => CompatOutcome::Failed {
                kind: match cause {
                    FailCause::Budget => ErrorKind::Budget,
                    FailCause::Model => ErrorKind::Upstream,
                    FailCause::Other => ErrorKind::Internal,
                },
                message: if reply == error {
                    error
                } else {
                    format!("{reply} ({error})")
                },
            },
            Finish::Cancelled => CompatOutcome::Failed {
                kind: ErrorKind::Interrupted,
                message: "interrupted by a shutdown: the message resumes after the restart and its reply lands in the session trail and the webhook".into(),
            },
        }
    }
}

/// How intake `id` ended, read back from its session's trail (a duplicate of a message that
/// is already done): the final answer with the usage of every call of its turn, or the
/// failure. `None` while it is still running.
pub fn recorded_finish(lines: &[TrailLine], id: &str) -> Option<Finish> {
    let mut usage = Usage::default();
    let mut cost = 0.0;
    let mut ours = false;
    for l in lines {
        // The usage of every call of the turn, for trails written before the final answer
        // carried the message's totals.
        match &l.event {
            Event::Message(m) if m.message.is_user() || m.starts_work() => {
                ours = m.reply_to.iter().any(|r| r == id);
                usage = Usage::default();
                cost = 0.0;
            }
            Event::Message(m) if ours => {
                if let Message::Assistant { usage: Some(u), .. } = &m.message {
                    usage.add(u);
                }
                cost += m.cost_usd.unwrap_or(0.0);
            }
            _ => {}
        }
        let Some((ids, end)) = crate::session::ending(&l.event) else {
            continue;
        };
        if !ids.iter().any(|r| r == id) {
            continue;
        }
        return Some(match end {
            Ending::Reply { text, event: m } => Finish::Reply {
                text: text.to_string(),
                silent: m.silent,
                // Every cost row of the message, when recorded (sub-agents too).
                usage: m.message_usage.unwrap_or(usage),
                cost_usd: m.message_cost_usd.unwrap_or(cost),
                truncated: m.stop_reason.as_deref() == Some("max_tokens"),
                fallback: m.fallback_from.as_ref().map(|from| crate::llm::FellBack {
                    from: from.clone(),
                    to: m.model.clone().unwrap_or_default(),
                    reason: m.fallback_reason.clone().unwrap_or_default(),
                }),
                client_calls: m
                    .message
                    .tool_calls()
                    .iter()
                    .filter(|c| m.client_calls.contains(&c.id))
                    .cloned()
                    .collect(),
            },
            Ending::Failed { reply, error } => Finish::Failed {
                reply: reply.to_string(),
                error: error.to_string(),
                cause: FailCause::Other,
            },
        });
    }
    None
}

/// The session a request goes to, the intake's `from`, and whether it is a one-off: the
/// client's session name as `api:<name>`, else a one-off session.
fn session_target(name: Option<&str>, idempotency_key: Option<&str>) -> (String, String, bool) {
    match name.and_then(session_key) {
        Some(key) => {
            let from = key.trim_start_matches("api:").to_string();
            (key, from, false)
        }
        None => (one_off_key(idempotency_key), "api".into(), true),
    }
}

/// The wait for the answer, in a task of its own (a client that goes away never stops the
/// work): the finish already in the trail (`replay`) or the one `waiter` is told. An answer
/// to a request with an `Idempotency-Key` is remembered for its retries.
fn answer(
    recent: std::sync::Arc<RecentAnswers>,
    answering: Answering,
    replay: Option<Finish>,
    waiter: oneshot::Receiver<Completion>,
    remember: Option<(String, Binding)>,
) -> BoxFuture<'static, Result<CompatOutcome, BackendError>> {
    let (tx, rx) = oneshot::channel();
    tokio::spawn(async move {
        let outcome = match replay {
            Some(finish) => Ok(answering.outcome(finish)),
            None => match waiter.await {
                Ok(Completion { finish, .. }) => Ok(answering.outcome(finish)),
                Err(_) => Err(BackendError::Unavailable(
                    "agentd stopped before the message was done; it resumes after the restart"
                        .into(),
                )),
            },
        };
        if let (Some((k, binding)), Ok(o)) = (remember, &outcome) {
            recent.put(&k, &binding, o.clone());
        }
        let _ = tx.send(outcome);
    });
    Box::pin(async move {
        rx.await
            .unwrap_or_else(|_| Err(BackendError::Internal("the answer task ended early".into())))
    })
}

impl DaemonBackend {
    /// `ApiBackend::compat`.
    pub(super) async fn compat_accept(&self, req: CompatIn) -> Result<CompatTicket, BackendError> {
        let CompatIn {
            api,
            request: mut r,
            session_header,
            idempotency_key,
            body_digest,
            ..
        } = req;
        let id = match &idempotency_key {
            Some(k) => idempotency_id(k).map_err(BackendError::BadRequest)?,
            None => uuid::Uuid::now_v7().to_string(),
        };
        let mut answering = Answering {
            id: id.clone(),
            session_id: String::new(),
            model: r.model.clone(),
            created: chrono::Utc::now().timestamp(),
        };
        let name = session_header.or(r.session.clone());
        let mut history = std::mem::take(&mut r.history);
        let (key, from, one_off) = self
            .destination(
                name.as_deref(),
                idempotency_key.as_deref(),
                r.continuation.previous_response.as_deref(),
                &mut history,
            )
            .await?;
        let binding = Binding {
            session: key.clone(),
            digest: body_digest,
        };
        if let Some(k) = idempotency_key.as_deref()
            && let Some(ticket) = self.answered_before(k, &binding, &id, &r.text).await?
        {
            return Ok(ticket);
        }
        let release = |e: BackendError| {
            if let Some(k) = idempotency_key.as_deref() {
                self.recent.release(k, &binding);
            }
            e
        };
        self.check_client_tools(&r, &history, &key, one_off)
            .await
            .map_err(release)?;
        let stream = r.stream;
        let model = self.routed_model(&r.model).map_err(release)?;
        if let Some(format) = &r.options.format {
            self.check_format(api, format, model.as_deref())
                .map_err(release)?;
        }
        let attachments = self
            .save_attachments(&r.attachments)
            .await
            .map_err(release)?;
        let intake = Intake {
            id: id.clone(),
            source: Source::Api,
            from,
            text: r.text,
            tier: None,
            attachments,
            route: Some(Route::Api(ApiRoute {
                model,
                instructions: r.system,
                history: if one_off { history } else { Vec::new() },
                options: r.options,
                one_off,
                request_digest: idempotency_key.as_ref().map(|_| binding.digest.clone()),
                unstored: !r.continuation.store,
                tools: r.tools,
                tool_choice: r.tool_choice,
                tool_results: r.tool_results.into_iter().map(|t| t.result).collect(),
            })),
            notify_meta: None,
            relayed_from: None,
        };
        let (sink, deltas) = stream.then(tokio::sync::mpsc::unbounded_channel).unzip();
        let super::http_backend::Waited {
            new,
            session_id,
            waiter,
        } = match self.accept_waited(&key, intake, sink).await {
            Ok(w) => w,
            Err(e) => return Err(release(backend_error(e))),
        };
        let replay = if new {
            None
        } else {
            self.finished_in_trail(&key, &id).await
        };
        if replay.is_some() {
            // Done already: nobody will be told again, so the waiter (and any sink) would
            // stay registered for good.
            self.dispatcher.forget(&key, &id);
        }
        let remember = idempotency_key.map(|k| (k, binding));
        answering.session_id = session_id.clone();
        Ok(CompatTicket {
            id,
            session_id,
            done: answer(self.recent.clone(), answering, replay, waiter, remember),
            deltas,
        })
    }

    /// A retry of a request with `Idempotency-Key` `k`: its remembered answer, or `reused`
    /// when the key is recorded (before a restart) with another request; `None`: go on.
    async fn answered_before(
        &self,
        k: &str,
        binding: &Binding,
        id: &str,
        text: &str,
    ) -> Result<Option<CompatTicket>, BackendError> {
        if let Some(outcome) = self.recent.claim(k, binding)? {
            tracing::info!(id = %id, "compatible request answered again from its recorded answer");
            return Ok(Some(ready(id.to_string(), outcome)));
        }
        // After a restart the binding is the one recorded with the intake.
        let key = &binding.session;
        if self
            .recorded_elsewhere(key, id, &binding.digest, text)
            .await
        {
            self.recent.release(k, binding);
            tracing::warn!(id = %id, session_key = %key, "Idempotency-Key reused for another request; refused");
            return Err(reused(k));
        }
        Ok(None)
    }

    /// A request's client tools and tool results against the session (SPEC §17): a client
    /// tool may not take the name of one of agentd's own tools (the registry's, MCP tools
    /// included); a result must answer a call still open in the session it goes to (a
    /// one-off session: the calls at the end of the request's own messages).
    async fn check_client_tools(
        &self,
        r: &CompatRequest,
        history: &[Message],
        key: &str,
        one_off: bool,
    ) -> Result<(), BackendError> {
        let bad = |i: Invalid| BackendError::BadField {
            param: i.param.unwrap_or_else(|| "messages".into()),
            message: i.message,
        };
        if !r.tools.is_empty() {
            compat::check_clash(&r.tools, &self.tools.names()).map_err(bad)?;
        }
        if r.tool_results.is_empty() {
            return Ok(());
        }
        let (open, whose) = if one_off {
            (compat::open_calls(history), "the request's messages")
        } else {
            (
                self.open_client_calls(key).await?,
                "this session (the client calls its last answer made)",
            )
        };
        compat::check_results(&r.tool_results, &open, whose).map_err(bad)
    }

    /// The client calls open in session `key` (none for a session not yet created), read
    /// from its snapshot and trail.
    async fn open_client_calls(&self, key: &str) -> Result<Vec<String>, BackendError> {
        let (store, key) = (self.intake.store.clone(), key.to_string());
        tokio::task::spawn_blocking(move || {
            let Some(session) = store.get(&key)? else {
                return Ok(Vec::new());
            };
            crate::session::current_state(session.dir(), &session.id, &key)
                .map(|s| s.open_client_calls)
        })
        .await
        .map_err(|e| BackendError::Internal(e.to_string()))?
        .map_err(|e: std::io::Error| {
            BackendError::Internal(format!("cannot read the session's state: {e}"))
        })
    }

    /// The model a request names: `None` for `agentd` (routed), the name for a loaded
    /// `agentd:<name>`, else `NotFound` naming the loaded ones.
    fn routed_model(&self, asked: &str) -> Result<Option<String>, BackendError> {
        match ModelChoice::of(asked) {
            ModelChoice::Routed => Ok(None),
            ModelChoice::Named(name) if self.cfg.models.get(&name).is_some() => Ok(Some(name)),
            ModelChoice::Named(name) => Err(BackendError::NotFound(format!(
                "model {:?} is not loaded: use \"agentd\" or one of {} (GET /v1/models)",
                format!("agentd:{}", name.chars().take(60).collect::<String>()),
                self.cfg
                    .models
                    .loaded
                    .keys()
                    .map(|n| format!("\"agentd:{n}\""))
                    .collect::<Vec<_>>()
                    .join(", ")
            ))),
        }
    }

    /// A structured-output request (SPEC §17) before it is recorded: refused (400 naming the
    /// field) when the model it runs on (its `agentd:<name>`, else the `api` route; a pinned
    /// or vision model without `structured_output` is passed over then, `route_work`) cannot
    /// take a format, or when its schema cannot be checked (`tools::arg_schema` bounds its
    /// depth and size).
    fn check_format(
        &self,
        api: Api,
        format: &OutputFormat,
        named: Option<&str>,
    ) -> Result<(), BackendError> {
        let param = match api {
            Api::OpenAi => "response_format",
            Api::Anthropic => "output_config.format",
            Api::Responses => "text.format",
        };
        let name = named.map_or_else(
            || crate::agent::route_source(&self.cfg, "api"),
            str::to_string,
        );
        if let Some(spec) = self.cfg.models.get(&name)
            && !spec.structured_output
        {
            let file = match spec.provider.as_str() {
                crate::config::INLINE_PROVIDER => "agentd.toml".to_string(),
                p => format!("providers.d/{p}.toml"),
            };
            return Err(BackendError::BadField {
                param: param.into(),
                message: format!(
                    "structured output is not supported by model {name:?} (provider {:?}, model {:?}): it has structured_output = false; ask another model (\"agentd:<name>\", GET /v1/models), or set structured_output = true on [models.{name}] in {file} if the provider takes {param}",
                    spec.provider, spec.model
                ),
            });
        }
        if let OutputFormat::JsonSchema { schema, .. } = format
            && let Err(e) = crate::tools::arg_schema::ArgSchema::compile(schema)
        {
            return Err(BackendError::BadField {
                param: match api {
                    Api::OpenAi => "response_format.json_schema.schema".into(),
                    Api::Anthropic | Api::Responses => format!("{param}.schema"),
                },
                message: format!("the schema cannot be used to check the answer: {e}"),
            });
        }
        Ok(())
    }

    /// Save a request's images and sounds into `inbox/`; their paths for the intake.
    async fn save_attachments(
        &self,
        attachments: &[CompatAttachment],
    ) -> Result<Vec<String>, BackendError> {
        let saver = AttachmentSaver {
            inbox: self.cfg.paths.state_dir.join("inbox"),
        };
        let list: Vec<AttachmentIn> = attachments
            .iter()
            .map(|i| AttachmentIn {
                content_type: i.media_type.clone(),
                data: i.data.clone(),
                filename: None,
            })
            .collect();
        let file_id = format!("api-{}", uuid::Uuid::now_v7());
        tokio::task::spawn_blocking(move || saver.save(&file_id, &list))
            .await
            .map_err(|e| BackendError::Internal(e.to_string()))?
    }

    /// Whether intake `id` is already recorded in session `key` for another request (another
    /// body digest). Read from the trail only when the session has that id.
    async fn recorded_elsewhere(&self, key: &str, id: &str, digest: &str, text: &str) -> bool {
        let store = self.intake.store.clone();
        let (key, id, digest, text) = (
            key.to_string(),
            id.to_string(),
            digest.to_string(),
            text.to_string(),
        );
        tokio::task::spawn_blocking(move || {
            if !store.has_intake(&key, &id).ok()? {
                return Some(false);
            }
            let session = store.get(&key).ok()??;
            let lines = session.read_trail().ok()?;
            recorded_matches(&lines, &id, &digest, &text).map(|same| !same)
        })
        .await
        .ok()
        .flatten()
        .unwrap_or(false)
    }

    /// The session a request goes to, the intake's `from`, and whether it is a one-off
    /// ([`session_target`]), with `previous_response_id` followed: into its named session, or
    /// (a one-off conversation) with its messages before `history`.
    async fn destination(
        &self,
        name: Option<&str>,
        idempotency_key: Option<&str>,
        previous: Option<&str>,
        history: &mut Vec<Message>,
    ) -> Result<(String, String, bool), BackendError> {
        let (key, from, one_off) = session_target(name, idempotency_key);
        let Some(previous) = previous else {
            return Ok((key, from, one_off));
        };
        match self.continued(previous).await? {
            Continued::Session(k) if name.is_none() || k == key => {
                let from = k.trim_start_matches("api:").to_string();
                Ok((k, from, false))
            }
            Continued::Session(_) => Err(BackendError::BadRequest(
                "previous_response_id belongs to another session than the one this request names (user, safety_identifier or X-Agentd-Session): send one of them".into(),
            )),
            Continued::History(mut earlier) if one_off => {
                earlier.append(history);
                *history = earlier;
                Ok((key, from, one_off))
            }
            Continued::History(_) => Err(BackendError::BadRequest(
                "previous_response_id names a conversation without a session: leave out the session name (user, safety_identifier or X-Agentd-Session) to continue it".into(),
            )),
        }
    }

    /// Where `previous_response_id` leads: the named session it was answered in, or the
    /// messages of the one-off conversation it ended. 404 for an id agentd did not make, an
    /// answer with `store: false`, or one whose session was reset or pruned; 409 while it
    /// is still being made.
    async fn continued(&self, previous: &str) -> Result<Continued, BackendError> {
        let not_found = || {
            BackendError::NotFound(format!(
                "previous_response_id {}: no stored response has this id (answers with store: false, and those of a reset or pruned session, cannot be continued)",
                crate::control::escaped_preview(previous)
            ))
        };
        let (session_id, digest) = compat::response_session(previous).ok_or_else(not_found)?;
        let store = self.intake.store.clone();
        let sid = session_id.clone();
        let found = tokio::task::spawn_blocking(move || store.trail_by_id(&sid))
            .await
            .map_err(|e| BackendError::Internal(e.to_string()))?
            .map_err(|e| BackendError::Internal(format!("cannot read the session trail: {e}")))?;
        let (key, lines) = found.ok_or_else(not_found)?;
        let intake = (lines.iter())
            .find_map(|l| match &l.event {
                Event::Intake(i) if compat::sha256_hex(i.id.as_bytes()).starts_with(&digest) => {
                    Some(i)
                }
                _ => None,
            })
            .ok_or_else(not_found)?;
        let Some(Route::Api(route)) = &intake.route else {
            return Err(not_found());
        };
        if route.unstored {
            return Err(not_found());
        }
        if recorded_finish(&lines, &intake.id).is_none() {
            return Err(BackendError::Conflict(format!(
                "previous_response_id {}: that response is still being made; continue it once it is done",
                crate::control::escaped_preview(previous)
            )));
        }
        match key {
            Some(k) if !route.one_off => Ok(Continued::Session(k)),
            _ if route.one_off => Ok(Continued::History(
                crate::session::state::rebuild(&session_id, "", &lines).messages,
            )),
            _ => Err(not_found()),
        }
    }

    /// The finish of intake `id` in session `key`'s trail, if it is done.
    async fn finished_in_trail(&self, key: &str, id: &str) -> Option<Finish> {
        let store = self.intake.store.clone();
        let (key, id) = (key.to_string(), id.to_string());
        tokio::task::spawn_blocking(move || {
            let session = store.get(&key).ok()??;
            let lines = session.read_trail().ok()?;
            recorded_finish(&lines, &id)
        })
        .await
        .ok()
        .flatten()
    }
}

/// Where a `previous_response_id` leads.
enum Continued {
    /// A named session: the request goes on in it.
    Session(String),
    /// A one-off conversation, done: its messages are the history of a new one-off session.
    History(Vec<Message>),
}

/// A ticket already answered.
fn ready(id: String, outcome: CompatOutcome) -> CompatTicket {
    let session_id = match &outcome {
        CompatOutcome::Reply(r) => r.session_id.clone(),
        CompatOutcome::Failed { .. } => String::new(),
    };
    CompatTicket {
        id,
        session_id,
        done: Box::pin(async move { Ok(outcome) }),
        deltas: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::MessageEvent;

    #[test]
    fn session_names_become_keys_of_at_most_64_characters() {
        assert_eq!(session_key("alice").as_deref(), Some("api:alice"));
        assert_eq!(session_key("  "), None);
        let long = "x".repeat(64);
        let k = session_key(&long).unwrap();
        assert!(k.starts_with("api:h-") && k.len() == 38, "{k}");
        assert_eq!(session_key(&long), Some(k), "stable");
        let k = session_key("a/b").unwrap();
        assert!(k.starts_with("api:h-"), "{k}");
        assert!(session_key("a\nb").unwrap().starts_with("api:h-"));
        assert!(crate::daemon::intake::valid_key(
            &session_key(&"é".repeat(60)).unwrap()
        ));
    }

    #[test]
    fn one_off_keys_follow_the_idempotency_key() {
        assert_eq!(one_off_key(Some("k1")), one_off_key(Some("k1")));
        assert_ne!(one_off_key(Some("k1")), one_off_key(Some("k2")));
        assert_ne!(one_off_key(None), one_off_key(None));
        assert!(one_off_key(None).starts_with(ONE_OFF_PREFIX));
        assert!(crate::daemon::intake::valid_key(&one_off_key(Some("k"))));
    }

    #[test]
    fn idempotency_keys_are_checked() {
        assert!(idempotency_id("stainless-python-retry-0b6e6b1c-8d1e-4c1f").is_ok());
        for bad in ["", "a b", "a/b", &"x".repeat(129), "é"] {
            assert!(idempotency_id(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn recent_answers_are_bounded() {
        let r = RecentAnswers::default();
        let o = |m: &str| CompatOutcome::Failed {
            kind: ErrorKind::Internal,
            message: m.into(),
        };
        let b = bind("api:a", "d");
        for i in 0..RECENT_ANSWERS + 10 {
            r.put(&format!("k{i}"), &b, o("x"));
        }
        assert!(r.get("k0", &b).is_none());
        assert!(r.get(&format!("k{}", RECENT_ANSWERS + 9), &b).is_some());
        assert_eq!(r.0.lock().unwrap().len(), RECENT_ANSWERS);
    }

    fn bind(session: &str, digest: &str) -> Binding {
        Binding {
            session: session.into(),
            digest: digest.into(),
        }
    }

    #[test]
    fn a_key_is_bound_to_its_session_and_body() {
        let r = RecentAnswers::default();
        let first = bind("api:alice", "d1");
        assert!(matches!(r.claim("k", &first), Ok(None)), "new");
        assert!(matches!(r.claim("k", &first), Ok(None)), "in flight");
        for other in [bind("api:alice", "d2"), bind("api:bob", "d1")] {
            assert!(
                matches!(r.claim("k", &other), Err(BackendError::Conflict(_))),
                "{other:?}"
            );
        }
        let answer = CompatOutcome::Failed {
            kind: ErrorKind::Internal,
            message: "alice's answer".into(),
        };
        r.put("k", &first, answer.clone());
        assert_eq!(r.claim("k", &first).ok().flatten(), Some(answer));
        assert!(r.claim("k", &bind("api:bob", "d1")).is_err());
        // A claim whose request was not accepted frees the key.
        assert!(matches!(r.claim("k2", &first), Ok(None)));
        r.release("k2", &first);
        assert!(matches!(r.claim("k2", &bind("api:bob", "d3")), Ok(None)));
    }

    #[test]
    fn the_recorded_digest_decides_after_a_restart() {
        let intake = |digest: Option<&str>| {
            line(
                1,
                Event::Intake(Intake {
                    id: "k".into(),
                    source: Source::Api,
                    from: "alice".into(),
                    text: "hello".into(),
                    tier: None,
                    attachments: vec![],
                    route: Some(Route::Api(ApiRoute {
                        request_digest: digest.map(str::to_string),
                        ..ApiRoute::default()
                    })),
                    notify_meta: None,
                    relayed_from: None,
                }),
            )
        };
        let lines = vec![intake(Some("d1"))];
        assert_eq!(recorded_matches(&lines, "k", "d1", "x"), Some(true));
        assert_eq!(recorded_matches(&lines, "k", "d2", "hello"), Some(false));
        assert_eq!(recorded_matches(&lines, "other", "d1", "x"), None);
        // Recorded before digests were: the text decides.
        let old = vec![intake(None)];
        assert_eq!(recorded_matches(&old, "k", "d2", "hello"), Some(true));
        assert_eq!(recorded_matches(&old, "k", "d2", "bye"), Some(false));
    }

    fn line(seq: u64, event: Event) -> TrailLine {
        TrailLine {
            v: 1,
            seq,
            ts: "2026-01-01T00:00:00Z".into(),
            event,
        }
    }

    #[test]
    fn a_finished_message_is_read_back_with_its_usage() {
        let u = |i, o| Usage {
            input_tokens: i,
            output_tokens: o,
            cache_read_tokens: 0,
            cache_write_tokens: 0,
            cache_write_1h_tokens: 0,
        };
        let mut user = MessageEvent::new(Message::user_text("hi"));
        user.reply_to = vec!["i1".into()];
        let call = MessageEvent::new(Message::Assistant {
            text: String::new(),
            tool_calls: vec![],
            thinking: vec![],
            usage: Some(u(10, 1)),
        });
        let mut last = MessageEvent::new(Message::Assistant {
            text: "done".into(),
            tool_calls: vec![],
            thinking: vec![],
            usage: Some(u(20, 2)),
        });
        last.is_final = true;
        last.reply_to = vec!["i1".into()];
        last.stop_reason = Some("max_tokens".into());
        let lines = vec![line(1, Event::Message(user)), line(2, Event::Message(call))];
        assert_eq!(recorded_finish(&lines, "i1"), None, "still running");
        let mut lines = lines;
        lines.push(line(3, Event::Message(last)));
        let Some(Finish::Reply {
            text,
            usage,
            truncated,
            ..
        }) = recorded_finish(&lines, "i1")
        else {
            panic!("no reply read back")
        };
        assert_eq!(text, "done");
        assert_eq!(usage, u(30, 3));
        assert!(truncated);
        let failed = vec![line(
            1,
            Event::Failure {
                reply_to: vec!["i2".into()],
                error: "boom".into(),
                reply: "sorry".into(),
            },
        )];
        assert!(matches!(
            recorded_finish(&failed, "i2"),
            Some(Finish::Failed { .. })
        ));
    }
}
