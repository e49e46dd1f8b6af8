//! The one rule for secrets in text the daemon shows (docs/security.md, "Secrets in URLs and
//! error text"): [`redact`] replaces known secrets, [`display_url`] shows a URL without the
//! parts that may be credentials (userinfo, query values, path segments that look like keys),
//! and [`url_secrets`] lists those parts so that text a library wrote about the URL (an error
//! naming it) can be redacted. The log layers redact every secret the config holds
//! ([`register`], [`scrub_registered`]) as a last line: rmcp, reqwest and hyper write their own
//! log lines and error texts, which may name a URL.

use std::sync::RwLock;

/// What replaces a secret.
pub const REDACTED: &str = "[redacted]";

/// A path segment at least this long, with a letter and a digit, is taken for a key.
const KEY_LIKE_MIN: usize = 16;

/// `text` with every occurrence of each non-empty secret replaced by [`REDACTED`], in the
/// order given (list a secret before the parts of it that are secrets too).
pub fn redact(text: &str, secrets: &[&str]) -> String {
    secrets
        .iter()
        .filter(|s| !s.is_empty())
        .fold(text.to_string(), |out, s| {
            if out.contains(s) {
                out.replace(s, REDACTED)
            } else {
                out
            }
        })
}

/// The parts of `url` that may be secrets, as they appear in its written form and decoded:
/// the user name and password, every query value, the fragment, and each path segment that
/// looks like a key (at least 16 characters of letters, digits and `-_.~:%`, with a letter and
/// a digit). Longest first, so that [`redact`] replaces a whole secret before its parts. Empty
/// for text that is not an absolute URL.
pub fn url_secrets(url: &str) -> Vec<String> {
    let Ok(parsed) = url::Url::parse(url.trim()) else {
        return Vec::new();
    };
    if !parsed.has_host() {
        // An opaque URL (`user:secret@host` reads as one): all of it after the scheme.
        let rest = url.trim()[parsed.scheme().len()..].trim_start_matches(':');
        return if rest.is_empty() {
            Vec::new()
        } else {
            vec![rest.to_string()]
        };
    }
    let mut out: Vec<String> = Vec::new();
    let mut add = |raw: &str| {
        if raw.is_empty() {
            return;
        }
        out.push(raw.to_string());
        if let Ok(decoded) = percent_decode(raw)
            && decoded != raw
            && !decoded.is_empty()
        {
            out.push(decoded);
        }
    };
    add(parsed.username());
    add(parsed.password().unwrap_or(""));
    for pair in parsed.query().unwrap_or("").split('&') {
        add(pair.split_once('=').map_or("", |(_, v)| v));
    }
    add(parsed.fragment().unwrap_or(""));
    for segment in parsed.path().split('/') {
        if looks_like_key(segment) {
            add(segment);
        }
    }
    out.sort_by_key(|s| std::cmp::Reverse(s.len()));
    out.dedup();
    out
}

/// `url` with its userinfo, query values, fragment and key-like path segments replaced by
/// [`REDACTED`]; text that is not an absolute URL is returned as it is (it holds none of
/// these parts).
pub fn display_url(url: &str) -> String {
    let Ok(mut parsed) = url::Url::parse(url.trim()) else {
        return url.to_string();
    };
    if !parsed.has_host() {
        // `user:secret@host` parses as scheme `user` and an opaque path.
        return format!("{}:{REDACTED}", parsed.scheme());
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        let _ = parsed.set_username(REDACTED);
        let _ = parsed.set_password(None);
    }
    let path: Vec<String> = parsed
        .path()
        .split('/')
        .map(|s| {
            if looks_like_key(s) {
                REDACTED.to_string()
            } else {
                s.to_string()
            }
        })
        .collect();
    parsed.set_path(&path.join("/"));
    if let Some(query) = parsed.query() {
        let shown: Vec<String> = query
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((k, v)) if !v.is_empty() => format!("{k}={REDACTED}"),
                _ => pair.to_string(),
            })
            .collect();
        parsed.set_query(Some(&shown.join("&")));
    }
    if parsed.fragment().is_some() {
        parsed.set_fragment(Some(REDACTED));
    }
    // `Url` writes brackets percent-encoded; the marker reads better as itself.
    parsed
        .as_str()
        .replace("%5Bredacted%5D", REDACTED)
        .replace("[redacted]@", &format!("{REDACTED}@"))
}

/// A URL-valued key's value for an error message: the [`display_url`] form quoted, or, for text
/// that is not an absolute URL, a description without the text (it may be a credential typed
/// into the wrong place).
pub fn describe_url_value(value: &str) -> String {
    match url::Url::parse(value.trim()) {
        Ok(u) if u.has_host() => format!("{:?}", display_url(value)),
        _ => format!(
            "text that is not an absolute URL ({} characters, not shown)",
            value.chars().count()
        ),
    }
}

fn looks_like_key(segment: &str) -> bool {
    segment.len() >= KEY_LIKE_MIN
        && segment
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.~:%".contains(c))
        && segment.chars().any(|c| c.is_ascii_digit())
        && segment.chars().any(|c| c.is_ascii_alphabetic())
}

