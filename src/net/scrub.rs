//! The one rule for the error text of every HTTP client (DESIGN §2.6, security rule): it never
//! carries the request URL, and never a secret. A URL may hold one (the Telegram token in
//! `/bot<token>/…`, a key in a query string), so reqwest errors are formatted without it, and
//! text a server or library wrote is passed through [`redact`] with the secrets it could echo.

pub use crate::redact::{REDACTED, redact};

/// A reqwest error and its causes as `error: cause: cause`, without the request URL
/// (`error sending request: …`, not `error sending request for url (https://…)`).
pub fn reqwest_error_text(e: reqwest::Error) -> String {
    crate::telemetry::error_chain(&e.without_url())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw";

    #[test]
    fn redact_replaces_every_secret_in_order() {
        let text = format!("GET /bot{TOKEN}/getMe?key=sk-1 failed: sk-1");
        let secret = TOKEN.split_once(':').unwrap().1;
        let out = redact(&text, &[TOKEN, secret, "sk-1", ""]);
        assert_eq!(
            out,
            "GET /bot[redacted]/getMe?key=[redacted] failed: [redacted]"
        );
        assert_eq!(redact("fine", &["sk-1"]), "fine");
        assert_eq!(redact("fine", &[]), "fine");
    }

    #[tokio::test]
    async fn reqwest_errors_never_carry_the_url() {
        // Port 1 on loopback: connection refused; reqwest's own text names the URL, with the
        // token in its path and a key in its query.
        let url = format!("http://127.0.0.1:1/bot{TOKEN}/getMe?api_key=sk-secret-123");
        let e = reqwest::Client::new().get(&url).send().await.unwrap_err();
        assert!(e.to_string().contains(TOKEN), "precondition: {e}");
        let text = reqwest_error_text(e);
        assert!(text.starts_with("error sending request"), "{text}");
        for leak in [TOKEN, "sk-secret-123", "127.0.0.1:1", "getMe", "http://"] {
            assert!(!text.contains(leak), "{leak} in {text}");
        }
    }

    proptest::proptest! {
        #[test]
        fn redacted_text_never_holds_the_secret(
            prefix in ".{0,40}",
            // No character of REDACTED, so a replacement cannot form the secret anew.
            secret in "[A-Z0-9:_-]{8,40}",
            middle in ".{0,40}",
            suffix in ".{0,40}",
        ) {
            let text = format!("{prefix}{secret}{middle}{secret}{suffix}");
            proptest::prop_assert!(!redact(&text, &[&secret]).contains(&secret));
        }
    }
}
