//! The `Origin` codec: a web origin (`[http] cors_origins`).

use super::{Codec, Value, Walker, q, string};

/// A web origin as browsers send it in `Origin`: `http(s)://host[:port]`, nothing after.
pub struct Origin;

impl Codec for Origin {
    type T = String;
    fn read(&self, w: &Walker<'_>, path: &str, v: Value) -> Option<String> {
        let s = string(w, path, v)?;
        let rest = s
            .strip_prefix("https://")
            .or_else(|| s.strip_prefix("http://"));
        let host_ok = rest.is_some_and(|r| {
            // A host comes first (a name, an address, or `[` of an IPv6 one), never `:`.
            r.bytes()
                .next()
                .is_some_and(|b| b.is_ascii_alphanumeric() || b == b'[')
                && r.bytes().all(|b| {
                    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b':' | b'[' | b']')
                })
        });
        if !host_ok {
            w.problem(
                path,
                format!(
                    "expected an origin like \"https://chat.example.com\" or \"http://localhost:3000\" (scheme, host and port only; no path, no `*`), got {:?}",
                    s.chars().take(80).collect::<String>()
                ),
            );
            return None;
        }
        Some(s)
    }
    fn show(&self, v: &String) -> Option<String> {
        Some(q(v))
    }
    fn kind(&self) -> String {
        "web origin".into()
    }
}
