//! One function per endpoint of SPEC §10.2, and the pure input checks they use.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{Json, Path, Query, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use secrecy::ExposeSecret;
use serde::Deserialize;
use serde_json::{Value, json};

use super::backend::{ChatIn, ChatOutcome, NotifyIn, SessionChange};
use super::reply::{Reply, too_large_message};
use super::server::ApiState;
use super::webhook::TokenCounts;
use crate::cost::Period;

type Shared = State<Arc<ApiState>>;
type Answer = Result<Reply, Reply>;

/// `POST /api/v1/chat`: waits for the whole loop up to `call_timeout`, then answers 408 while
/// the work goes on (it runs in its own task, so neither the timeout nor a client that hangs up
/// cancels it).
pub(crate) async fn chat(
    State(state): Shared,
    body: Result<Json<ChatIn>, JsonRejection>,
) -> Answer {
    let Json(req) = json_body(&state, body)?;
    let req = prepare_chat(req).map_err(|m| Reply::error(StatusCode::BAD_REQUEST, m))?;
    let backend = state.backend().clone();
    let work = tokio::spawn(async move { backend.chat(req).await });
    let outcome = match tokio::time::timeout(state.call_timeout(), work).await {
        Err(_) => {
            return Err(Reply::error(
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "still working after {}; the reply will land in the session trail and the webhook",
                    seconds_text(state.call_timeout())
                ),
            ));
        }
        Ok(Err(join)) => {
            tracing::error!(error = %join, "HTTP chat task failed");
            return Err(Reply::error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the chat task failed (logged)",
            ));
        }
        Ok(Ok(result)) => result?,
    };
    match outcome {
        ChatOutcome::Reply {
            reply,
            session_id,
            silent,
            tokens,
            cost_usd,
            attachments,
        } => {
            let mut body = json!({
                "reply": reply,
                "session_id": session_id,
                "silent": silent,
                "tokens": TokenCounts::from(&tokens),
                "cost_usd": cost_usd,
            });
            // Listed only when there are some (SPEC §19), so answers stay as they were.
            if !attachments.is_empty() {
                body["attachments"] = json!(attachments);
            }
            Ok(Reply::ok(body))
        }
        ChatOutcome::Failed { error, session_id } => Err(Reply::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            json!({ "error": error, "session_id": session_id }),
        )),
    }
}

/// `POST /api/v1/notify`: 202 once the notification is durably queued.
pub(crate) async fn notify(
    State(state): Shared,
    body: Result<Json<NotifyIn>, JsonRejection>,
) -> Answer {
    let Json(req) = json_body(&state, body)?;
    if req.message.trim().is_empty() {
        return Err(Reply::error(StatusCode::BAD_REQUEST, "message is empty"));
    }
    let accepted = state.backend().notify(req).await?;
    Ok(Reply::new(StatusCode::ACCEPTED, to_value(&accepted)?))
}

/// `POST /api/v1/sessions/reset` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ResetIn {
    /// `"all"`, a session key or a session id.
    target: String,
}

/// `POST /api/v1/sessions/reset`: `{reset: true, target, count}`.
pub(crate) async fn reset(
    State(state): Shared,
    body: Result<Json<ResetIn>, JsonRejection>,
) -> Answer {
    let Json(ResetIn { target }) = json_body(&state, body)?;
    let target = target.trim().to_owned();
    if target.is_empty() {
        return Err(Reply::error(
            StatusCode::BAD_REQUEST,
            "target is empty: give \"all\", a session key or a session id",
        ));
    }
    let count = state.backend().reset(target.clone()).await?;
    Ok(Reply::ok(
        json!({ "reset": true, "target": target, "count": count }),
    ))
}

/// `POST /api/v1/sessions/{key}/model` body (SPEC §18.2).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SessionModelIn {
    /// A loaded model's name; `null` or `"default"` returns to routing.
    model: Option<String>,
}

