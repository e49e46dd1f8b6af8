//! The web console (SPEC §22): `/console/` on the API listener. Server-rendered HTML (every
//! datum through `html::esc`), one small script and one stylesheet embedded in the binary,
//! nothing from another origin. Login with the API token opens an in-memory session
//! (`login`); every state change carries its CSRF token and comes from the console's origin.
//!
//! - `pages`: the pages; `conversation`: one session's trail as a person reads it;
//!   `charts`: the cost page's SVG; `live`: the server-sent events of the overview and the
//!   chat.

mod charts;
mod conversation;
mod html;
mod live;
mod login;
mod pages;

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::header::{
    CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE, LOCATION, REFERRER_POLICY, SET_COOKIE,
    X_CONTENT_TYPE_OPTIONS, X_FRAME_OPTIONS,
};
use axum::http::{HeaderValue, Method, StatusCode};
use axum::middleware::{Next, from_fn, from_fn_with_state};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use secrecy::ExposeSecret;
use subtle::ConstantTimeEq;

pub(crate) use login::Sessions;
use login::Visitor;

use super::ratelimit::{Group, rate_limit};
use super::reply::RawBody;
use super::server::ApiState;

type Shared = State<Arc<ApiState>>;

/// No script but our own file, no inline script or style, no eval, no frames, nothing from
/// another origin.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
                   connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

const CSS: &str = include_str!("assets/console.css");
const JS: &str = include_str!("assets/console.js");

/// The console's routes (merged into the API's router when `[http] console` is on). Pages
/// count against the read rate limit, state changes against the POST one; the two assets
/// against none.
pub(crate) fn router(state: &Arc<ApiState>) -> Router<Arc<ApiState>> {
    let gate = from_fn_with_state(state.clone(), gate);
    let reads = Router::new()
        .route("/console/", get(pages::overview))
        .route("/console/login", get(pages::login_form))
        .route("/console/sessions", get(pages::sessions))
        .route("/console/sessions/{id}", get(pages::session))
        .route("/console/costs", get(pages::costs))
        .route("/console/approvals", get(pages::approvals))
        .route("/console/schedules", get(pages::schedules))
        .route("/console/memory", get(pages::memory))
        .route("/console/chat", get(pages::chat))
        .route("/console/events", get(live::overview_events))
        .route_layer(gate.clone())
        .route_layer(from_fn_with_state((state.clone(), Group::Read), rate_limit));
    let posts = Router::new()
        .route("/console/login", post(login))
        .route("/console/logout", post(logout))
        .route("/console/sessions/reset", post(pages::reset))
        .route("/console/sessions/stop", post(pages::stop))
        .route("/console/approvals/{id}", post(pages::decide))
        .route("/console/chat", post(live::chat_send))
        .route_layer(gate)
        .route_layer(from_fn_with_state((state.clone(), Group::Post), rate_limit));
    Router::new()
        .route("/console", get(|| async { redirect("/console/") }))
        .route(
            "/console/assets/console.css",
            get(|| async { asset(CSS, "text/css; charset=utf-8") }),
        )
        .route(
            "/console/assets/console.js",
            get(|| async { asset(JS, "text/javascript; charset=utf-8") }),
        )
        .merge(reads)
        .merge(posts)
        .layer(from_fn(headers))
}

