//! Wrong tokens, per client address and in all: a client that sent a wrong token too often has its
//! further wrong tokens answered `429` instead of `401` for the rest of the minute; a right token is
//! never refused for a rate.
//!
//! `api.auth_failures_per_minute` (default [`DEFAULT_AUTH_FAILURES_PER_MINUTE`], 0 = off): after
//! that many wrong tokens — a wrong `Authorization: Bearer` token on `/api/*` or `/mcp`, a wrong
//! token at `POST /console/login` — from one address within a minute, or [`GLOBAL_FACTOR`] times
//! that many from all addresses together (a guesser that binds 127.0.0.2, .3, … shares one
//! limit), every further wrong token is answered `429 Too Many Requests` with `Retry-After` until
//! the minute that began with the first failure is over. A missing token is not a guess and is not
//! counted.
//!
//! The right token is checked first (in constant time) and never reaches the limiter: others'
//! failures cannot lock the admin out, and `POST /api/halt` is never refused for a rate. The price:
//! past the limit a guesser is still told when a guess is right (a `200` among the `429`s) — to
//! stop that, the limiter would have to refuse the right token too, which is exactly the lockout
//! anyone could cause. Tokens must therefore be long random strings (`openssl rand -hex 32`); the
//! limiter tells a polite client to stop, and makes a guesser loud (a warning per refused burst).
//!
//! The address is the TCP peer's, never `X-Forwarded-For` (anyone can write that header): behind a
//! reverse proxy every client shares the proxy's address — which now costs nobody with the right
//! token anything.
//!
//! # Invariants
//! * Bounded memory: at most [`MAX_TRACKED`] addresses are kept; when full, windows that ended are
//!   dropped first, then (a flood of distinct addresses) the table is cleared — the global window
//!   still counts those failures.
//! * One `parking_lot` mutex, never held across an await.
//!
//! Hand-written rather than `governor`: the rule counts failures, not requests; a keyed rate
//! limiter would need its own bookkeeping of the same size around it.

use parking_lot::Mutex;
use std::{
    collections::HashMap,
    net::IpAddr,
    time::{Duration, Instant},
};

pub use crate::team::api::DEFAULT_AUTH_FAILURES_PER_MINUTE;
/// All addresses together may send this many times the per-address limit of wrong tokens a
/// minute before every further wrong token is answered `429`.
pub const GLOBAL_FACTOR: u32 = 10;
/// How many addresses are tracked at most.
pub const MAX_TRACKED: usize = 16_384;
/// The window failures are counted in.
const WINDOW: Duration = Duration::from_secs(60);

/// Wrong tokens by client address and in all (see the module docs).
#[derive(Debug)]
pub struct AuthFailures {
    /// Failures allowed per address and window (0: no limit).
    limit: u32,
    table: Mutex<Table>,
}

#[derive(Debug, Default)]
struct Table {
    by_addr: HashMap<IpAddr, Window>,
    all: Option<Window>,
}

#[derive(Debug, Clone, Copy)]
struct Window {
    started: Instant,
    failures: u32,
}

impl Window {
    /// Counts one failure at `now` in this window, or in a new one when it ended.
    fn count(&mut self, now: Instant) {
        if now.saturating_duration_since(self.started) >= WINDOW {
            *self = Window {
                started: now,
                failures: 0,
            };
        }
        self.failures = self.failures.saturating_add(1);
    }

    /// The whole seconds (at least 1) until this window ends, when it holds more than `limit`,
    /// and whether the failure just counted is the first over it.
    fn over(&self, limit: u32, now: Instant) -> Option<(u64, bool)> {
        let elapsed = now.saturating_duration_since(self.started);
        if self.failures <= limit || elapsed >= WINDOW {
            return None;
        }
        let left = WINDOW - elapsed;
        let seconds = (left.as_secs() + u64::from(left.subsec_nanos() > 0)).max(1);
        Some((seconds, self.failures == limit.saturating_add(1)))
    }
}

/// A wrong token refused for the rate: `429` rather than `401`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refused {
    /// Seconds until wrong tokens are answered `401` again (`Retry-After`).
    pub seconds: u64,
    /// Whether the global limit (all addresses together) was passed rather than this address's.
    pub everyone: bool,
    /// Whether this is the first wrong token refused in its window (to log once per burst).
    pub first: bool,
}

impl AuthFailures {
    /// A limiter allowing `limit` wrong tokens a minute per address, and [`GLOBAL_FACTOR`] times
    /// that from all addresses together (0: no limit).
    pub fn new(limit: u32) -> Self {
        AuthFailures {
            limit,
            table: Mutex::default(),
        }
    }

    /// Counts a wrong token from `addr` (`None`: a peer whose address is unknown, counted in the
    /// global window only), and whether it is to be refused for the rate: `Some` past this
    /// address's limit or the global one. Called only after the token was found wrong: a right
    /// token never comes here.
    pub fn failed(&self, addr: Option<IpAddr>) -> Option<Refused> {
        self.failed_at(addr, Instant::now())
    }