fn percent_decode(s: &str) -> Result<String, std::string::FromUtf8Error> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (
            bytes[i],
            bytes.get(i + 1).copied(),
            bytes.get(i + 2).copied(),
        ) {
            (b'%', Some(h), Some(l)) if hex(h).is_some() && hex(l).is_some() => {
                out.push((hex(h).unwrap_or(0) * 16 + hex(l).unwrap_or(0)) as u8);
                i += 3;
            }
            (b'+', _, _) => {
                out.push(b' ');
                i += 1;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out)
}

/// Secrets every log line is scrubbed of: the config's keys and tokens and the secret parts of
/// its URLs (set at start and on each reload; longest first).
static REGISTERED: RwLock<Vec<String>> = RwLock::new(Vec::new());

/// Add `secrets` to the ones log lines are scrubbed of (empty ones and ones shorter than 4
/// characters are skipped: too short to be a secret, too likely to be ordinary text).
pub fn register(secrets: impl IntoIterator<Item = String>) {
    let mut all = REGISTERED.write().unwrap_or_else(|p| p.into_inner());
    for s in secrets {
        if s.len() >= 4 && !all.contains(&s) {
            all.push(s);
        }
    }
    all.sort_by_key(|s| std::cmp::Reverse(s.len()));
}

/// `text` with every registered secret replaced by [`REDACTED`]; borrowed when it holds none.
pub fn scrub_registered(text: &str) -> std::borrow::Cow<'_, str> {
    let all = REGISTERED.read().unwrap_or_else(|p| p.into_inner());
    if !all.iter().any(|s| text.contains(s.as_str())) {
        return std::borrow::Cow::Borrowed(text);
    }
    let refs: Vec<&str> = all.iter().map(String::as_str).collect();
    std::borrow::Cow::Owned(redact(text, &refs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const URL: &str = "https://canaryuser:CanaryPass4321@mcp.example.com/v1/CanaryPathKey0123456789abcdef/sse?api_key=CanaryQueryValue98765&mode=fast#frag";

    #[test]
    fn every_secret_part_of_a_url_is_listed() {
        let s = url_secrets(URL);
        for part in [
            "canaryuser",
            "CanaryPass4321",
            "CanaryPathKey0123456789abcdef",
            "CanaryQueryValue98765",
            "fast",
            "frag",
        ] {
            assert!(s.iter().any(|x| x == part), "{part} missing from {s:?}");
        }
        assert!(
            !s.iter()
                .any(|x| x == "v1" || x == "sse" || x == "mcp.example.com")
        );
        assert!(url_secrets("not a url").is_empty());
    }

    #[test]
    fn a_displayed_url_keeps_its_shape_without_the_secrets() {
        let shown = display_url(URL);
        assert_eq!(
            shown,
            "https://[redacted]@mcp.example.com/v1/[redacted]/sse?api_key=[redacted]&mode=[redacted]#[redacted]"
        );
        assert_eq!(
            display_url("https://api.openai.com/v1"),
            "https://api.openai.com/v1"
        );
        assert_eq!(display_url(""), "");
        assert_eq!(
            display_url(
                "https://api.telegram.org/bot123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw/getMe"
            ),
            "https://api.telegram.org/[redacted]/getMe"
        );
    }

    #[test]
    fn a_value_that_is_no_url_is_not_shown() {
        assert_eq!(
            describe_url_value("ftp://u:secretpw@h/x"),
            "\"ftp://[redacted]@h/x\""
        );
        for bad in ["user:secretpw@host", "secretpw", "mailto:secretpw"] {
            let d = describe_url_value(bad);
            assert!(!d.contains("secretpw"), "{d}");
            assert!(
                !display_url(bad).contains("secretpw") || !bad.contains(':'),
                "{bad}"
            );
        }
        assert_eq!(url_secrets("user:secretpw@host"), ["secretpw@host"]);
    }

    #[test]
    fn percent_encoded_secrets_are_listed_both_ways() {
        let s = url_secrets("http://h/x?k=a%2Fb%20c123");
        assert!(s.contains(&"a%2Fb%20c123".to_string()), "{s:?}");
        assert!(s.contains(&"a/b c123".to_string()), "{s:?}");
    }

    #[test]
    fn registered_secrets_are_scrubbed_from_any_text() {
        register(["sk-registered-secret-1".to_string(), "ab".to_string()]);
        assert_eq!(
            scrub_registered("key sk-registered-secret-1 and ab"),
            "key [redacted] and ab"
        );
        assert!(matches!(
            scrub_registered("nothing here"),
            std::borrow::Cow::Borrowed(_)
        ));
    }

    proptest! {
        /// Whatever a URL holds in its userinfo, query and a key-like segment, neither its
        /// display form nor a text redacted with its secrets holds it.
        #[test]
        fn secrets_never_survive(user in "[A-Z]{4,10}", pass in "[A-Za-z0-9]{8,20}", key in "[A-Za-z]{8}[0-9]{8}", q in "[A-Za-z0-9]{6,12}") {
            let url = format!("https://{user}:{pass}@h.example/p/{key}?token={q}");
            let shown = display_url(&url);
            let secrets = url_secrets(&url);
            let refs: Vec<&str> = secrets.iter().map(String::as_str).collect();
            let said = redact(&format!("error sending request for url ({url})"), &refs);
            for s in [&user, &pass, &key, &q] {
                prop_assert!(!shown.contains(s.as_str()), "{} in {}", s, shown);
                prop_assert!(!said.contains(s.as_str()), "{} in {}", s, said);
            }
        }
    }
}
