//! The SSRF guard for every outbound HTTP request whose URL the model can influence
//! (SPEC §11 `web_fetch`, reliability notes §3.9).
//!
//! - [`is_blocked`] classifies one address (loopback, private, link-local, metadata, multicast,
//!   reserved, documentation, and IPv6 forms that embed an IPv4 address).
//! - [`Guard::resolve`] checks a parsed URL (scheme, host, userinfo), resolves its name and
//!   refuses it when ANY answer is blocked, returning the validated addresses.
//! - [`fetch`] connects only to those validated addresses (a per-request client whose resolver
//!   answers with them and nothing else, so no second lookup can rebind), disables reqwest's
//!   redirects and proxies, follows up to [`MAX_REDIRECTS`] redirects itself, re-validating every
//!   `Location`, and streams the body up to a byte cap.
//!
//! Host checks run on the parsed `Url`, never on the raw string: the WHATWG parser turns
//! `2130706433`, `0x7f.1` and `017700000001` into `127.0.0.1`, and brackets off IPv6 literals.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use reqwest::Url;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use reqwest::header::{ACCEPT_ENCODING, CONTENT_ENCODING, CONTENT_TYPE, LOCATION};

/// Redirects followed by [`fetch`] before it gives up.
pub const MAX_REDIRECTS: usize = 5;
/// Connect timeout of every hop.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a URL was refused or a fetch failed. Messages name the URL's host, never its query.
#[derive(Debug, thiserror::Error)]
pub enum SsrfError {
    #[error("invalid URL: {0}")]
    InvalidUrl(String),
    #[error("scheme '{0}' is not allowed; only http and https URLs can be fetched")]
    Scheme(String),
    #[error("URL has no host; give an http(s) URL with a host name")]
    NoHost,
    #[error(
        "URL contains a user name or password; credentials in URLs are not allowed, remove the \
         'user@' part"
    )]
    Userinfo,
    #[error(
        "host '{host}' resolves to {addr}, a {why} address; fetching internal addresses is \
         not allowed (add the host to [tools.web_fetch] allow_hosts only for a deliberate local \
         service)"
    )]
    Blocked {
        host: String,
        addr: IpAddr,
        why: &'static str,
    },
    #[error(
        "host '{0}' is a local name; fetching internal hosts is not allowed (add it to \
         [tools.web_fetch] allow_hosts only for a deliberate local service)"
    )]
    LocalName(String),
    #[error("cannot resolve host '{host}': {reason}")]
    Dns { host: String, reason: String },
    #[error("more than {MAX_REDIRECTS} redirects; last location was on host '{0}'")]
    TooManyRedirects(String),
    #[error("redirect without a valid Location header from host '{0}'")]
    BadRedirect(String),
    #[error("request timed out after {0:?}")]
    Timeout(Duration),
    #[error("request to host '{host}' failed: {reason}")]
    Http { host: String, reason: String },
}

/// Is `ip` an address the model must not reach (anything but the public unicast internet)?
pub fn is_blocked(ip: IpAddr) -> bool {
    block_reason(ip).is_some()
}

/// Why `ip` is blocked, or `None` for a public address.
pub fn block_reason(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => v4_reason(v4),
        IpAddr::V6(v6) => v6_reason(v6),
    }
}

fn v4_reason(ip: Ipv4Addr) -> Option<&'static str> {
    let o = ip.octets();
    let reason = match o {
        [0, ..] => "'this network' (0.0.0.0/8)",
        [127, ..] => "loopback",
        [10, ..] => "private (10.0.0.0/8)",
        [172, b, ..] if (16..=31).contains(&b) => "private (172.16.0.0/12)",
        [192, 168, ..] => "private (192.168.0.0/16)",
        [100, b, ..] if (64..=127).contains(&b) => "shared/CGNAT (100.64.0.0/10)",
        [169, 254, 169, 254] => "cloud metadata",
        [169, 254, ..] => "link-local",
        [192, 0, 0, _] => "IETF protocol assignment (192.0.0.0/24)",
        [192, 0, 2, _] | [198, 51, 100, _] | [203, 0, 113, _] => "documentation",
        [192, 88, 99, _] => "6to4 relay anycast",
        [198, b, ..] if b == 18 || b == 19 => "benchmarking (198.18.0.0/15)",
        [a, ..] if (224..=239).contains(&a) => "multicast",
        [255, 255, 255, 255] => "broadcast",
        [a, ..] if a >= 240 => "reserved (240.0.0.0/4)",
        _ => return None,
    };
    Some(reason)
}

