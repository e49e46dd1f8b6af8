//! Console sessions (SPEC §22): the API token exchanged for a random session id kept in
//! memory only (a restart logs everyone out; so does a token change: each session remembers
//! a digest of the token it was opened with), a bounded count and lifetime, a CSRF token per
//! session, the Origin check, and the cookie.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::http::HeaderMap;
use axum::http::header::{COOKIE, HOST, ORIGIN};
use rand::RngCore;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// The cookie's name.
pub(crate) const COOKIE_NAME: &str = "agentd_console";
/// Sessions open at once; a login beyond that ends the oldest.
pub(crate) const MAX_SESSIONS: usize = 32;
/// How long a session lives after its login, used or not.
pub(crate) const LIFETIME: Duration = Duration::from_secs(12 * 3600);

struct Open {
    csrf: String,
    token_digest: [u8; 32],
    opened: Instant,
}

/// The open sessions. Empty (and unallocated) until the first login.
#[derive(Default)]
pub(crate) struct Sessions(Mutex<HashMap<String, Open>>);

/// A logged-in request: its session id and CSRF token.
#[derive(Clone)]
pub(crate) struct Visitor {
    pub(crate) id: String,
    pub(crate) csrf: String,
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

fn random_hex(bytes: usize) -> String {
    let mut b = vec![0u8; bytes];
    rand::rng().fill_bytes(&mut b);
    b.iter().map(|x| format!("{x:02x}")).collect()
}

impl Sessions {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Open>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Opens a session for a right token (the caller compared it): its id and CSRF token.
    pub(crate) fn open(&self, token: &str, now: Instant) -> Visitor {
        let mut map = self.lock();
        map.retain(|_, s| now.saturating_duration_since(s.opened) < LIFETIME);
        if map.len() >= MAX_SESSIONS
            && let Some(oldest) = map
                .iter()
                .min_by_key(|(_, s)| s.opened)
                .map(|(k, _)| k.clone())
        {
            map.remove(&oldest);
        }
        let v = Visitor {
            id: random_hex(32),
            csrf: random_hex(32),
        };
        map.insert(
            v.id.clone(),
            Open {
                csrf: v.csrf.clone(),
                token_digest: digest(token),
                opened: now,
            },
        );
        v
    }

    /// The session of `id`, if open, younger than [`LIFETIME`] and opened with the token
    /// configured now.
    pub(crate) fn find(&self, id: &str, token: &str, now: Instant) -> Option<Visitor> {
        let mut map = self.lock();
        let s = map.get(id)?;
        let fresh = now.saturating_duration_since(s.opened) < LIFETIME;
        if !fresh || !bool::from(s.token_digest.ct_eq(&digest(token))) {
            map.remove(id);
            return None;
        }
        Some(Visitor {
            id: id.to_string(),
            csrf: s.csrf.clone(),
        })
    }

    pub(crate) fn close(&self, id: &str) {
        self.lock().remove(id);
    }
}

/// The console cookie's value in the request's `Cookie` headers.
pub(crate) fn cookie(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == COOKIE_NAME)
        .map(|(_, v)| v.to_string())
}

/// `Set-Cookie` for session `id` (`None`: the cookie removed).
pub(crate) fn set_cookie(id: Option<&str>, secure: bool) -> String {
    let secure = if secure { "; Secure" } else { "" };
    match id {
        Some(id) => format!(
            "{COOKIE_NAME}={id}; HttpOnly; SameSite=Strict; Path=/console; Max-Age={}{secure}",
            LIFETIME.as_secs()
        ),
        None => {
            format!("{COOKIE_NAME}=; HttpOnly; SameSite=Strict; Path=/console; Max-Age=0{secure}")
        }
    }
}

/// Whether the request came over TLS to a proxy in front (`X-Forwarded-Proto: https`).
pub(crate) fn behind_tls(headers: &HeaderMap) -> bool {
    headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("https"))
}

