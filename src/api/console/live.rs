//! Server-sent events: the overview pushed when the daemon's live state (the monitor)
//! changes, never polled by the page; and the chat page's answer as the model writes it.
//! The overview reads only memory and the cost database (read-only): no provider call and no
//! disk write while a console is open.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::Stream;
use serde_json::{Value, json};

use super::html::{Html, usd};
use super::pages::call;
use super::{Shared, form_field};
use crate::api::backend::ChatOutcome;
use crate::api::server::ApiState;
use crate::cost::Period;
use crate::llm::StreamDelta;

/// Changes closer together than this are sent as one update.
const SETTLE: Duration = Duration::from_millis(200);
/// A comment line this often keeps proxies from closing a quiet stream.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

fn row(label: &str, value: impl Into<String>, tone: &str) -> Value {
    json!([label, value.into(), tone])
}

/// The overview's cards: `[{title, rows:[[label, value, tone]]}]` (tone: `good`, `bad`,
/// `warn` or empty). The page renders them once ([`render_cards`]); the script again on
/// every event, with text nodes only.
pub(crate) async fn overview_data(state: &ApiState) -> Value {
    let b = state.backend();
    let status = call(state, b.status())
        .await
        .unwrap_or_else(|e| json!({"status": e}));
    let monitor = call(state, b.monitor()).await.unwrap_or_default();
    let month = call(state, b.cost(Period::Month, None)).await.ok();
    let mut cards = Vec::new();
    let ok = status["status"] == "ok";
    cards.push(json!({"title": "Daemon", "rows": [
        row("Health", status["status"].as_str().unwrap_or("unknown"), if ok { "good" } else { "bad" }),
        row("Version", status["version"].as_str().unwrap_or(""), ""),
        row("Up for", uptime(status["uptime_seconds"].as_u64().unwrap_or(0)), ""),
    ]}));
    let mut channels = Vec::new();
    for (name, h) in status["channels"].as_object().into_iter().flatten() {
        let healthy = h["healthy"].as_bool().unwrap_or(true);
        let text = h["state"].as_str().map_or_else(
            || {
                if healthy {
                    "ok".into()
                } else {
                    "unhealthy".into()
                }
            },
            str::to_string,
        );
        channels.push(row(name, text, if healthy { "good" } else { "bad" }));
    }
    if channels.is_empty() {
        channels.push(row("Channels", "none besides HTTP", ""));
    }
    cards.push(json!({"title": "Channels", "rows": channels}));
    let last = match (monitor["contact"].as_str(), monitor["state"].as_str()) {
        (Some(c), Some(s)) => format!("{s} · {c}"),
        (None, Some(s)) => s.to_string(),
        _ => "idle".into(),
    };
    cards.push(json!({"title": "Sessions", "rows": [
        row("Running", status["active_sessions"].to_string(), ""),
        row("Queued", monitor["queue_depth"].to_string(), ""),
        row("Latest", last, ""),
        row("Updated", clock(monitor["updated_at"].as_str().unwrap_or("")), ""),
    ]}));
    let d = &monitor["deliveries"];
    let n = |k: &str| d[k].as_u64().unwrap_or(0);
    cards.push(json!({"title": "Deliveries", "rows": [
        row("Pending", n("pending").to_string(), ""),
        row("Failed", n("failed").to_string(), if n("failed") > 0 { "bad" } else { "good" }),
        row("Unknown", n("unknown").to_string(), if n("unknown") > 0 { "warn" } else { "good" }),
    ]}));
    let mut mcp = Vec::new();
    for (name, m) in status["mcp"].as_object().into_iter().flatten() {
        let s = m["state"].as_str().unwrap_or("unknown");
        mcp.push(row(
            name,
            format!("{s} · {} tools", m["tools"]),
            if s == "ready" { "good" } else { "warn" },
        ));
    }
    if !mcp.is_empty() {
        cards.push(json!({"title": "MCP servers", "rows": mcp}));
    }
    let mut alerts: Vec<Value> = monitor["alerts"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|a| {
            row(
                a["kind"].as_str().unwrap_or("alert"),
                a["message"].as_str().unwrap_or(""),
                "bad",
            )
        })
        .collect();
    if alerts.is_empty() {
        alerts.push(row("Alerts", "none", "good"));
    }
    cards.push(json!({"title": "Alerts", "rows": alerts}));
    let today = status["today_cost"].as_f64().unwrap_or(0.0);
    let month = month.map_or(0.0, |m| m["total_cost"].as_f64().unwrap_or(0.0));
    cards.push(json!({"title": "Spend", "rows": [
        spend("Today", today, status["budget"]["daily_usd"].as_f64()),
        spend("This month", month, status["budget"]["monthly_usd"].as_f64()),
    ]}));
    Value::Array(cards)
}

/// Spend against its budget (`$1.20 of $5.00`), toned by how much of it is used; a budget
/// of 0 is off.
fn spend(label: &str, spent: f64, budget: Option<f64>) -> Value {
    match budget.filter(|b| *b > 0.0) {
        Some(b) => {
            let tone = match spent / b {
                r if r >= 1.0 => "bad",
                r if r >= 0.8 => "warn",
                _ => "good",
            };
            row(label, format!("{} of {}", usd(spent), usd(b)), tone)
        }
        None => row(label, format!("{} (no budget)", usd(spent)), ""),
    }
}