/// `POST /api/v1/sessions/{key}/skills` body (SPEC §18.2).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SessionSkillIn {
    name: String,
    enabled: bool,
}

/// The session key of a settings route: what intake accepts as a key.
fn session_key(key: Result<Path<String>, PathRejection>) -> Result<String, Reply> {
    let Path(key) = key.map_err(|e| Reply::error(StatusCode::BAD_REQUEST, e.body_text()))?;
    if key.trim().is_empty()
        || key.chars().count() > 64
        || key.chars().any(|c| c.is_control() || c == '/' || c == '\\')
    {
        return Err(Reply::error(
            StatusCode::BAD_REQUEST,
            "invalid session key: 1-64 characters, no control characters, no '/' or '\\'",
        ));
    }
    Ok(key)
}

/// `POST /api/v1/sessions/{key}/model`: pin the session's model, or `null` for routing.
pub(crate) async fn session_model(
    State(state): Shared,
    key: Result<Path<String>, PathRejection>,
    body: Result<Json<SessionModelIn>, JsonRejection>,
) -> Answer {
    let key = session_key(key)?;
    let Json(SessionModelIn { model }) = json_body(&state, body)?;
    let change = SessionChange::Model(model);
    Ok(Reply::ok(
        state.backend().session_settings(key, change).await?,
    ))
}

/// `POST /api/v1/sessions/{key}/skills`: turn a skill on or off for the session.
pub(crate) async fn session_skill(
    State(state): Shared,
    key: Result<Path<String>, PathRejection>,
    body: Result<Json<SessionSkillIn>, JsonRejection>,
) -> Answer {
    let key = session_key(key)?;
    let Json(SessionSkillIn { name, enabled }) = json_body(&state, body)?;
    let change = SessionChange::Skill { name, enabled };
    Ok(Reply::ok(
        state.backend().session_settings(key, change).await?,
    ))
}

/// `GET /api/v1/status`: without the token, only [`public_status`] of it (no free-form text:
/// errors may name hosts, paths and files); with the token, all of it.
pub(crate) async fn status(State(state): Shared, headers: HeaderMap) -> Answer {
    let backend = state.backend();
    let full = read(&state, backend.status()).await?;
    let authed = state
        .config()
        .token
        .as_ref()
        .map(|t| t.expose_secret())
        .is_some_and(|t| !t.is_empty() && super::auth::bearer_matches(&headers, t));
    Ok(Reply::ok(if authed { full } else { public_status(&full) }))
}

/// What anyone who reaches the port may see of the status: the top-level counters and
/// versions, the names of the models, and per channel and MCP server only its state and
/// counts. Built by keeping known keys, so a field added later stays private until it is
/// added here.
pub(crate) fn public_status(full: &Value) -> Value {
    const TOP: &[&str] = &[
        "status",
        "agent",
        "pid",
        "uptime_seconds",
        "version",
        "active_sessions",
        "queue_depth",
        "today_cost",
    ];
    const PER_PART: &[&str] = &[
        "state",
        "healthy",
        "last_poll_ok_at",
        "consecutive_errors",
        "restarts",
        "tools",
    ];
    let mut out = serde_json::Map::new();
    for k in TOP {
        if let Some(v) = full.get(*k) {
            out.insert((*k).to_string(), v.clone());
        }
    }
    let names = |v: &Value| -> Value {
        match v {
            Value::Array(a) => Value::Array(a.clone()),
            Value::Object(m) => Value::Array(m.keys().map(|k| Value::from(k.as_str())).collect()),
            _ => Value::Array(Vec::new()),
        }
    };
    out.insert(
        "models".into(),
        serde_json::json!({
            "loaded": names(&full["models"]["loaded"]),
            "not_loaded": names(&full["models"]["skipped"]),
        }),
    );
    for part in ["channels", "mcp"] {
        let mut parts = serde_json::Map::new();
        if let Some(map) = full.get(part).and_then(Value::as_object) {
            for (name, v) in map {
                let kept: serde_json::Map<String, Value> = PER_PART
                    .iter()
                    .filter_map(|k| v.get(*k).map(|x| ((*k).to_string(), x.clone())))
                    .filter(|(_, x)| !x.is_string() || x.as_str().is_some_and(|s| s.len() <= 32))
                    .collect();
                parts.insert(name.clone(), Value::Object(kept));
            }
        }
        out.insert(part.to_string(), Value::Object(parts));
    }
    Value::Object(out)
}