fn v6_reason(ip: Ipv6Addr) -> Option<&'static str> {
    let s = ip.segments();
    if ip.is_unspecified() {
        return Some("unspecified (::)");
    }
    if ip.is_loopback() {
        return Some("loopback");
    }
    // IPv4-mapped ::ffff:0:0/96 and IPv4-compatible ::/96: the embedded address decides, and an
    // embedded public address is still refused (no legitimate use, a classic bypass).
    if s[..5] == [0, 0, 0, 0, 0] && (s[5] == 0xffff || s[5] == 0) {
        return Some(v4_reason(embedded_v4(s[6], s[7])).unwrap_or("IPv4-embedded IPv6"));
    }
    // NAT64 well-known prefix 64:ff9b::/96 and local-use 64:ff9b:1::/48.
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return v4_reason(embedded_v4(s[6], s[7]));
    }
    if s[0] == 0x64 && s[1] == 0xff9b && s[2] == 1 {
        return Some("local-use NAT64 (64:ff9b:1::/48)");
    }
    // 6to4 2002::/16 carries an IPv4 address in bits 16..48.
    if s[0] == 0x2002 {
        return v4_reason(embedded_v4(s[1], s[2]));
    }
    let reason = match s[0] {
        // Teredo hides the client address (XORed): refuse the whole prefix.
        0x2001 if s[1] == 0 => "Teredo (2001::/32)",
        0x2001 if s[1] == 0x0db8 => "documentation (2001:db8::/32)",
        0x2001 if s[1] < 0x0200 => "IETF protocol assignment (2001::/23)",
        0x0100 if s[1..4] == [0, 0, 0] => "discard-only (100::/64)",
        a if a & 0xfe00 == 0xfc00 => "unique local (fc00::/7)",
        a if a & 0xffc0 == 0xfe80 => "link-local (fe80::/10)",
        a if a & 0xffc0 == 0xfec0 => "site-local (fec0::/10)",
        a if a & 0xff00 == 0xff00 => "multicast (ff00::/8)",
        // Everything outside global unicast 2000::/3 is reserved.
        a if a & 0xe000 != 0x2000 => "reserved IPv6",
        _ => return None,
    };
    Some(reason)
}

fn embedded_v4(hi: u16, lo: u16) -> Ipv4Addr {
    let [a, b] = hi.to_be_bytes();
    let [c, d] = lo.to_be_bytes();
    Ipv4Addr::new(a, b, c, d)
}

/// The SSRF guard: decides which URLs may be fetched and to which addresses.
#[derive(Debug, Clone, Default)]
pub struct Guard {
    /// Hosts (`name`, `1.2.3.4`, `::1`) or `host:port` pairs exempt from the block list.
    allow_hosts: Vec<String>,
}

/// A URL that passed the scheme/host checks, before DNS.
enum Host {
    Ip(IpAddr),
    Name(String),
}

impl Guard {
    /// A guard exempting `allow_hosts` (`[tools.web_fetch] allow_hosts`) from the block list.
    /// Entries are compared case-insensitively, without IPv6 brackets or a trailing dot.
    pub fn new(allow_hosts: Vec<String>) -> Guard {
        Guard {
            allow_hosts: allow_hosts.iter().map(|h| normalise_entry(h)).collect(),
        }
    }

    /// Is `url`'s host exempt? (`host` or `host:port` in `allow_hosts`.)
    fn allowed(&self, host: &str, port: u16) -> bool {
        let with_port = if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        self.allow_hosts
            .iter()
            .any(|entry| *entry == host || *entry == with_port)
    }

