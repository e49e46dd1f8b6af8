//! Per-IP fixed-window rate limits in two groups (SPEC §3 `[http]`): POSTs use `rate_limit`,
//! the read-only GETs `status_rate_limit`, both per `rate_window_seconds`.
//!
//! The window map is bounded: expired windows are swept once per window, and when
//! [`MAX_CLIENTS`] are tracked at once the oldest window is evicted (that client gets a fresh
//! window early — memory stays bounded under a flood of addresses, at the price of leniency).
//! IPv6 clients are keyed by their /64, the unit one host usually controls.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, Request, State};
use axum::http::header::RETRY_AFTER;
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::reply::Reply;
use super::server::ApiState;

/// How many client windows one limiter tracks at most.
pub(crate) const MAX_CLIENTS: usize = 10_000;

/// Which limit a route counts against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Group {
    /// POST endpoints: `[http] rate_limit`.
    Post,
    /// Read-only GETs: `[http] status_rate_limit`.
    Read,
}

impl Group {
    fn config_key(self) -> &'static str {
        match self {
            Group::Post => "rate_limit",
            Group::Read => "status_rate_limit",
        }
    }
}

/// One client's current window.
#[derive(Debug, Clone, Copy)]
struct Slot {
    start: Instant,
    count: u32,
}

#[derive(Debug)]
struct Windows {
    slots: HashMap<IpAddr, Slot>,
    last_sweep: Instant,
}

/// A bounded per-IP fixed-window counter.
#[derive(Debug)]
pub(crate) struct RateLimiter {
    limit: u32,
    window: Duration,
    max_clients: usize,
    windows: Mutex<Windows>,
}

impl RateLimiter {
    /// At most `limit` requests per `window` per client (a zero limit is treated as 1).
    pub(crate) fn new(limit: u32, window: Duration) -> RateLimiter {
        RateLimiter::with_capacity(limit, window, MAX_CLIENTS)
    }

    fn with_capacity(limit: u32, window: Duration, max_clients: usize) -> RateLimiter {
        RateLimiter {
            limit: limit.max(1),
            window: window.max(Duration::from_millis(1)),
            max_clients: max_clients.max(1),
            windows: Mutex::new(Windows {
                slots: HashMap::new(),
                last_sweep: Instant::now(),
            }),
        }
    }

    /// Counts one request of `ip` at `now`; `Err(retry_after)` when over the limit.
    pub(crate) fn check(&self, ip: IpAddr, now: Instant) -> Result<(), Duration> {
        let key = client_key(ip);
        let window = self.window;
        let expired = |slot: &Slot| now.saturating_duration_since(slot.start) >= window;
        let mut w = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        if now.saturating_duration_since(w.last_sweep) >= window {
            w.slots.retain(|_, s| !expired(s));
            w.last_sweep = now;
        }
        if let Some(slot) = w.slots.get_mut(&key) {
            if expired(slot) {
                *slot = Slot {
                    start: now,
                    count: 0,
                };
            }
            if slot.count >= self.limit {
                return Err((slot.start + window).saturating_duration_since(now));
            }
            slot.count += 1;
            return Ok(());
        }
        if w.slots.len() >= self.max_clients {
            w.slots.retain(|_, s| !expired(s));
        }
        if w.slots.len() >= self.max_clients {
            let oldest = w.slots.iter().min_by_key(|(_, s)| s.start).map(|(k, _)| *k);
            if let Some(oldest) = oldest {
                w.slots.remove(&oldest);
            }
        }
        w.slots.insert(
            key,
            Slot {
                start: now,
                count: 1,
            },
        );
        Ok(())
    }

    #[cfg(test)]
    fn tracked(&self) -> usize {
        self.windows
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .slots
            .len()
    }
}

/// The map key of a client: IPv4 as is (also when IPv4-mapped), IPv6 by its /64.
fn client_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(Ipv6Addr::from_bits(v6.to_bits() & !((1u128 << 64) - 1))),
        },
    }
}

/// Whole seconds for `Retry-After`, rounded up, at least 1.
fn retry_after_seconds(wait: Duration) -> u64 {
    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    secs.max(1)
}

/// Route layer: counts the request against `group`'s limit for the peer address.
pub(crate) async fn rate_limit(
    State((state, group)): State<(Arc<ApiState>, Group)>,
    req: Request,
    next: Next,
) -> Response {
    let ip = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip())
        .unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
    let limiter = state.limiter(group);
    match limiter.check(ip, Instant::now()) {
        Ok(()) => next.run(req).await,
        Err(wait) => {
            let secs = retry_after_seconds(wait);
            tracing::debug!(%ip, group = group.config_key(), "HTTP API rate limit hit");
            Reply::error(
                StatusCode::TOO_MANY_REQUESTS,
                format!(
                    "rate limit exceeded: at most {} requests per {} s ([http] {}); retry after {secs} s",
                    limiter.limit,
                    limiter.window.as_secs().max(1),
                    group.config_key()
                ),
            )
            .with_header(RETRY_AFTER, HeaderValue::from(secs))
            .into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn allows_the_limit_then_refuses_until_the_window_ends() {
        let l = RateLimiter::new(3, Duration::from_secs(10));
        let t0 = Instant::now();
        for _ in 0..3 {
            assert!(l.check(ip("10.0.0.1"), t0).is_ok());
        }
        let wait = l
            .check(ip("10.0.0.1"), t0 + Duration::from_secs(4))
            .unwrap_err();
        assert_eq!(wait, Duration::from_secs(6));
        // Another client has its own window.
        assert!(l.check(ip("10.0.0.2"), t0).is_ok());
        // A new window starts after the old one ends.
        assert!(
            l.check(ip("10.0.0.1"), t0 + Duration::from_secs(10))
                .is_ok()
        );
    }

    #[test]
    fn ipv6_clients_share_their_slash_64() {
        let l = RateLimiter::new(1, Duration::from_secs(10));
        let t0 = Instant::now();
        assert!(l.check(ip("2001:db8:1:2::1"), t0).is_ok());
        assert!(l.check(ip("2001:db8:1:2:ffff::9"), t0).is_err());
        assert!(l.check(ip("2001:db8:1:3::1"), t0).is_ok());
        assert_eq!(client_key(ip("::ffff:10.1.2.3")), ip("10.1.2.3"));
    }

    #[test]
    fn the_map_stays_bounded_under_many_addresses() {
        let l = RateLimiter::with_capacity(1, Duration::from_secs(60), 100);
        let t0 = Instant::now();
        for i in 0..1000u32 {
            let addr = IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i));
            assert!(
                l.check(addr, t0 + Duration::from_millis(u64::from(i)))
                    .is_ok()
            );
            assert!(l.tracked() <= 100);
        }
    }

    #[test]
    fn expired_windows_are_swept() {
        let l = RateLimiter::new(1, Duration::from_secs(1));
        let t0 = Instant::now();
        for i in 0..50u32 {
            l.check(IpAddr::V4(Ipv4Addr::from(i)), t0).unwrap();
        }
        assert_eq!(l.tracked(), 50);
        l.check(ip("10.9.9.9"), t0 + Duration::from_secs(5))
            .unwrap();
        assert_eq!(l.tracked(), 1);
    }

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        assert_eq!(retry_after_seconds(Duration::from_millis(1)), 1);
        assert_eq!(retry_after_seconds(Duration::from_millis(1500)), 2);
        assert_eq!(retry_after_seconds(Duration::from_secs(6)), 6);
        assert_eq!(retry_after_seconds(Duration::ZERO), 1);
    }
}