/// `GET /api/v1/sessions`.
pub(crate) async fn sessions(State(state): Shared) -> Answer {
    let backend = state.backend();
    Ok(Reply::ok(read(&state, backend.sessions()).await?))
}

/// `GET /api/v1/monitor`.
pub(crate) async fn monitor(State(state): Shared) -> Answer {
    let backend = state.backend();
    Ok(Reply::ok(read(&state, backend.monitor()).await?))
}

#[derive(Debug, Deserialize)]
pub(crate) struct CostQuery {
    period: Option<String>,
    by: Option<String>,
}

/// `GET /api/v1/cost?period=today|week|month|all` (default `today`), `&by=session|source|model`
/// for totals and the cache hit ratio per group (SPEC §20).
pub(crate) async fn cost(
    State(state): Shared,
    query: Result<Query<CostQuery>, QueryRejection>,
) -> Answer {
    let Query(q) = query.map_err(|e| Reply::error(StatusCode::BAD_REQUEST, e.body_text()))?;
    let period = match q.period.as_deref() {
        None => Period::Today,
        Some(p) => p
            .parse::<Period>()
            .map_err(|e| Reply::error(StatusCode::BAD_REQUEST, e.to_string()))?,
    };
    let by = match q.by.as_deref() {
        None => None,
        Some(b) => Some(
            b.parse::<crate::store::GroupBy>()
                .map_err(|e| Reply::error(StatusCode::BAD_REQUEST, format!("by: {e}")))?,
        ),
    };
    let backend = state.backend();
    Ok(Reply::ok(read(&state, backend.cost(period, by)).await?))
}

#[derive(Debug, Deserialize)]
pub(crate) struct HistoryQuery {
    #[serde(default)]
    full: bool,
}

/// `GET /api/v1/sessions/{id}/history?full=true`; the id is checked before the backend sees it.
pub(crate) async fn history(
    State(state): Shared,
    id: Result<Path<String>, PathRejection>,
    query: Result<Query<HistoryQuery>, QueryRejection>,
) -> Answer {
    let Path(id) = id.map_err(|e| Reply::error(StatusCode::BAD_REQUEST, e.body_text()))?;
    if !is_session_id(&id) {
        return Err(Reply::error(
            StatusCode::BAD_REQUEST,
            "invalid session id: expected 1-64 characters of A-Z, a-z, 0-9, '_' or '-'",
        ));
    }
    let Query(q) = query.map_err(|e| Reply::error(StatusCode::BAD_REQUEST, e.body_text()))?;
    let backend = state.backend();
    match read(&state, backend.history(id.clone(), q.full)).await? {
        Some(body) => Ok(Reply::ok(body)),
        None => Err(Reply::error(
            StatusCode::NOT_FOUND,
            format!("no session with id {id}"),
        )),
    }
}