    /// The checks that need no DNS: scheme, host form, userinfo, local names, IP literals.
    fn precheck(&self, url: &Url) -> Result<(Host, u16, bool), SsrfError> {
        match url.scheme() {
            "http" | "https" => {}
            other => return Err(SsrfError::Scheme(other.to_string())),
        }
        let port = url
            .port_or_known_default()
            .ok_or_else(|| SsrfError::InvalidUrl("no port".into()))?;
        // The parser has already normalised numeric IPv4 forms and bracketed IPv6 literals;
        // a host that parses as an address is one.
        let raw = url.host_str().ok_or(SsrfError::NoHost)?;
        let bare = raw
            .strip_prefix('[')
            .and_then(|r| r.strip_suffix(']'))
            .unwrap_or(raw);
        let host = match bare.parse::<IpAddr>() {
            Ok(ip) => Host::Ip(ip),
            Err(_) => {
                let name = bare.trim_end_matches('.').to_ascii_lowercase();
                if name.is_empty() {
                    return Err(SsrfError::NoHost);
                }
                match name.parse::<IpAddr>() {
                    Ok(ip) => Host::Ip(ip),
                    Err(_) => Host::Name(name),
                }
            }
        };
        let shown = match &host {
            Host::Ip(ip) => ip.to_string(),
            Host::Name(n) => n.clone(),
        };
        let allowed = self.allowed(&shown, port);
        if !allowed {
            match &host {
                Host::Ip(ip) => {
                    if let Some(why) = block_reason(*ip) {
                        return Err(SsrfError::Blocked {
                            host: shown,
                            addr: *ip,
                            why,
                        });
                    }
                }
                Host::Name(name) => {
                    if is_local_name(name) {
                        return Err(SsrfError::LocalName(name.clone()));
                    }
                }
            }
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(SsrfError::Userinfo);
        }
        Ok((host, port, allowed))
    }

    /// Check `url` and resolve its host. Only http/https; the host may not be a local name;
    /// every resolved address must pass [`is_blocked`] unless the host is in `allow_hosts`.
    /// Returns the validated addresses (at least one) to connect to.
    pub async fn resolve(&self, url: &Url) -> Result<Vec<SocketAddr>, SsrfError> {
        let (host, port, allowed) = self.precheck(url)?;
        let name = match host {
            Host::Ip(ip) => return Ok(vec![SocketAddr::new(ip, port)]),
            Host::Name(name) => name,
        };
        let addrs: Vec<SocketAddr> = tokio::net::lookup_host((name.as_str(), port))
            .await
            .map_err(|e| SsrfError::Dns {
                host: name.clone(),
                reason: e.to_string(),
            })?
            .collect();
        validate_answers(name, addrs, allowed)
    }
}

/// Accept a DNS answer only when it is non-empty and — unless the host is allow-listed — no
/// address in it is blocked: one private answer among public ones refuses the whole name, since
/// the connector could pick any of them.
fn validate_answers(
    name: String,
    addrs: Vec<SocketAddr>,
    allowed: bool,
) -> Result<Vec<SocketAddr>, SsrfError> {
    if addrs.is_empty() {
        return Err(SsrfError::Dns {
            host: name,
            reason: "no addresses".into(),
        });
    }
    if !allowed {
        for addr in &addrs {
            let ip = canonical_ip(addr.ip());
            if let Some(why) = block_reason(ip) {
                return Err(SsrfError::Blocked {
                    host: name,
                    addr: ip,
                    why,
                });
            }
        }
    }
    Ok(addrs)
}

/// Names that always mean this machine or an internal network.
fn is_local_name(name: &str) -> bool {
    const SUFFIXES: [&str; 4] = [".localhost", ".local", ".internal", ".localdomain"];
    name == "localhost"
        || name == "localhost.localdomain"
        || SUFFIXES.iter().any(|s| name.ends_with(s))
}

/// An IPv4-mapped IPv6 answer is treated as the IPv4 address (both are blocked the same way;
/// this only makes the message clearer).
fn canonical_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    }
}

