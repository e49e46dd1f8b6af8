//! The console's pages, rendered on the server from the same backend calls as the HTTP API
//! (the same reports), every datum escaped.

use std::fmt::Write as _;

use axum::extract::{Extension, Path, Query, Request, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde::Deserialize;
use serde_json::Value;

use super::html::{Html, esc, page, usd, when};
use super::login::Visitor;
use super::{Shared, form_field, html, live, redirect};
use crate::api::backend::BackendError;
use crate::api::server::ApiState;
use crate::cost::Period;
use crate::session::approval::Decision;
use crate::session::event::{Event, TrailLine};

/// Sessions whose trails the approvals page reads for the decisions' history.
const HISTORY_SESSIONS: usize = 20;
/// Decisions listed at most.
const HISTORY_DECISIONS: usize = 50;

/// Awaits a backend call up to the API's `call_timeout`.
pub(crate) async fn call<T>(
    state: &ApiState,
    f: impl Future<Output = Result<T, BackendError>>,
) -> Result<T, String> {
    match tokio::time::timeout(state.call_timeout(), f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("the daemon did not answer in time".into()),
    }
}

fn problem(h: &mut Html, what: &str, e: &str) {
    h.raw(r#"<p class="problem" role="alert">"#)
        .text(&format!("{what}: {e}"))
        .raw("</p>");
}

fn done(state: &ApiState, v: &Visitor, title: &str, current: &str, body: Html) -> Response {
    html(
        StatusCode::OK,
        page(
            title,
            state.agent_name(),
            current,
            Some(&v.csrf),
            &body.into_string(),
        ),
    )
}

fn s<'a>(v: &'a Value, k: &str) -> &'a str {
    v[k].as_str().unwrap_or("")
}