/// A state change must come from the console's own pages: an `Origin` whose host is the
/// request's `Host`; or, where the browser sends `Origin: null` (a form POST under
/// `Referrer-Policy: no-referrer`) or none, `Sec-Fetch-Site: same-origin`, which no page can
/// set. Anything else is refused.
pub(crate) fn same_origin(headers: &HeaderMap) -> bool {
    let Some(host) = headers.get(HOST).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let fetch_site = header("sec-fetch-site");
    if fetch_site.is_some_and(|s| s != "same-origin") {
        return false;
    }
    match header(ORIGIN.as_str()) {
        Some(origin) if origin != "null" => origin
            .strip_prefix("http://")
            .or_else(|| origin.strip_prefix("https://"))
            .is_some_and(|h| h.eq_ignore_ascii_case(host)),
        _ => fetch_site == Some("same-origin"),
    }
}

/// `given` equals the session's CSRF token (constant time).
pub(crate) fn csrf_ok(v: &Visitor, given: Option<&str>) -> bool {
    given.is_some_and(|g| !g.is_empty() && bool::from(g.as_bytes().ct_eq(v.csrf.as_bytes())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn a_session_ends_with_its_lifetime_a_token_change_or_a_logout() {
        let s = Sessions::default();
        let t0 = Instant::now();
        let v = s.open("tok", t0);
        assert!(s.find(&v.id, "tok", t0).is_some());
        assert!(s.find(&v.id, "tok", t0 + LIFETIME).is_none());
        let v = s.open("tok", t0);
        assert!(s.find(&v.id, "other", t0).is_none());
        assert!(
            s.find(&v.id, "tok", t0).is_none(),
            "removed on the mismatch"
        );
        let v = s.open("tok", t0);
        s.close(&v.id);
        assert!(s.find(&v.id, "tok", t0).is_none());
    }

    #[test]
    fn the_count_stays_bounded() {
        let s = Sessions::default();
        let t0 = Instant::now();
        let first = s.open("tok", t0);
        for i in 0..MAX_SESSIONS {
            s.open("tok", t0 + Duration::from_secs(i as u64 + 1));
        }
        assert_eq!(s.lock().len(), MAX_SESSIONS);
        assert!(s.find(&first.id, "tok", t0).is_none(), "the oldest went");
    }

    #[test]
    fn origin_must_be_the_host() {
        let mut h = HeaderMap::new();
        h.insert(HOST, HeaderValue::from_static("127.0.0.1:8100"));
        assert!(!same_origin(&h));
        h.insert(ORIGIN, HeaderValue::from_static("http://127.0.0.1:8100"));
        assert!(same_origin(&h));
        h.insert(ORIGIN, HeaderValue::from_static("http://evil.example"));
        assert!(!same_origin(&h));
        h.insert(ORIGIN, HeaderValue::from_static("null"));
        assert!(!same_origin(&h));
        h.insert("sec-fetch-site", HeaderValue::from_static("same-origin"));
        assert!(same_origin(&h), "a form POST under no-referrer");
        h.insert(ORIGIN, HeaderValue::from_static("http://evil.example"));
        assert!(!same_origin(&h));
        h.insert(ORIGIN, HeaderValue::from_static("http://127.0.0.1:8100"));
        h.insert("sec-fetch-site", HeaderValue::from_static("cross-site"));
        assert!(!same_origin(&h));
    }

    #[test]
    fn cookie_is_found_among_others() {
        let mut h = HeaderMap::new();
        h.insert(
            COOKIE,
            HeaderValue::from_static("a=1; agentd_console=abc; b=2"),
        );
        assert_eq!(cookie(&h).as_deref(), Some("abc"));
        assert!(set_cookie(Some("x"), true).contains("HttpOnly; SameSite=Strict; Path=/console"));
        assert!(set_cookie(Some("x"), true).ends_with("; Secure"));
    }
}