fn normalise_entry(entry: &str) -> String {
    let e = entry.trim().to_ascii_lowercase();
    let e = e.trim_end_matches('.');
    match e.strip_prefix('[').and_then(|r| r.strip_suffix(']')) {
        Some(inner) => inner.to_string(),
        None => e.to_string(),
    }
}

/// A response fetched through the guard.
#[derive(Debug, Clone)]
pub struct Fetched {
    /// The URL that answered (after redirects).
    pub final_url: Url,
    pub status: u16,
    pub content_type: Option<String>,
    /// `Content-Encoding`, when the server sent one. The request asks for `identity` and the
    /// body is not decoded: a compressed body arrives as it was sent.
    pub content_encoding: Option<String>,
    /// At most `max_bytes` of the body.
    pub body: Vec<u8>,
    /// The body was longer than `max_bytes` and was cut.
    pub truncated: bool,
}

/// A resolver that answers every name with the addresses the guard validated, so reqwest never
/// performs a lookup of its own (no DNS rebinding between check and connect).
struct Pinned(Vec<SocketAddr>);

impl Resolve for Pinned {
    fn resolve(&self, _name: Name) -> Resolving {
        let addrs: Addrs = Box::new(self.0.clone().into_iter());
        Box::pin(async move { Ok(addrs) })
    }
}

/// GET `url` through `guard`: validated addresses only, redirects re-checked (at most
/// [`MAX_REDIRECTS`]), no proxy, the body cut at `max_bytes`, everything within `timeout`.
pub async fn fetch(
    guard: &Guard,
    url: &Url,
    max_bytes: usize,
    timeout: Duration,
) -> Result<Fetched, SsrfError> {
    let started = Instant::now();
    match tokio::time::timeout(
        timeout,
        fetch_inner(guard, url, max_bytes, started, timeout),
    )
    .await
    {
        Ok(result) => result,
        Err(_) => Err(SsrfError::Timeout(timeout)),
    }
}

async fn fetch_inner(
    guard: &Guard,
    url: &Url,
    max_bytes: usize,
    started: Instant,
    timeout: Duration,
) -> Result<Fetched, SsrfError> {
    let mut current = url.clone();
    for _hop in 0..=MAX_REDIRECTS {
        let addrs = guard.resolve(&current).await?;
        let host = current.host_str().unwrap_or_default().to_string();
        let remaining = timeout
            .saturating_sub(started.elapsed())
            .max(Duration::from_millis(1));
        let http_err = |e: reqwest::Error| SsrfError::Http {
            host: host.clone(),
            reason: describe(&e),
        };
        let client = crate::net::tls::client_builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(remaining)
            .user_agent(concat!("agentd/", env!("CARGO_PKG_VERSION")))
            .resolve_to_addrs(&host, &addrs)
            .dns_resolver(Arc::new(Pinned(addrs.clone())))
            .build()
            .map_err(http_err)?;
        let response = client
            .get(current.clone())
            .header(ACCEPT_ENCODING, "identity")
            .send()
            .await
            .map_err(http_err)?;
        let status = response.status();
        if status.is_redirection() && status != reqwest::StatusCode::NOT_MODIFIED {
            let location = response
                .headers()
                .get(LOCATION)
                .and_then(|v| v.to_str().ok())
                .ok_or_else(|| SsrfError::BadRedirect(host.clone()))?;
            current = current
                .join(location)
                .map_err(|_| SsrfError::BadRedirect(host.clone()))?;
            continue;
        }
        let content_type = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let content_encoding = response
            .headers()
            .get(CONTENT_ENCODING)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let mut body = Vec::new();
        let mut truncated = false;
        let mut stream = response.bytes_stream();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(http_err)?;
            let room = max_bytes - body.len();
            if chunk.len() > room {
                body.extend_from_slice(&chunk[..room]);
                truncated = true;
                break;
            }
            body.extend_from_slice(&chunk);
        }
        return Ok(Fetched {
            final_url: current,
            status: status.as_u16(),
            content_type,
            content_encoding,
            body,
            truncated,
        });
    }
    Err(SsrfError::TooManyRedirects(
        current.host_str().unwrap_or_default().to_string(),
    ))
}