/// `3 d 4 h`, `2 h 5 min`, `40 s`.
fn uptime(s: u64) -> String {
    match s {
        0..60 => format!("{s} s"),
        60..3600 => format!("{} min", s / 60),
        3600..86_400 => format!("{} h {} min", s / 3600, s % 3600 / 60),
        _ => format!("{} d {} h", s / 86_400, s % 86_400 / 3600),
    }
}

/// An RFC 3339 time as `HH:MM:SS UTC` (the date is today's on an overview).
fn clock(t: &str) -> String {
    chrono::DateTime::parse_from_rfc3339(t)
        .map(|t| {
            t.with_timezone(&chrono::Utc)
                .format("%H:%M:%S UTC")
                .to_string()
        })
        .unwrap_or_default()
}

/// The cards as HTML (the same structure the script builds from an event).
pub(crate) fn render_cards(h: &mut Html, cards: &Value) {
    for c in cards.as_array().into_iter().flatten() {
        h.raw(r#"<section class="card"><h2>"#)
            .text(c["title"].as_str().unwrap_or(""))
            .raw("</h2><dl>");
        for r in c["rows"].as_array().into_iter().flatten() {
            h.el("dt", r[0].as_str().unwrap_or(""));
            let tone = match r[2].as_str() {
                Some("good") => "dd class=\"good\"",
                Some("bad") => "dd class=\"bad\"",
                Some("warn") => "dd class=\"warn\"",
                _ => "dd",
            };
            h.el(tone, r[1].as_str().unwrap_or(""));
        }
        h.raw("</dl></section>");
    }
}

/// `GET /console/events`: the overview now, then again after every change of the live
/// state (changes within [`SETTLE`] of each other as one).
pub(crate) async fn overview_events(State(state): Shared) -> Response {
    let changes = state.backend().changes();
    let stream = futures::stream::unfold(
        (state, changes, true),
        |(state, mut changes, first)| async move {
            if !first {
                match &mut changes {
                    Some(rx) => {
                        rx.changed().await.ok()?;
                        tokio::time::sleep(SETTLE).await;
                        rx.borrow_and_update();
                    }
                    None => std::future::pending::<()>().await,
                }
            }
            let data = overview_data(&state).await;
            let event = SseEvent::default().event("overview").data(data.to_string());
            Some((Ok::<_, Infallible>(event), (state, changes, false)))
        },
    );
    sse(stream)
}

fn sse(stream: impl Stream<Item = Result<SseEvent, Infallible>> + Send + 'static) -> Response {
    Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
        .into_response()
}

/// `POST /console/chat` `name=…&text=…`: the message for session `web:<name>`; the answer
/// streams back as events `delta` (a piece of text), `tools` (the model calls tools), then
/// `done` (the whole reply) or `failed`.
pub(crate) async fn chat_send(State(state): Shared, req: Request) -> Response {
    let Ok(bytes) = axum::body::to_bytes(req.into_body(), state.max_body_bytes()).await else {
        return StatusCode::PAYLOAD_TOO_LARGE.into_response();
    };
    let name = form_field(&bytes, "name").unwrap_or_default();
    let text = form_field(&bytes, "text").unwrap_or_default();
    let chat = match state
        .backend()
        .console_chat(name.trim().to_string(), text)
        .await
    {
        Ok(c) => c,
        Err(e) => {
            let ev = SseEvent::default().event("failed").data(e.to_string());
            return sse(futures::stream::once(async move { Ok(ev) }));
        }
    };
    // Pieces first (biased), then the end; a closed piece channel only waits for the end.
    let stream = futures::stream::unfold(Some((chat.deltas, chat.done)), |st| async move {
        let (mut rx, mut done) = st?;
        tokio::select! {
            biased;
            Some(d) = rx.recv() => Some((Ok(delta(d)), Some((rx, done)))),
            r = &mut done => Some((Ok(finished(r)), None)),
        }
    });
    sse(stream)
}

fn delta(d: StreamDelta) -> SseEvent {
    match d {
        StreamDelta::Text(t) => SseEvent::default().event("delta").data(t),
        StreamDelta::Tools => SseEvent::default().event("tools").data(""),
    }
}

fn finished(r: Result<ChatOutcome, crate::api::backend::BackendError>) -> SseEvent {
    match r {
        Ok(ChatOutcome::Reply { reply, .. }) => SseEvent::default().event("done").data(reply),
        Ok(ChatOutcome::Failed { error, .. }) => SseEvent::default().event("failed").data(error),
        Err(e) => SseEvent::default().event("failed").data(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spend_is_shown_against_its_budget_and_toned_by_its_share() {
        assert_eq!(
            spend("Today", 1.0, Some(4.0)),
            json!(["Today", "$1.0000 of $4.0000", "good"])
        );
        assert_eq!(spend("Today", 3.5, Some(4.0))[2], "warn");
        assert_eq!(spend("Today", 4.0, Some(4.0))[2], "bad");
        assert_eq!(
            spend("This month", 2.0, Some(0.0)),
            json!(["This month", "$2.0000 (no budget)", ""])
        );
        assert_eq!(spend("This month", 2.0, None)[1], "$2.0000 (no budget)");
    }
}