fn asset(body: &'static str, content_type: &'static str) -> Response {
    let mut r = Response::new(Body::from(body));
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

pub(crate) fn redirect(to: &'static str) -> Response {
    let mut r = StatusCode::SEE_OTHER.into_response();
    r.headers_mut()
        .insert(LOCATION, HeaderValue::from_static(to));
    r
}

/// An HTML answer.
pub(crate) fn html(status: StatusCode, body: String) -> Response {
    let mut r = (status, body).into_response();
    r.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    r
}

/// The security headers on every console answer. The console's own answers (HTML, assets,
/// events, redirects) keep their body; the layers' refusals (429, 413) stay the API's JSON.
async fn headers(req: Request, next: Next) -> Response {
    let mut r = next.run(req).await;
    if r.headers().contains_key(CONTENT_TYPE) || r.status().is_redirection() {
        r.extensions_mut().insert(RawBody);
    }
    let h = r.headers_mut();
    h.insert(CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    h.insert(X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

/// The configured token (`None`: none set, the console is closed like the API).
fn token(state: &ApiState) -> Option<&str> {
    state
        .config()
        .token
        .as_ref()
        .map(|t| t.expose_secret())
        .filter(|t| !t.is_empty())
}

fn refuse(status: StatusCode, why: &str) -> Response {
    let mut h = html::Html::default();
    h.el("p", why)
        .raw(r#"<p><a href="/console/">Back to the console</a></p>"#);
    html(
        status,
        html::page("Refused", "agentd", "", None, &h.into_string()),
    )
}

/// Every console route but the assets: POSTs must come from the console's origin; the login
/// pages are open, everything else needs a session (a page without one goes to the login
/// form) and every POST its CSRF token (`csrf` form field or `X-CSRF-Token` header).
async fn gate(State(state): Shared, req: Request, next: Next) -> Response {
    let post = req.method() == Method::POST;
    if post && !login::same_origin(req.headers()) {
        return refuse(
            StatusCode::FORBIDDEN,
            "refused: this request did not come from the console's own pages (Origin)",
        );
    }
    let path = req.uri().path().to_string();
    if path == "/console/login" {
        return next.run(req).await;
    }
    let visitor = match (token(&state), login::cookie(req.headers())) {
        (Some(t), Some(id)) => state.console().find(&id, t, Instant::now()),
        _ => None,
    };
    let Some(visitor) = visitor else {
        return if post || path == "/console/events" {
            refuse(
                StatusCode::UNAUTHORIZED,
                "not logged in, or the session ended: log in again",
            )
        } else {
            redirect("/console/login")
        };
    };
    let mut req = req;
    if post {
        let (parts, body) = req.into_parts();
        let Ok(bytes) = axum::body::to_bytes(body, state.max_body_bytes()).await else {
            return refuse(StatusCode::PAYLOAD_TOO_LARGE, "request body too large");
        };
        let header = parts
            .headers
            .get("x-csrf-token")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let field = form_field(&bytes, "csrf");
        if !login::csrf_ok(&visitor, header.as_deref().or(field.as_deref())) {
            return refuse(
                StatusCode::FORBIDDEN,
                "refused: missing or wrong CSRF token; reload the page",
            );
        }
        req = Request::from_parts(parts, Body::from(bytes));
    }
    req.extensions_mut().insert(visitor);
    next.run(req).await
}

/// The first value of `name` in an `application/x-www-form-urlencoded` body.
pub(crate) fn form_field(body: &[u8], name: &str) -> Option<String> {
    url::form_urlencoded::parse(body)
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned())
}

/// `POST /console/login` `token=…`: a right token opens a session (cookie) and goes to the
/// overview; a wrong one is counted and answered 401 with the form again.
async fn login(State(state): Shared, req: Request) -> Response {
    let secure = state.config().console_secure_cookie || login::behind_tls(req.headers());
    let Ok(bytes) = axum::body::to_bytes(req.into_body(), state.max_body_bytes()).await else {
        return refuse(StatusCode::PAYLOAD_TOO_LARGE, "request body too large");
    };
    let given = form_field(&bytes, "token").unwrap_or_default();
    let Some(expected) = token(&state) else {
        let why = format!(
            "the API token is not configured: set {}",
            state.config().token_env
        );
        return html(
            StatusCode::SERVICE_UNAVAILABLE,
            pages::login_page(&state, Some(&why)),
        );
    };
    if given.is_empty() || !bool::from(given.as_bytes().ct_eq(expected.as_bytes())) {
        state.backend().auth_failed();
        tracing::info!("web console: login with a wrong token refused");
        return html(
            StatusCode::UNAUTHORIZED,
            pages::login_page(&state, Some("wrong token")),
        );
    }
    let v = state.console().open(expected, Instant::now());
    let mut r = redirect("/console/");
    if let Ok(c) = HeaderValue::from_str(&login::set_cookie(Some(&v.id), secure)) {
        r.headers_mut().insert(SET_COOKIE, c);
    }
    r
}

/// `POST /console/logout`: the session ends and the cookie goes.
async fn logout(State(state): Shared, req: Request) -> Response {
    let secure = state.config().console_secure_cookie || login::behind_tls(req.headers());
    if let Some(v) = req.extensions().get::<Visitor>() {
        state.console().close(&v.id);
    }
    let mut r = redirect("/console/login");
    if let Ok(c) = HeaderValue::from_str(&login::set_cookie(None, secure)) {
        r.headers_mut().insert(SET_COOKIE, c);
    }
    r
}