/// reqwest's error text without the URL (which may carry a query the model chose).
fn describe(e: &reqwest::Error) -> String {
    let kind = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "connection failed"
    } else if e.is_body() || e.is_decode() {
        "reading the body failed"
    } else {
        "request failed"
    };
    let mut detail = String::new();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        detail = s.to_string();
        source = s.source();
    }
    if detail.is_empty() {
        kind.to_string()
    } else {
        format!("{kind}: {detail}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn blocked(s: &str) -> bool {
        is_blocked(s.parse().unwrap())
    }

    #[test]
    fn v4_ranges() {
        for ip in [
            "0.0.0.0",
            "0.1.2.3",
            "127.0.0.1",
            "127.255.255.254",
            "10.0.0.1",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "100.64.0.1",
            "100.127.255.255",
            "169.254.169.254",
            "169.254.1.1",
            "192.0.0.170",
            "192.0.2.1",
            "198.51.100.7",
            "203.0.113.9",
            "198.18.0.1",
            "198.19.255.255",
            "224.0.0.1",
            "239.255.255.250",
            "240.0.0.1",
            "255.255.255.255",
        ] {
            assert!(blocked(ip), "{ip} should be blocked");
        }
        for ip in [
            "1.1.1.1",
            "8.8.8.8",
            "172.15.255.255",
            "172.32.0.1",
            "100.63.255.255",
            "100.128.0.1",
            "198.17.0.1",
            "198.20.0.1",
            "93.184.216.34",
        ] {
            assert!(!blocked(ip), "{ip} should be public");
        }
    }

    #[test]
    fn v6_ranges() {
        for ip in [
            "::",
            "::1",
            "::ffff:127.0.0.1",
            "::ffff:7f00:1",
            "::ffff:8.8.8.8",
            "::127.0.0.1",
            "::10.0.0.1",
            "64:ff9b::127.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "64:ff9b:1::1",
            "2002:7f00:1::",
            "2002:a9fe:a9fe::1",
            "2001::1",
            "2001:db8::1",
            "fc00::1",
            "fd00:ec2::254",
            "fe80::1",
            "febf::1",
            "fec0::1",
            "ff02::1",
            "100::1",
        ] {
            assert!(blocked(ip), "{ip} should be blocked");
        }
        for ip in [
            "2606:4700:4700::1111",
            "2001:4860:4860::8888",
            "64:ff9b::808:808",
            "2002:808:808::1",
        ] {
            assert!(!blocked(ip), "{ip} should be public");
        }
    }

    fn url(s: &str) -> Url {
        Url::parse(s).unwrap()
    }

    #[test]
    fn the_parser_normalises_numeric_hosts() {
        for s in [
            "http://2130706433/",
            "http://0x7f.1/",
            "http://0x7f000001/",
            "http://017700000001/",
            "http://0177.0.0.1/",
            "http://127.1/",
        ] {
            assert_eq!(url(s).host_str(), Some("127.0.0.1"), "{s}");
        }
    }

    #[tokio::test]
    async fn prechecks_refuse_without_dns() {
        let g = Guard::default();
        for s in [
            "http://2130706433/",
            "http://0x7f.1/",
            "http://[::1]/",
            "http://[::ffff:127.0.0.1]/",
            "http://[0:0:0:0:0:ffff:7f00:1]/",
            "http://0.0.0.0/",
            "http://169.254.169.254/latest/meta-data/",
            "http://[fe80::1]/",
            "http://10.0.0.1/",
            "http://evil.com@127.0.0.1/",
            "http://localhost/",
            "http://localhost./",
            "http://LOCALHOST/",
            "http://foo.localhost/",
            "http://metadata.google.internal/",
        ] {
            let err = g.resolve(&url(s)).await.unwrap_err();
            assert!(
                matches!(err, SsrfError::Blocked { .. } | SsrfError::LocalName(_)),
                "{s}: {err:?}"
            );
        }
        for s in [
            "file:///etc/passwd",
            "gopher://127.0.0.1/",
            "ftp://example.com/",
            "data:text/plain,hi",
        ] {
            assert!(
                matches!(g.resolve(&url(s)).await, Err(SsrfError::Scheme(_))),
                "{s}"
            );
        }
        assert!(matches!(
            g.resolve(&url("http://user:pw@93.184.216.34/")).await,
            Err(SsrfError::Userinfo)
        ));
        assert!(Url::parse("http://[fe80::1%25eth0]/").is_err());
    }

    #[tokio::test]
    async fn allow_hosts_exempts_by_host_or_host_port() {
        let g = Guard::new(vec![
            "127.0.0.1:8080".into(),
            "[::1]".into(),
            "Localhost.".into(),
        ]);
        assert_eq!(
            g.resolve(&url("http://127.0.0.1:8080/")).await.unwrap(),
            vec!["127.0.0.1:8080".parse().unwrap()]
        );
        assert!(g.resolve(&url("http://127.0.0.1:8081/")).await.is_err());
        assert!(g.resolve(&url("http://[::1]:9/")).await.is_ok());
        // An allowed name is still resolved, and every answer is returned.
        let addrs = g.resolve(&url("http://localhost:7/")).await.unwrap();
        assert!(addrs.iter().all(|a| a.ip().is_loopback() && a.port() == 7));
    }

    #[tokio::test]
    async fn a_name_resolving_to_loopback_is_blocked() {
        // `localhost` is refused by name; an unlisted numeric name is parsed as an address.
        let g = Guard::new(vec!["other".into()]);
        let err = g.resolve(&url("http://127.0.0.1.:80/")).await.unwrap_err();
        assert!(matches!(err, SsrfError::Blocked { .. }), "{err:?}");
    }

    #[test]
    fn mixed_public_and_private_answers_are_refused() {
        let public: SocketAddr = "93.184.216.34:80".parse().unwrap();
        let private: SocketAddr = "10.0.0.5:80".parse().unwrap();
        let mapped: SocketAddr = "[::ffff:169.254.169.254]:80".parse().unwrap();
        assert_eq!(
            validate_answers("h".into(), vec![public], false).unwrap(),
            vec![public]
        );
        for bad in [vec![public, private], vec![mapped, public], vec![]] {
            assert!(validate_answers("h".into(), bad, false).is_err());
        }
        let err = validate_answers("h".into(), vec![mapped], false).unwrap_err();
        assert!(err.to_string().contains("169.254.169.254"), "{err}");
        assert!(validate_answers("h".into(), vec![public, private], true).is_ok());
    }

    proptest! {
        #[test]
        fn mapped_and_compat_follow_v4(a: u8, b: u8, c: u8, d: u8) {
            let v4 = Ipv4Addr::new(a, b, c, d);
            let v4_blocked = is_blocked(IpAddr::V4(v4));
            let nat64 = Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0,
                u16::from_be_bytes([a, b]), u16::from_be_bytes([c, d]));
            let six_to_four = Ipv6Addr::new(0x2002, u16::from_be_bytes([a, b]),
                u16::from_be_bytes([c, d]), 0, 0, 0, 0, 1);
            prop_assert_eq!(is_blocked(IpAddr::V6(nat64)), v4_blocked);
            prop_assert_eq!(is_blocked(IpAddr::V6(six_to_four)), v4_blocked);
            prop_assert!(is_blocked(IpAddr::V6(v4.to_ipv6_mapped())));
        }

        #[test]
        fn url_parsing_never_panics_and_blocked_hosts_stay_blocked(s in "\\PC{0,40}") {
            if let Ok(u) = Url::parse(&format!("http://{s}/")) {
                let g = Guard::default();
                if let Ok((Host::Ip(ip), _, _)) = g.precheck(&u) {
                    prop_assert!(!is_blocked(ip));
                }
            }
        }
    }
}
