//! Failed authentications per client address: a client that sent a wrong token too often is
//! refused for the rest of the minute, before its credentials are even read.
//!
//! `api.auth_failures_per_minute` (default [`DEFAULT_AUTH_FAILURES_PER_MINUTE`], 0 = off): after
//! that many wrong tokens — a wrong `Authorization: Bearer` token on `/api/*` or `/mcp`, a wrong
//! token at `POST /console/login` — from one address within a minute, every request from it that
//! needs a token is answered `429 Too Many Requests` with `Retry-After` until the minute that began
//! with its first failure is over, right token or not (else the limit would only slow a guesser
//! down, not stop it from being told it guessed right). A missing token is not a guess and is not
//! counted.
//!
//! The address is the TCP peer's, never `X-Forwarded-For` (anyone can write that header): behind a
//! reverse proxy every client shares the proxy's address, so one guesser locks every operator out
//! for a minute — set the limit with that in mind, or to 0 and limit at the proxy.
//!
//! # Invariants
//! * Bounded memory: at most [`MAX_TRACKED`] addresses are kept; when full, windows that ended are
//!   dropped first, then (a flood of distinct addresses) the table is cleared — forgetting failures
//!   never refuses anyone wrongly, it only gives a guesser a fresh minute.
//! * One `parking_lot` mutex, never held across an await.
//!
//! Hand-written rather than `governor`: the rule counts failures, not requests, and refuses the
//! successful request of a client over the limit too; a keyed rate limiter would need its own
//! bookkeeping of the same size around it.

use parking_lot::Mutex;
use std::{
    collections::HashMap,
    net::IpAddr,
    time::{Duration, Instant},
};

/// The default of `api.auth_failures_per_minute`.
pub const DEFAULT_AUTH_FAILURES_PER_MINUTE: u32 = 10;
/// How many addresses are tracked at most.
pub const MAX_TRACKED: usize = 16_384;
/// The window failures are counted in.
const WINDOW: Duration = Duration::from_secs(60);

/// Failed authentications by client address (see the module docs).
#[derive(Debug)]
pub struct AuthFailures {
    /// Failures allowed per window (0: no limit).
    limit: u32,
    by_addr: Mutex<HashMap<IpAddr, Window>>,
}

#[derive(Debug, Clone, Copy)]
struct Window {
    started: Instant,
    failures: u32,
}

impl AuthFailures {
    /// A limiter allowing `limit` failures a minute per address (0: no limit).
    pub fn new(limit: u32) -> Self {
        AuthFailures {
            limit,
            by_addr: Mutex::default(),
        }
    }

    /// Whether `addr` may try a token now.
    ///
    /// # Errors
    /// The seconds until it may (at least 1), when it failed `limit` times in the current window.
    pub fn check(&self, addr: IpAddr) -> Result<(), u64> {
        self.check_at(addr, Instant::now())
    }

    /// Counts a wrong token from `addr`.
    pub fn failed(&self, addr: IpAddr) {
        self.failed_at(addr, Instant::now());
    }

    fn check_at(&self, addr: IpAddr, now: Instant) -> Result<(), u64> {
        if self.limit == 0 {
            return Ok(());
        }
        let by_addr = self.by_addr.lock();
        let Some(window) = by_addr.get(&addr) else {
            return Ok(());
        };
        let elapsed = now.saturating_duration_since(window.started);
        if window.failures < self.limit || elapsed >= WINDOW {
            return Ok(());
        }
        let left = WINDOW - elapsed;
        Err(left.as_secs() + u64::from(left.subsec_nanos() > 0))
    }

    fn failed_at(&self, addr: IpAddr, now: Instant) {
        if self.limit == 0 {
            return;
        }
        let mut by_addr = self.by_addr.lock();
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
        if now.saturating_duration_since(window.started) >= WINDOW {
            *window = Window {
                started: now,
                failures: 0,
            };
        }
        window.failures = window.failures.saturating_add(1);
    }

    /// Addresses tracked now (for tests and `/metrics`).
    pub fn tracked(&self) -> usize {
        self.by_addr.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    #[test]
    fn the_limit_refuses_an_address_for_the_rest_of_its_minute_and_no_other() {
        let limiter = AuthFailures::new(3);
        let t0 = Instant::now();
        for i in 0..3 {
            assert_eq!(limiter.check_at(ip(1), t0), Ok(()), "failure {i} allowed");
            limiter.failed_at(ip(1), t0 + Duration::from_secs(i));
        }
        assert_eq!(
            limiter.check_at(ip(1), t0 + Duration::from_millis(20_500)),
            Err(40),
            "refused until the minute that began with the first failure is over"
        );
        assert_eq!(limiter.check_at(ip(2), t0), Ok(()), "another address");
        assert_eq!(limiter.check_at(ip(1), t0 + WINDOW), Ok(()), "a new minute");
        // A failure in the new minute starts a new count.
        limiter.failed_at(ip(1), t0 + WINDOW);
        assert_eq!(limiter.check_at(ip(1), t0 + WINDOW), Ok(()));
    }

    #[test]
    fn zero_is_no_limit() {
        let limiter = AuthFailures::new(0);
        for _ in 0..100 {
            limiter.failed(ip(1));
        }
        assert_eq!(limiter.check(ip(1)), Ok(()));
        assert_eq!(limiter.tracked(), 0);
    }

    #[test]
    fn a_flood_of_addresses_stays_bounded() {
        let addr = |n: u32| IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + n));
        let fill = |limiter: &AuthFailures, at: Instant| {
            for n in 0..MAX_TRACKED as u32 {
                limiter.failed_at(addr(n), at);
            }
            assert_eq!(limiter.tracked(), MAX_TRACKED);
        };
        let t0 = Instant::now();
        // Full, a minute later: the windows that ended are dropped first.
        let limiter = AuthFailures::new(1);
        fill(&limiter, t0);
        limiter.failed_at(addr(MAX_TRACKED as u32), t0 + WINDOW);
        assert_eq!(limiter.tracked(), 1);
        // Full of live windows: cleared rather than grown.
        let limiter = AuthFailures::new(1);
        fill(&limiter, t0);
        limiter.failed_at(addr(MAX_TRACKED as u32), t0);
        assert_eq!(limiter.tracked(), 1);
        assert!(limiter.check_at(addr(MAX_TRACKED as u32), t0).is_err());
        assert!(limiter.check_at(addr(0), t0).is_ok(), "forgotten");
    }
}