/// `GET /metrics`: OpenMetrics text ([`crate::metrics::CONTENT_TYPE`]).
pub(crate) async fn metrics(State(state): Shared, headers: HeaderMap) -> Result<Response, Reply> {
    let backend = state.backend();
    let text = read(&state, backend.metrics()).await?;
    // OpenMetrics unless the client asks for the classic text format only (promtool, older
    // scrapers); Prometheus itself lists both and gets OpenMetrics.
    let accept = headers
        .get(axum::http::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let classic = accept.contains("text/plain") && !accept.contains("application/openmetrics-text");
    let (text, content_type) = match classic {
        true => (
            crate::metrics::to_classic(&text),
            crate::metrics::CLASSIC_CONTENT_TYPE,
        ),
        false => (text, crate::metrics::CONTENT_TYPE),
    };
    let mut response = text.into_response();
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    Ok(response)
}

/// Fallback: unknown endpoints are 404 JSON.
pub(crate) async fn not_found(method: Method, uri: Uri) -> Reply {
    let path: String = uri.path().chars().take(200).collect();
    Reply::error(
        StatusCode::NOT_FOUND,
        format!("no such endpoint: {method} {path}"),
    )
}

/// Waits for a read-only backend call up to `call_timeout` (503 after that).
async fn read<T, F>(state: &ApiState, call: F) -> Result<T, Reply>
where
    F: Future<Output = Result<T, super::backend::BackendError>>,
{
    match tokio::time::timeout(state.call_timeout(), call).await {
        Ok(result) => Ok(result?),
        Err(_) => Err(Reply::error(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "the daemon did not answer within {}",
                seconds_text(state.call_timeout())
            ),
        )),
    }
}

/// The JSON body, or a 400/413/415 naming the problem (never axum's 422).
fn json_body<T>(state: &ApiState, body: Result<Json<T>, JsonRejection>) -> Result<Json<T>, Reply> {
    body.map_err(|rejection| match rejection.status() {
        StatusCode::PAYLOAD_TOO_LARGE => Reply::error(
            StatusCode::PAYLOAD_TOO_LARGE,
            too_large_message(state.max_body_bytes()),
        ),
        StatusCode::UNSUPPORTED_MEDIA_TYPE => Reply::error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "expected a JSON body with Content-Type: application/json",
        ),
        _ => Reply::error(StatusCode::BAD_REQUEST, rejection.body_text()),
    })
}

fn to_value<T: serde::Serialize>(value: &T) -> Result<Value, Reply> {
    serde_json::to_value(value).map_err(|e| {
        Reply::error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("could not serialise the answer: {e}"),
        )
    })
}

/// Checks a chat request and folds `context` into the message as `[context] …`.
pub(crate) fn prepare_chat(mut req: ChatIn) -> Result<ChatIn, String> {
    if req.message.trim().is_empty() {
        return Err("message is empty".into());
    }
    for (i, a) in req.attachments.iter().enumerate() {
        check_attachment(a).map_err(|m| format!("attachments[{i}]: {m}"))?;
    }
    if let Some(context) = req.context.take().filter(|c| !c.trim().is_empty()) {
        req.message = format!("[context] {context}\n{}", req.message);
    }
    Ok(req)
}

/// An attachment has a `type/subtype` content type, standard base64 data and a plain file name.
fn check_attachment(a: &super::backend::AttachmentIn) -> Result<(), String> {
    if !is_media_type(&a.content_type) {
        return Err(format!(
            "content_type {:?} is not a media type like \"image/png\"",
            a.content_type.chars().take(80).collect::<String>()
        ));
    }
    if a.data.is_empty() {
        return Err("data is empty".into());
    }
    base64::engine::general_purpose::STANDARD
        .decode(a.data.as_bytes())
        .map_err(|e| format!("data is not valid base64: {e}"))?;
    if let Some(name) = &a.filename {
        let plain = !name.is_empty()
            && name.len() <= 255
            && name != "."
            && name != ".."
            && !name
                .chars()
                .any(|c| c == '/' || c == '\\' || c.is_control());
        if !plain {
            return Err("filename must be a plain file name (no path, at most 255 bytes)".into());
        }
    }
    Ok(())
}

/// `type/subtype` with RFC 6838 name characters, optionally followed by `; parameters`
/// (printable ASCII only).
fn is_media_type(s: &str) -> bool {
    let essence = s.split(';').next().unwrap_or_default().trim();
    let name_ok = |part: &str| {
        !part.is_empty()
            && part.len() <= 127
            && part
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "!#$&-^_.+".contains(c))
    };
    s.len() <= 255
        && s.chars().all(|c| c == ' ' || c.is_ascii_graphic())
        && essence
            .split_once('/')
            .is_some_and(|(t, sub)| name_ok(t) && name_ok(sub))
}