    fn failed_at(&self, addr: Option<IpAddr>, now: Instant) -> Option<Refused> {
        if self.limit == 0 {
            return None;
        }
        let mut table = self.table.lock();
        let mine = addr.and_then(|addr| {
            let by_addr = &mut table.by_addr;
            if by_addr.len() >= MAX_TRACKED && !by_addr.contains_key(&addr) {
                by_addr.retain(|_, w| now.saturating_duration_since(w.started) < WINDOW);
                if by_addr.len() >= MAX_TRACKED {
                    by_addr.clear();
                }
            }
            let window = by_addr.entry(addr).or_insert(Window {
                started: now,
                failures: 0,
            });
            window.count(now);
            window.over(self.limit, now)
        });
        let all = table.all.get_or_insert(Window {
            started: now,
            failures: 0,
        });
        all.count(now);
        let everyone = all.over(self.limit.saturating_mul(GLOBAL_FACTOR), now);
        match (mine, everyone) {
            (None, None) => None,
            (Some((seconds, first)), None) => Some(Refused {
                seconds,
                everyone: false,
                first,
            }),
            (mine, Some((seconds, first))) => Some(Refused {
                seconds: seconds.max(mine.map_or(0, |(s, _)| s)),
                everyone: true,
                first,
            }),
        }
    }

    /// Addresses tracked now (for tests and `/metrics`).
    pub fn tracked(&self) -> usize {
        self.table.lock().by_addr.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> Option<IpAddr> {
        Some(IpAddr::from([10, 0, 0, last]))
    }

    #[test]
    fn past_the_limit_an_addresss_wrong_tokens_are_refused_for_the_rest_of_its_minute() {
        let limiter = AuthFailures::new(3);
        let t0 = Instant::now();
        for i in 0..3 {
            assert_eq!(
                limiter.failed_at(ip(1), t0 + Duration::from_secs(i)),
                None,
                "failure {i} answered 401"
            );
        }
        assert_eq!(
            limiter.failed_at(ip(1), t0 + Duration::from_millis(20_500)),
            Some(Refused {
                seconds: 40,
                everyone: false,
                first: true
            }),
            "refused until the minute that began with the first failure is over"
        );
        assert_eq!(limiter.failed_at(ip(2), t0), None, "another address");
        // A failure in a new minute starts a new count.
        assert_eq!(limiter.failed_at(ip(1), t0 + WINDOW), None, "a new minute");
    }

    #[test]
    fn many_addresses_share_one_global_limit() {
        let limiter = AuthFailures::new(2);
        let t0 = Instant::now();
        let global = 2 * GLOBAL_FACTOR;
        // One wrong token from each of `global` addresses: none is over its own limit.
        for n in 0..global {
            let addr = Some(IpAddr::from([127, 0, 0, 2 + n as u8]));
            assert_eq!(limiter.failed_at(addr, t0), None, "guess {n}");
        }
        let next = limiter.failed_at(Some(IpAddr::from([127, 0, 1, 1])), t0 + WINDOW / 2);
        assert_eq!(
            next,
            Some(Refused {
                seconds: 30,
                everyone: true,
                first: true
            })
        );
        // A peer with no known address counts too.
        assert!(limiter.failed_at(None, t0).is_some_and(|r| r.everyone));
        assert_eq!(limiter.failed_at(ip(9), t0 + WINDOW), None, "a new minute");
    }

    #[test]
    fn zero_is_no_limit() {
        let limiter = AuthFailures::new(0);
        for _ in 0..100 {
            assert_eq!(limiter.failed(ip(1)), None);
        }
        assert_eq!(limiter.tracked(), 0);
    }

    #[test]
    fn a_flood_of_addresses_stays_bounded() {
        let addr = |n: u32| Some(IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + n)));
        let fill = |limiter: &AuthFailures, at: Instant| {
            for n in 0..MAX_TRACKED as u32 {
                limiter.failed_at(addr(n), at);
            }
            assert_eq!(limiter.tracked(), MAX_TRACKED);
        };
        let t0 = Instant::now();
        // Full, a minute later: the windows that ended are dropped first.
        let limiter = AuthFailures::new(u32::MAX / GLOBAL_FACTOR);
        fill(&limiter, t0);
        limiter.failed_at(addr(MAX_TRACKED as u32), t0 + WINDOW);
        assert_eq!(limiter.tracked(), 1);
        // Full of live windows: cleared rather than grown.
        let limiter = AuthFailures::new(u32::MAX / GLOBAL_FACTOR);
        fill(&limiter, t0);
        limiter.failed_at(addr(MAX_TRACKED as u32), t0);
        assert_eq!(limiter.tracked(), 1);
    }
}