/// The login page, with `problem` when the last attempt failed.
pub(crate) fn login_page(state: &ApiState, problem_text: Option<&str>) -> String {
    let mut h = Html::default();
    if let Some(p) = problem_text {
        problem(&mut h, "Login refused", p);
    }
    h.raw(r#"<form class="login" method="post" action="/console/login">"#)
        .raw(r#"<label for="token">API token</label>"#)
        .raw(r#"<input id="token" name="token" type="password" autocomplete="current-password" required autofocus>"#)
        .raw(r#"<button type="submit">Log in</button></form>"#)
        .raw(r#"<p class="hint">The token of <code>[http] token_env</code>. The session lasts 12 hours, or until agentd restarts.</p>"#);
    page("Log in", state.agent_name(), "", None, &h.into_string())
}

pub(crate) async fn login_form(State(state): Shared) -> Response {
    html(StatusCode::OK, login_page(&state, None))
}

pub(crate) async fn overview(State(state): Shared, Extension(v): Extension<Visitor>) -> Response {
    let data = live::overview_data(&state).await;
    let mut h = Html::default();
    h.raw(r#"<p class="hint" id="live-state" aria-live="polite">Live: this page updates by itself.</p>"#)
        .raw(r#"<div id="live" class="cards">"#);
    live::render_cards(&mut h, &data);
    h.raw("</div>");
    done(&state, &v, "Overview", "/console/", h)
}

pub(crate) async fn sessions(State(state): Shared, Extension(v): Extension<Visitor>) -> Response {
    let mut h = Html::default();
    match call(&state, state.backend().sessions()).await {
        Ok(list) => {
            let list = list["sessions"].as_array().cloned().unwrap_or_default();
            if list.is_empty() {
                h.el("p", "No open session.");
            }
            h.raw(r#"<div class="table"><table><thead><tr><th scope="col">Session</th><th scope="col">Channel</th><th scope="col">Model</th><th scope="col">Messages</th><th scope="col">Cost</th><th scope="col">Started</th></tr></thead><tbody>"#);
            for s_ in &list {
                let key = s(s_, "key");
                let channel = key.split([':', '-']).next().unwrap_or(key);
                h.raw("<tr><td><a href=\"/console/sessions/")
                    .text(s(s_, "session_id"))
                    .raw("\">")
                    .text(key)
                    .raw("</a></td>")
                    .el("td", channel)
                    .el("td", s(s_, "model"))
                    .el("td", &s_["message_count"].as_u64().unwrap_or(0).to_string())
                    .el("td", &usd(s_["cost_usd"].as_f64().unwrap_or(0.0)))
                    .el("td", &when(s_["created_at"].as_i64().unwrap_or(0)))
                    .raw("</tr>");
            }
            h.raw("</tbody></table></div>");
        }
        Err(e) => problem(&mut h, "Sessions", &e),
    }
    done(&state, &v, "Sessions", "/console/sessions", h)
}

pub(crate) async fn session(
    State(state): Shared,
    Extension(v): Extension<Visitor>,
    Path(id): Path<String>,
) -> Response {
    let mut h = Html::default();
    let mut title = format!("Session {id}");
    if !crate::report::history::is_valid_target(&id) {
        problem(&mut h, "Session", "not a session id");
        return done(&state, &v, "Session", "/console/sessions", h);
    }
    match call(&state, state.backend().history(id.clone(), true)).await {
        Ok(Some(hist)) => {
            let lines: Vec<TrailLine> = hist["events"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|e| serde_json::from_value(e.clone()).ok())
                .collect();
            let key = lines.iter().find_map(|l| match &l.event {
                Event::Session { key, .. } => Some(key.clone()),
                _ => None,
            });
            if let Some(key) = &key {
                title = format!("Session {key}");
                session_controls(&mut h, &v, key, &id);
            }
            h.raw(r#"<div class="search"><label for="find">Search in this conversation</label><input id="find" type="search" data-filter=".turn" autocomplete="off"><span id="find-count" aria-live="polite"></span></div>"#);
            super::conversation::render(&mut h, &lines);
        }
        Ok(None) => problem(&mut h, "Session", "no such session"),
        Err(e) => problem(&mut h, "Session", &e),
    }
    done(&state, &v, &title, "/console/sessions", h)
}

fn session_controls(h: &mut Html, v: &Visitor, key: &str, id: &str) {
    h.raw(r#"<p class="meta">Session id "#).text(id).raw("</p>");
    h.raw(r#"<div class="actions">"#);
    for (action, label) in [
        ("stop", "Stop the message in flight"),
        ("reset", "Reset the session"),
    ] {
        let _ = write!(
            h,
            r#"<form method="post" action="/console/sessions/{action}"><input type="hidden" name="key" value="{}">"#,
            esc(key)
        );
        h.csrf(&v.csrf)
            .raw(r#"<button type="submit" class="danger">"#)
            .text(label)
            .raw("</button></form>");
    }
    h.raw("</div>");
}

async fn session_action(state: &ApiState, req: Request, stop: bool) -> Response {
    let Ok(bytes) = axum::body::to_bytes(req.into_body(), state.max_body_bytes()).await else {
        return redirect("/console/sessions");
    };
    let key = form_field(&bytes, "key").unwrap_or_default();
    if !key.is_empty() {
        if stop {
            let _ = call(state, state.backend().stop(key)).await;
        } else {
            let _ = call(state, state.backend().reset(key)).await;
        }
    }
    redirect("/console/sessions")
}

pub(crate) async fn reset(State(state): Shared, req: Request) -> Response {
    session_action(&state, req, false).await
}

pub(crate) async fn stop(State(state): Shared, req: Request) -> Response {
    session_action(&state, req, true).await
}

#[derive(Deserialize)]
pub(crate) struct CostQuery {
    by: Option<String>,
}

pub(crate) async fn costs(
    State(state): Shared,
    Extension(v): Extension<Visitor>,
    Query(q): Query<CostQuery>,
) -> Response {
    let by_source = q.by.as_deref() == Some("source");
    let mut h = Html::default();
    h.raw(r#"<section aria-labelledby="totals"><h2 id="totals">Totals</h2><dl class="totals">"#);
    for period in [Period::Today, Period::Week, Period::Month, Period::All] {
        match call(&state, state.backend().cost(period, None)).await {
            Ok(r) => {
                let label = match period {
                    Period::Today => "Today",
                    Period::Week => "This week",
                    Period::Month => "This month",
                    _ => "All time",
                };
                h.el("dt", label)
                    .raw(r#"<dd data-period=""#)
                    .text(period.as_str())
                    .raw(r#"" data-total=""#)
                    .text(&r["total_cost"].as_f64().unwrap_or(0.0).to_string())
                    .raw(r#"">"#)
                    .text(&usd(r["total_cost"].as_f64().unwrap_or(0.0)))
                    .raw("</dd>");
            }
            Err(e) => problem(&mut h, period.as_str(), &e),
        }
    }
    h.raw("</dl></section>");
    let days = call(&state, state.backend().cost_days(30)).await;
    h.raw(r#"<section aria-labelledby="per-day"><h2 id="per-day">Spend per day, last 30 days</h2><p class="toggle">Stacked by: "#);
    if by_source {
        h.raw(r#"<a href="/console/costs">model</a> · <strong>source</strong>"#);
    } else {
        h.raw(r#"<strong>model</strong> · <a href="/console/costs?by=source">source</a>"#);
    }
    h.raw("</p>");
    match &days {
        Ok(d) => {
            let rows = d["days"].as_array().cloned().unwrap_or_default();
            super::charts::spend_per_day(&mut h, &rows, if by_source { "source" } else { "model" });
            h.raw(r#"</section><section aria-labelledby="cache"><h2 id="cache">Cache hit ratio per day</h2>"#);
            super::charts::hit_ratio(&mut h, &rows);
        }
        Err(e) => problem(&mut h, "Spend per day", e),
    }
    h.raw("</section>");
    match call(
        &state,
        state
            .backend()
            .cost(Period::Month, Some(crate::store::GroupBy::Session)),
    )
    .await
    {
        Ok(r) => {
            let skipped = &r["skipped"];
            h.raw(r#"<section aria-labelledby="saved"><h2 id="saved">Skipped runs this month</h2><p>"#)
                .text(&format!(
                    "{} runs skipped by their precheck, saving about {}.",
                    skipped["runs"].as_u64().unwrap_or(0),
                    usd(skipped["saved_usd"].as_f64().unwrap_or(0.0))
                ))
                .raw(r#"</p></section><section aria-labelledby="top"><h2 id="top">Top sessions this month</h2>"#);
            let groups = r["groups"].as_array().cloned().unwrap_or_default();
            super::charts::top_bars(&mut h, &groups);
            h.raw("</section>");
        }
        Err(e) => problem(&mut h, "Top sessions", &e),
    }
    done(&state, &v, "Costs", "/console/costs", h)
}

pub(crate) async fn approvals(State(state): Shared, Extension(v): Extension<Visitor>) -> Response {
    let mut h = Html::default();
    h.raw(r#"<section aria-labelledby="waiting"><h2 id="waiting">Waiting</h2>"#);
    match call(&state, state.backend().approvals()).await {
        Ok(list) => {
            let list = list["approvals"].as_array().cloned().unwrap_or_default();
            if list.is_empty() {
                h.el("p", "Nothing waits for a decision.");
            }
            for a in &list {
                approval_card(&mut h, &v, a);
            }
        }
        Err(e) => problem(&mut h, "Approvals", &e),
    }
    h.raw(r#"</section><section aria-labelledby="history"><h2 id="history">Decided</h2>"#);
    decisions(&state, &mut h).await;
    h.raw("</section>");
    done(&state, &v, "Approvals", "/console/approvals", h)
}

fn approval_card(h: &mut Html, v: &Visitor, a: &Value) {
    let id = s(a, "id");
    h.raw(r#"<article class="approval"><h3>"#)
        .text(s(a, "tool"))
        .raw("</h3>")
        .el("p", s(a, "summary"))
        .raw(r#"<p class="meta">Asked by session "#)
        .text(s(a, "key"))
        .raw(" · expires ")
        .text(s(a, "expires_at"))
        .raw("</p><details><summary>Input</summary><pre>")
        .text(&serde_json::to_string_pretty(&a["input"]).unwrap_or_default())
        .raw("</pre></details>");
    let _ = write!(
        h,
        r#"<form method="post" action="/console/approvals/{}" class="decide">"#,
        esc(id)
    );
    h.csrf(&v.csrf)
        .raw(r#"<button type="submit" name="decision" value="approve">Approve</button>"#)
        .raw(r#"<button type="submit" name="decision" value="always">Always in this session</button>"#)
        .raw(r#"<button type="submit" name="decision" value="deny" class="danger">Deny</button></form></article>"#);
}

/// The decisions recorded in the trails of the open sessions (newest first, bounded).
async fn decisions(state: &ApiState, h: &mut Html) {
    let Ok(list) = call(state, state.backend().sessions()).await else {
        return;
    };
    let mut found: Vec<(String, String, TrailLine)> = Vec::new();
    for sess in list["sessions"]
        .as_array()
        .into_iter()
        .flatten()
        .take(HISTORY_SESSIONS)
    {
        let (id, key) = (
            s(sess, "session_id").to_string(),
            s(sess, "key").to_string(),
        );
        if let Ok(Some(hist)) = call(state, state.backend().history(id, false)).await {
            for e in hist["events"].as_array().into_iter().flatten() {
                if e["type"] == "approval_decision"
                    && let Ok(l) = serde_json::from_value::<TrailLine>(e.clone())
                {
                    found.push((key.clone(), l.ts.clone(), l));
                }
            }
        }
    }
    found.sort_by(|a, b| b.1.cmp(&a.1));
    if found.is_empty() {
        h.el("p", "No decision recorded in the open sessions.");
        return;
    }
    h.raw("<ul class=\"history\">");
    for (key, ts, l) in found.iter().take(HISTORY_DECISIONS) {
        if let Event::ApprovalDecision(d) = &l.event {
            h.el(
                "li",
                &format!(
                    "{ts} · {} · {} by {} via {} · session {key}",
                    d.tool,
                    d.decision.as_str(),
                    d.by,
                    d.channel
                ),
            );
        }
    }
    h.raw("</ul>");
}

pub(crate) async fn decide(State(state): Shared, Path(id): Path<String>, req: Request) -> Response {
    let Ok(bytes) = axum::body::to_bytes(req.into_body(), state.max_body_bytes()).await else {
        return redirect("/console/approvals");
    };
    let decision = form_field(&bytes, "decision").unwrap_or_default();
    if let Some(d) = Decision::parse(&decision)
        && crate::tools::approval::is_valid_id(&id)
        && let Err(e) = call(&state, state.backend().decide_approval(id.clone(), d)).await
    {
        tracing::info!(id = %id, error = %e, "web console: approval not decided");
    }
    redirect("/console/approvals")
}

pub(crate) async fn schedules(State(state): Shared, Extension(v): Extension<Visitor>) -> Response {
    let mut h = Html::default();
    match call(&state, state.backend().schedules()).await {
        Ok(r) => {
            let entries = r["entries"].as_array().cloned().unwrap_or_default();
            h.raw(
                r#"<section aria-labelledby="entries"><h2 id="entries">[[schedule]] entries</h2>"#,
            );
            if entries.is_empty() {
                h.el("p", "No [[schedule]] entry in the config.");
            }
            for e in &entries {
                h.raw(r#"<article class="card"><h3>"#)
                    .text(s(e, "name"))
                    .raw("</h3><dl>");
                h.el("dt", "When").el("dd", s(e, "when"));
                h.el("dt", "Does").el("dd", s(e, "action"));
                h.el("dt", "Next run").el(
                    "dd",
                    &e["next_run"]
                        .as_i64()
                        .map(when)
                        .unwrap_or_else(|| "—".into()),
                );
                h.el("dt", "Last run").el(
                    "dd",
                    &e["last_run"]
                        .as_i64()
                        .map(when)
                        .unwrap_or_else(|| "never".into()),
                );
                if let Some(p) = e["precheck"].as_str() {
                    h.el("dt", "Precheck")
                        .raw("<dd><code>")
                        .text(p)
                        .raw("</code></dd>");
                }
                if let Some(p) = e["last_precheck"].as_object() {
                    let line = p
                        .iter()
                        .map(|(k, v)| {
                            format!(
                                "{k}: {}",
                                v.as_str().map_or_else(|| v.to_string(), str::to_string)
                            )
                        })
                        .collect::<Vec<_>>()
                        .join(", ");
                    h.el("dt", "Last precheck").el("dd", &line);
                }
                h.raw("</dl></article>");
            }
            h.raw(r#"</section><section aria-labelledby="once"><h2 id="once">Messages scheduled once</h2>"#);
            let pending = r["pending"].as_array().cloned().unwrap_or_default();
            if pending.is_empty() {
                h.el("p", "None waiting.");
            }
            h.raw("<ul>");
            for p in &pending {
                h.el(
                    "li",
                    &format!(
                        "{} → {}: {}",
                        when(p["due_at"].as_i64().unwrap_or(0)),
                        s(p, "target"),
                        s(p, "text")
                    ),
                );
            }
            h.raw("</ul></section>");
        }
        Err(e) => problem(&mut h, "Schedules", &e),
    }
    done(&state, &v, "Schedules", "/console/schedules", h)
}

#[derive(Deserialize)]
pub(crate) struct MemoryQuery {
    q: Option<String>,
}

pub(crate) async fn memory(
    State(state): Shared,
    Extension(v): Extension<Visitor>,
    Query(q): Query<MemoryQuery>,
) -> Response {
    let query = q.q.unwrap_or_default();
    let mut h = Html::default();
    h.raw(r#"<form class="search" method="get" action="/console/memory" role="search"><label for="q">Search long-term memory</label><input id="q" name="q" type="search" value=""#)
        .text(&query)
        .raw(r#""><button type="submit">Search</button></form>"#);
    match call(&state, state.backend().memory(query.clone())).await {
        Ok(r) => memory_results(&mut h, &r, query.trim().is_empty()),
        Err(e) => problem(&mut h, "Memory", &e),
    }
    done(&state, &v, "Memory", "/console/memory", h)
}

fn memory_results(h: &mut Html, r: &Value, facts_only: bool) {
    if let Some(w) = r["warning"].as_str() {
        h.el(
            "p class=\"hint\"",
            &format!("Vectors unavailable, full text only: {w}"),
        );
    }
    let chunks = r["chunks"].as_array().cloned().unwrap_or_default();
    if !facts_only {
        h.raw(r#"<h2>Notes</h2>"#);
        if chunks.is_empty() {
            h.el("p", "No note matches.");
        }
        h.raw("<ol class=\"hits\">");
        for c in &chunks {
            h.raw("<li><p class=\"meta\">")
                .text(&format!(
                    "{}:{}-{}",
                    s(c, "path"),
                    c["start_line"],
                    c["end_line"]
                ))
                .raw("</p><pre>")
                .text(s(c, "text"))
                .raw("</pre></li>");
        }
        h.raw("</ol>");
        let episodes = r["episodes"].as_array().cloned().unwrap_or_default();
        if !episodes.is_empty() {
            h.raw("<h2>Episodes</h2><ul>");
            for e in &episodes {
                h.el("li", &format!("#{} {}", e["id"], s(e, "summary")));
            }
            h.raw("</ul>");
        }
    }
    h.raw(if facts_only {
        "<h2>Facts</h2>"
    } else {
        "<h2>Matching facts</h2>"
    });
    let facts = r["facts"].as_array().cloned().unwrap_or_default();
    if facts.is_empty() {
        h.el("p", "No fact.");
        return;
    }
    h.raw(r#"<div class="table"><table><thead><tr><th scope="col">Entity</th><th scope="col">Attribute</th><th scope="col">Value</th><th scope="col">Source</th></tr></thead><tbody>"#);
    for f in &facts {
        let source = match f["session_id"].as_str() {
            Some(sid) => format!("{} · session {sid}", s(f, "source")),
            None => s(f, "source").to_string(),
        };
        h.raw("<tr>")
            .el("td", s(f, "entity"))
            .el("td", s(f, "attribute"))
            .el("td", s(f, "value"))
            .el("td", &source)
            .raw("</tr>");
    }
    h.raw("</tbody></table></div>");
}

pub(crate) async fn chat(State(state): Shared, Extension(v): Extension<Visitor>) -> Response {
    let mut h = Html::default();
    h.raw(r#"<form id="chat" class="chat" method="post" action="/console/chat">"#)
        .raw(r#"<label for="chat-name">Session name (web:<em>name</em>)</label><input id="chat-name" name="name" value="console" required maxlength="40" autocomplete="off">"#)
        .raw(r#"<label for="chat-text">Message</label><textarea id="chat-text" name="text" rows="3" required></textarea>"#)
        .raw(r#"<button type="submit">Send</button></form>"#)
        .raw(r#"<div id="chat-log" class="chat-log" aria-live="polite"></div>"#);
    done(&state, &v, "Chat", "/console/chat", h)
}