/// A session id: `^[A-Za-z0-9_-]{1,64}$` (no path, glob or control characters).
pub(crate) fn is_session_id(id: &str) -> bool {
    (1..=64).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// `600 s`, or `0.05 s` below a second.
fn seconds_text(d: Duration) -> String {
    if d.subsec_nanos() == 0 || d.as_secs() >= 10 {
        format!("{} s", d.as_secs())
    } else {
        format!("{} s", (d.as_secs_f64() * 1000.0).round() / 1000.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::backend::AttachmentIn;
    use proptest::prelude::*;

    fn chat_in(message: &str) -> ChatIn {
        ChatIn {
            message: message.into(),
            sender: None,
            context: None,
            tier: None,
            attachments: Vec::new(),
        }
    }

    fn attachment(content_type: &str, data: &str, filename: Option<&str>) -> AttachmentIn {
        AttachmentIn {
            content_type: content_type.into(),
            data: data.into(),
            filename: filename.map(Into::into),
        }
    }

    #[test]
    fn context_is_prepended_and_cleared() {
        let mut req = chat_in("hello");
        req.context = Some("from CI".into());
        let out = prepare_chat(req).unwrap();
        assert_eq!(out.message, "[context] from CI\nhello");
        assert_eq!(out.context, None);
        let mut req = chat_in("hello");
        req.context = Some("  ".into());
        assert_eq!(prepare_chat(req).unwrap().message, "hello");
    }

    #[test]
    fn empty_messages_are_refused() {
        assert!(prepare_chat(chat_in("  \n")).is_err());
    }

    #[test]
    fn attachments_are_checked() {
        let ok = attachment("image/png", "aGVsbG8=", Some("a.png"));
        assert!(check_attachment(&ok).is_ok());
        assert!(check_attachment(&attachment("text/plain; charset=utf-8", "aGk=", None)).is_ok());
        for bad in [
            attachment("image/png", "not base64!", None),
            attachment("image/png", "", None),
            attachment("png", "aGk=", None),
            attachment("image/", "aGk=", None),
            attachment("image/png\n", "aGk=", None),
            attachment("image/png", "aGk=", Some("../x")),
            attachment("image/png", "aGk=", Some("..")),
            attachment("image/png", "aGk=", Some("a\0b")),
        ] {
            assert!(check_attachment(&bad).is_err(), "{bad:?}");
        }
        let mut req = chat_in("hi");
        req.attachments = vec![ok, attachment("image/png", "%%%", None)];
        let e = prepare_chat(req).unwrap_err();
        assert!(
            e.starts_with("attachments[1]: data is not valid base64"),
            "{e}"
        );
    }

    #[test]
    fn session_ids() {
        for good in ["a", "abc-DEF_123", &"x".repeat(64), "20260101-abc"] {
            assert!(is_session_id(good), "{good}");
        }
        for bad in [
            "",
            "../../etc",
            "a/b",
            "*",
            "\0",
            "a.b",
            "a b",
            &"x".repeat(65),
            "é",
        ] {
            assert!(!is_session_id(bad), "{bad:?}");
        }
    }

    #[test]
    fn seconds_are_readable() {
        assert_eq!(seconds_text(Duration::from_secs(600)), "600 s");
        assert_eq!(seconds_text(Duration::from_millis(50)), "0.05 s");
    }

    proptest! {
        #[test]
        fn session_ids_match_the_pattern(s in "\\PC{0,70}") {
            let expected = !s.is_empty()
                && s.len() <= 64
                && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
            prop_assert_eq!(is_session_id(&s), expected);
        }

        #[test]
        fn accepted_ids_never_carry_path_characters(s in "[A-Za-z0-9_./*?\\\\-]{1,70}") {
            if is_session_id(&s) {
                prop_assert!(!s.contains(['/', '.', '*', '?', '\\']));
            }
        }
    }
}
