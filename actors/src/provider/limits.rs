//! Limits shared by every agent of one provider: a concurrency cap, a requests-per-minute and a
//! tokens-per-minute limiter, and a pause the server asks for (`Retry-After`, `x-ratelimit-*`).
//!
//! One [`ProviderLimiter`] per provider, in an `Arc` that every agent's provider holds: a team file
//! builds one per `[providers.NAME]` (whatever the limits, so a `Retry-After` pauses the whole
//! team even without caps); the library attaches one with [`OpenAiCompatible::with_limiter`](crate::OpenAiCompatible::with_limiter) (which
//! also reads the server's headers) or wraps any other provider in a [`Limited`].
//!
//! # What a call goes through
//! 1. **The cap.** [`ProviderLimiter::start`] takes a permit of a tokio [`Semaphore`] (FIFO) when
//!    `max_concurrency > 0`; the returned [`CallPermit`] holds it for the whole call: retries and
//!    their waits, a streamed body until its last byte. Dropping the permit (the call ended, or was
//!    dropped by a halt) returns it.
//! 2. **The pause.** Then it waits while the provider is paused (see below).
//! 3. **The rates.** Then it reserves one request and the call's estimated tokens (the prompt by
//!    [`estimate_tokens`] plus `max_tokens` when one is sent) and sleeps until the reservation is
//!    due. If a pause began meanwhile, it gives the reservation back and starts over after the
//!    pause (so the calls queued through a pause are spaced again, not all let go at its end).
//!    Each retry of the call ([`CallPermit::retry`]) reserves one more request (not more tokens)
//!    the same way. When the reply comes, [`CallPermit::settle`] corrects the token estimate by
//!    the usage the server reported; a failed call keeps its estimate.
//!
//! # The pause
//! [`ProviderLimiter::pause`] moves a shared "paused until" instant later (never earlier). The
//! OpenAI-compatible provider calls it for a `Retry-After` on a 429 or 503 (seconds or an HTTP
//! date) and for `x-ratelimit-remaining-requests: 0` / `x-ratelimit-remaining-tokens: 0` with
//! their `x-ratelimit-reset-*` (OpenAI's durations, `1s`, `6m0s`, `20ms`, `1h2m3.5s`: see
//! [`parse_reset`]), each capped by the provider's `retry_after_cap`. Every agent of the provider
//! waits for that instant before its next request, retries included, so one 429 slows the whole
//! team once instead of each agent retrying on its own. A pause that starts (none was running) is
//! logged at `warn` and counted; one that extends a running pause only adds to the time paused.
//!
//! # Rates
//! Both limiters are token buckets on tokio's clock (so they follow a paused test clock), refilled
//! at `limit / 60` per second. The requests bucket holds one request: requests start at least
//! `60 / requests_per_minute` seconds apart, so any 60-second window holds at most
//! `requests_per_minute` starts. The tokens bucket holds one second's worth
//! (`tokens_per_minute / 60`, at least 1); a call waits until the bucket holds its tokens (or is
//! full, for a call larger than the bucket) and then takes them, going into debt when the call is
//! larger, which the following calls wait out. Reservations are taken in arrival order, so a busy
//! provider is served first come, first served.
//!
//! Why by hand rather than `governor`: the tokens limiter needs debt and refunds (a reply's usage
//! corrects the estimate after the fact, and a call larger than the bucket must still pass once),
//! which `governor`'s GCRA cells cannot express, and `governor` waits on its own timer rather than
//! tokio's clock. The cap is tokio's `Semaphore` as it is.
//!
//! # Invariants
//! - At most `max_concurrency` calls hold a [`CallPermit`] at once, streaming included.
//! - No request starts while the provider is paused (as of the last look, just before it
//!   starts), nor before its reservation is due; reservations are due `60 / requests_per_minute`
//!   seconds apart, so the starts are too, pauses or not.
//! - Every wait is cancel safe: dropping a waiting call returns its permit and its not yet due
//!   reservation, and it never sends anything. A halted agent's turn drops the call, so a call
//!   waiting at a halt never starts.
//!
//! # Lock order
//! One `parking_lot` mutex guards the buckets and the pause instant; it is never held across an
//! await or a call out (tracing aside) and never taken while the semaphore is awaited: the permit
//! is awaited first, the mutex taken afterwards for short reads and updates. Counters are atomics.

use super::{LlmRequest, LlmResponse, Provider, ProviderError};
use crate::context::estimate_tokens;
use futures::future::BoxFuture;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::{
    fmt,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Weak,
    },
    time::Duration,
};
use tokio::{
    sync::{OwnedSemaphorePermit, Semaphore},
    time::Instant,
};
use warden_protocols::Usage;

/// The limits of one provider; `0` means unlimited (the default for each).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProviderLimits {
    /// Calls in flight at once, streaming included; `0`: no cap.
    pub max_concurrency: u32,
    /// Requests started per minute (each retry is a request); `0`: no limit.
    pub requests_per_minute: u32,
    /// Tokens per minute (estimated before a call, corrected by its usage); `0`: no limit.
    pub tokens_per_minute: u64,
}

/// What a [`ProviderLimiter`] has seen, for `/metrics` and status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProviderLimitStats {
    /// The provider's name (the team file's `[providers.NAME]`).
    pub provider: String,
    /// The limits it enforces.
    pub limits: ProviderLimits,
    /// Calls holding a permit (admitted, not yet ended).
    pub in_flight: u64,
    /// Calls waiting to start: for a permit, the pause or their rate reservation.
    pub waiting: u64,
    /// Answers with status 429 seen.
    pub throttled: u64,
    /// Pauses started (a pause extended while running is not counted again).
    pub pauses: u64,
    /// Total time paused, in milliseconds (extensions included).
    pub paused_ms: u64,
}

/// A token bucket on tokio's clock; `level` may go negative (debt). See the module docs.
#[derive(Debug)]
struct Bucket {
    capacity: f64,
    per_sec: f64,
    level: f64,
    at: Instant,
}

impl Bucket {
    /// A full bucket for `per_minute`; `None` for 0 (unlimited).
    fn new(per_minute: u64, capacity: f64, now: Instant) -> Option<Bucket> {
        (per_minute > 0).then(|| Bucket {
            capacity,
            per_sec: per_minute as f64 / 60.0,
            level: capacity,
            at: now,
        })
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.level = (self.level + elapsed * self.per_sec).min(self.capacity);
        self.at = now;
    }

    /// Reserves `n` now and returns how long until the reservation is due.
    fn reserve(&mut self, n: f64, now: Instant) -> Duration {
        self.refill(now);
        let need = n.min(self.capacity);
        let wait = if self.level >= need {
            Duration::ZERO
        } else {
            Duration::try_from_secs_f64((need - self.level) / self.per_sec).unwrap_or(Duration::MAX)
        };
        self.level -= n;
        wait
    }

    /// Gives back `n` (a refund: negative `n` charges more), never above capacity.
    fn give_back(&mut self, n: f64, now: Instant) {
        self.refill(now);
        self.level = (self.level + n).min(self.capacity);
    }
}

#[derive(Debug)]
struct State {
    requests: Option<Bucket>,
    tokens: Option<Bucket>,
    paused_until: Option<Instant>,
}

/// The limits every agent of one provider shares: a concurrency cap, requests and tokens per
/// minute, and a pause a server asks for. Build it with [`ProviderLimiter::new`] and give the same
/// `Arc` to every agent's provider ([`OpenAiCompatible::with_limiter`](crate::OpenAiCompatible::with_limiter),
/// [`Limited`]).
///
/// A call takes a permit ([`ProviderLimiter::start`], held by the [`CallPermit`] until the call
/// ends), waits while the provider is paused, then reserves a request and its estimated tokens in
/// arrival order and waits until they are due. Requests are spaced `60 / requests_per_minute`
/// seconds apart; tokens refill at `tokens_per_minute / 60` a second into a bucket of one second's
/// worth, and may go into debt. Every wait is cancel safe. `docs/models.md` ("Shared provider
/// limits") has the whole story.
pub struct ProviderLimiter {
    name: String,
    limits: ProviderLimits,
    permits: Option<Arc<Semaphore>>,
    state: Mutex<State>,
    in_flight: AtomicU64,
    waiting: AtomicU64,
    throttled: AtomicU64,
    pauses: AtomicU64,
    paused_ms: AtomicU64,
}

impl fmt::Debug for ProviderLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProviderLimiter")
            .field("stats", &self.stats())
            .finish()
    }
}

/// Every live limiter of the process, for [`provider_limit_stats`].
static LIMITERS: Mutex<Vec<Weak<ProviderLimiter>>> = Mutex::new(Vec::new());

/// The figures of every [`ProviderLimiter`] alive in this process, in creation order.
pub fn provider_limit_stats() -> Vec<ProviderLimitStats> {
    let mut limiters = LIMITERS.lock();
    limiters.retain(|l| l.strong_count() > 0);
    limiters
        .iter()
        .filter_map(Weak::upgrade)
        .map(|l| l.stats())
        .collect()
}

impl ProviderLimiter {
    /// A limiter for provider `name` (used in logs and metrics). It runs on tokio's clock (a paused
    /// test clock included) and is listed by [`provider_limit_stats`] while it lives.
    pub fn new(name: impl Into<String>, limits: ProviderLimits) -> Arc<ProviderLimiter> {
        let now = Instant::now();
        let permits = (limits.max_concurrency > 0).then(|| {
            let n = usize::try_from(limits.max_concurrency).unwrap_or(Semaphore::MAX_PERMITS);
            Arc::new(Semaphore::new(n.min(Semaphore::MAX_PERMITS)))
        });
        let tokens_capacity = (limits.tokens_per_minute as f64 / 60.0).max(1.0);
        let limiter = Arc::new(ProviderLimiter {
            name: name.into(),
            limits,
            permits,
            state: Mutex::new(State {
                requests: Bucket::new(u64::from(limits.requests_per_minute), 1.0, now),
                tokens: Bucket::new(limits.tokens_per_minute, tokens_capacity, now),
                paused_until: None,
            }),
            in_flight: AtomicU64::new(0),
            waiting: AtomicU64::new(0),
            throttled: AtomicU64::new(0),
            pauses: AtomicU64::new(0),
            paused_ms: AtomicU64::new(0),
        });
        LIMITERS.lock().push(Arc::downgrade(&limiter));
        limiter
    }

    /// The provider's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The limits it enforces.
    pub fn limits(&self) -> ProviderLimits {
        self.limits
    }

    /// Its figures now.
    pub fn stats(&self) -> ProviderLimitStats {
        ProviderLimitStats {
            provider: self.name.clone(),
            limits: self.limits,
            in_flight: self.in_flight.load(Ordering::Relaxed),
            waiting: self.waiting.load(Ordering::Relaxed),
            throttled: self.throttled.load(Ordering::Relaxed),
            pauses: self.pauses.load(Ordering::Relaxed),
            paused_ms: self.paused_ms.load(Ordering::Relaxed),
        }
    }

    /// The instant the provider is paused until, if it is paused now.
    pub fn paused_until(&self) -> Option<Instant> {
        self.state
            .lock()
            .paused_until
            .filter(|&until| until > Instant::now())
    }

    /// Pauses every call of the provider for `wait` from now (a later pause already set wins).
    /// `why` says what asked for it, for the log.
    pub fn pause(&self, wait: Duration, why: &str) {
        if wait.is_zero() {
            return;
        }
        let now = Instant::now();
        let Some(until) = now.checked_add(wait) else {
            return;
        };
        let (started, added) = {
            let mut state = self.state.lock();
            match state.paused_until {
                Some(old) if old >= until => return,
                Some(old) if old > now => {
                    state.paused_until = Some(until);
                    (false, until - old)
                }
                _ => {
                    state.paused_until = Some(until);
                    (true, wait)
                }
            }
        };
        self.paused_ms.fetch_add(millis(added), Ordering::Relaxed);
        if started {
            self.pauses.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                provider = %self.name,
                pause_ms = millis(wait),
                why,
                "provider {} paused for {wait:?} ({why}): every agent of it waits",
                self.name
            );
        }
    }

    /// Counts an answer with status 429.
    pub fn note_throttled(&self) {
        self.throttled.fetch_add(1, Ordering::Relaxed);
    }

    /// Tokens a request is estimated to use: its prompt plus `max_tokens` when one is sent.
    pub fn estimate(request: &LlmRequest, max_tokens: Option<u32>) -> u64 {
        estimate_tokens(&request.messages).saturating_add(u64::from(max_tokens.unwrap_or(0)))
    }

    /// Waits for a permit, the pause and the rates (see the module docs), then returns the call's
    /// permit, charged `tokens`.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future returns the permit and the reservation, if taken.
    pub async fn start(self: &Arc<Self>, tokens: u64) -> CallPermit {
        let waiting = Waiting::new(&self.waiting);
        let permit = match &self.permits {
            // The semaphore is never closed, so `acquire_owned` cannot fail; if it ever did, the
            // call would go on uncapped rather than fail.
            Some(permits) => permits.clone().acquire_owned().await.ok(),
            None => None,
        };
        self.admit(1, tokens).await;
        drop(waiting);
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        CallPermit {
            limiter: self.clone(),
            _permit: permit,
            tokens,
        }
    }

    /// Waits for the pause, reserves `requests` and `tokens` and waits until they are due; if a
    /// pause began meanwhile, gives them back and starts over.
    async fn admit(&self, requests: u32, tokens: u64) {
        loop {
            self.wait_pause().await;
            let wait = {
                let mut state = self.state.lock();
                let now = Instant::now();
                let mut wait = Duration::ZERO;
                if let Some(bucket) = &mut state.requests {
                    wait = wait.max(bucket.reserve(f64::from(requests), now));
                }
                if let Some(bucket) = &mut state.tokens {
                    wait = wait.max(bucket.reserve(tokens as f64, now));
                }
                wait
            };
            let mut reserved = Reserved {
                limiter: self,
                requests,
                tokens,
                due: false,
            };
            if !wait.is_zero() {
                tokio::time::sleep(wait).await;
            }
            if self.paused_until().is_none() {
                reserved.due = true;
                return;
            }
            // A pause began while this call waited: dropping `reserved` gives its reservation
            // back, and it is taken anew after the pause, so the calls that waited through a
            // pause are spaced by the rates again instead of all let go at its end.
        }
    }

    async fn wait_pause(&self) {
        while let Some(until) = self.paused_until() {
            tokio::time::sleep_until(until).await;
        }
    }

    fn give_back(&self, requests: u32, tokens: i128) {
        let mut state = self.state.lock();
        let now = Instant::now();
        if let Some(bucket) = &mut state.requests {
            bucket.give_back(f64::from(requests), now);
        }
        if let Some(bucket) = &mut state.tokens {
            bucket.give_back(tokens as f64, now);
        }
    }
}

/// Counts a waiting call while it lives.
struct Waiting<'a>(&'a AtomicU64);

impl<'a> Waiting<'a> {
    fn new(counter: &'a AtomicU64) -> Self {
        counter.fetch_add(1, Ordering::Relaxed);
        Waiting(counter)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A reservation not yet due: dropped (the call was), it is given back.
struct Reserved<'a> {
    limiter: &'a ProviderLimiter,
    requests: u32,
    tokens: u64,
    due: bool,
}

impl Drop for Reserved<'_> {
    fn drop(&mut self) {
        if !self.due {
            self.limiter
                .give_back(self.requests, i128::from(self.tokens));
        }
    }
}

/// A call admitted by a [`ProviderLimiter`]: holds its concurrency permit until dropped.
pub struct CallPermit {
    limiter: Arc<ProviderLimiter>,
    _permit: Option<OwnedSemaphorePermit>,
    tokens: u64,
}

impl fmt::Debug for CallPermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CallPermit")
            .field("provider", &self.limiter.name)
            .field("tokens", &self.tokens)
            .finish()
    }
}

impl CallPermit {
    /// The limiter it belongs to.
    pub fn limiter(&self) -> &Arc<ProviderLimiter> {
        &self.limiter
    }

    /// Admits another attempt of the call: one more request, after the pause.
    ///
    /// # Cancel safety
    /// Cancel safe, like [`ProviderLimiter::start`].
    pub async fn retry(&self) {
        self.limiter.admit(1, 0).await;
    }

    /// Corrects the call's token charge by the usage the server reported (an estimated usage,
    /// or none, changes nothing).
    pub fn settle(&mut self, usage: Option<&Usage>) {
        let Some(usage) = usage.filter(|u| !u.estimated) else {
            return;
        };
        let used = usage.prompt_tokens.saturating_add(usage.completion_tokens);
        let refund = i128::from(self.tokens) - i128::from(used);
        self.limiter.give_back(0, refund);
        self.tokens = used;
    }
}

impl Drop for CallPermit {
    fn drop(&mut self) {
        self.limiter.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Parses an `x-ratelimit-reset-*` value, OpenAI's duration format: one or more `NUMBER UNIT`
/// pairs with units `h`, `m`, `s`, `ms` (`1s`, `6m0s`, `20ms`, `1h2m3.5s`); a bare number is
/// seconds. `None` for anything else (an empty value, an unknown unit, a negative or non-finite
/// number): such a header is ignored.
#[cfg_attr(not(feature = "openai"), allow(dead_code))] // read by the OpenAI-compatible provider
pub(crate) fn parse_reset(value: &str) -> Option<Duration> {
    let value = value.trim();
    if value.is_empty() {
        return None;
    }
    if let Ok(secs) = value.parse::<f64>() {
        return Duration::try_from_secs_f64(secs).ok();
    }
    let mut total = 0.0_f64;
    let mut rest = value;
    while !rest.is_empty() {
        let number_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number: f64 = rest[..number_end].parse().ok()?;
        rest = &rest[number_end..];
        let unit_end = rest
            .find(|c: char| !c.is_ascii_alphabetic())
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_end] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 0.001,
            _ => return None,
        };
        rest = &rest[unit_end..];
        total += number * scale;
    }
    Duration::try_from_secs_f64(total).ok()
}

/// Any [`Provider`] under a shared [`ProviderLimiter`]: each call takes a permit and is admitted
/// by the rates before the inner provider sees it (see the module docs).
///
/// It cannot read response headers: a `429` from the inner provider is counted, but pauses
/// nothing. For the OpenAI-compatible provider use [`OpenAiCompatible::with_limiter`](crate::OpenAiCompatible::with_limiter) instead,
/// which also honours `Retry-After` and `x-ratelimit-*` (wrapping it as well would charge each
/// call twice).
///
/// By default the turn's `safety.timeout.llm_call_seconds` bounds the whole call, the wait for a
/// permit included; [`Limited::with_call_timeout`] bounds only the inner call, after admission.
pub struct Limited {
    inner: Arc<dyn Provider>,
    limiter: Arc<ProviderLimiter>,
    max_tokens: Option<u32>,
    call_timeout: Option<Duration>,
}

impl fmt::Debug for Limited {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limited")
            .field("inner", &self.inner.name())
            .field("limiter", &self.limiter)
            .field("max_tokens", &self.max_tokens)
            .field("call_timeout", &self.call_timeout)
            .finish()
    }
}

impl Limited {
    /// `inner` under `limiter`.
    pub fn new(inner: Arc<dyn Provider>, limiter: Arc<ProviderLimiter>) -> Self {
        Limited {
            inner,
            limiter,
            max_tokens: None,
            call_timeout: None,
        }
    }

    /// Adds `max_tokens` to each call's token estimate (what the inner provider sends, if any).
    pub fn with_max_tokens(mut self, max_tokens: Option<u32>) -> Self {
        self.max_tokens = max_tokens;
        self
    }

    /// Bounds the inner call (after admission) by `timeout` when the inner provider does not bound
    /// its own calls; the wait for admission is then unbounded (a halt still ends it), and
    /// [`Provider::bounds_its_own_calls`] answers `true`. A zero timeout bounds nothing.
    pub fn with_call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = (!timeout.is_zero()).then_some(timeout);
        self
    }

    /// The limiter.
    pub fn limiter(&self) -> &Arc<ProviderLimiter> {
        &self.limiter
    }
}

impl Provider for Limited {
    fn name(&self) -> &str {
        self.inner.name()
    }

    /// An embedding call takes a permit of the shared limits like a model call (its tokens
    /// estimated at 4 characters each, settled with the usage it reports).
    fn embed(
        &self,
        texts: Vec<String>,
    ) -> Option<BoxFuture<'static, Result<super::Embedded, ProviderError>>> {
        let tokens = texts.iter().map(|t| t.len() as u64 / 4 + 1).sum();
        let call = self.inner.embed(texts)?;
        let limiter = self.limiter.clone();
        Some(Box::pin(async move {
            let mut permit = limiter.start(tokens).await;
            let result = call.await;
            if let Ok(embedded) = &result {
                permit.settle(Some(&embedded.usage));
            }
            result
        }))
    }

    fn model(&self) -> &str {
        self.inner.model()
    }

    fn bounds_its_own_calls(&self) -> bool {
        self.inner.bounds_its_own_calls() || self.call_timeout.is_some()
    }

    fn complete(
        &self,
        request: LlmRequest,
    ) -> BoxFuture<'static, Result<LlmResponse, ProviderError>> {
        let inner = self.inner.clone();
        let limiter = self.limiter.clone();
        let timeout = self
            .call_timeout
            .filter(|_| !self.inner.bounds_its_own_calls());
        let tokens = ProviderLimiter::estimate(&request, self.max_tokens);
        Box::pin(async move {
            let mut permit = limiter.start(tokens).await;
            let agent = request.agent.clone();
            let call = inner.complete(request);
            let result = match timeout {
                None => call.await,
                Some(limit) => tokio::time::timeout(limit, call).await.unwrap_or_else(|_| {
                    let after_ms = millis(limit);
                    tracing::warn!(
                        %agent,
                        after_ms,
                        "llm call timed out (safety.timeout.llm_call_seconds)"
                    );
                    Err(ProviderError::Timeout { after_ms })
                }),
            };
            match &result {
                Ok(response) => permit.settle(Some(&response.usage)),
                Err(e) if matches!(e.last_attempt(), ProviderError::Http { status: 429, .. }) => {
                    limiter.note_throttled()
                }
                Err(_) => {}
            }
            result
        })
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openai_reset_durations() {
        let ms = |v: &str| parse_reset(v).map(|d| d.as_millis());
        assert_eq!(ms("1s"), Some(1000));
        assert_eq!(ms("6m0s"), Some(360_000));
        assert_eq!(ms("20ms"), Some(20));
        assert_eq!(ms("1h2m3.5s"), Some(3_723_500));
        assert_eq!(ms(" 2 "), Some(2000));
        assert_eq!(ms("0.5"), Some(500));
        assert_eq!(ms("1m30ms"), Some(60_030));
    }

    #[test]
    fn malformed_resets_are_ignored() {
        for bad in [
            "", " ", "s", "1x", "-1s", "1.2.3s", "abc", "1s2", "NaN", "inf", "-3", "1e999", "ms",
            "1h-2m", "٣s",
        ] {
            assert_eq!(parse_reset(bad), None, "{bad:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_pause_is_only_extended_and_counted_once() {
        let limiter = ProviderLimiter::new("unit-pause", ProviderLimits::default());
        limiter.pause(Duration::from_secs(2), "test");
        limiter.pause(Duration::from_secs(1), "test"); // earlier: ignored
        limiter.pause(Duration::from_secs(3), "test"); // extends by 1 s
        let stats = limiter.stats();
        assert_eq!((stats.pauses, stats.paused_ms), (1, 3000));
        let start = Instant::now();
        let _permit = limiter.start(10).await;
        assert_eq!(start.elapsed(), Duration::from_secs(3));
        limiter.pause(Duration::from_secs(1), "test"); // a new pause
        assert_eq!(limiter.stats().pauses, 2);
    }

    #[tokio::test(start_paused = true)]
    async fn tokens_are_corrected_by_usage_and_debt_is_waited_out() {
        // 600 tokens a minute: 10 a second, a bucket of 10.
        let limits = ProviderLimits {
            tokens_per_minute: 600,
            ..ProviderLimits::default()
        };
        let limiter = ProviderLimiter::new("unit-tokens", limits);
        let start = Instant::now();
        // Larger than the bucket: passes at once, leaving 90 tokens of debt (9 s).
        let mut permit = limiter.start(100).await;
        assert_eq!(start.elapsed(), Duration::ZERO);
        // The reply used only 20: 80 come back, the debt is 10 tokens (1 s) ...
        permit.settle(Some(&Usage {
            prompt_tokens: 15,
            completion_tokens: 5,
            estimated: false,
        }));
        drop(permit);
        // ... so a call of 10 waits 1 s (debt) + 1 s (its own 10 tokens).
        let _next = limiter.start(10).await;
        assert_eq!(start.elapsed(), Duration::from_secs(2));
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_wait_gives_its_reservation_back() {
        let limits = ProviderLimits {
            requests_per_minute: 60,
            ..ProviderLimits::default()
        };
        let limiter = ProviderLimiter::new("unit-drop", limits);
        let start = Instant::now();
        let _first = limiter.start(0).await; // at once
        {
            // Reserves the slot at 1 s, then is dropped half-way.
            let waiting = limiter.start(0);
            assert!(tokio::time::timeout(Duration::from_millis(500), waiting)
                .await
                .is_err());
        }
        assert_eq!(limiter.stats().waiting, 0);
        // The slot at 1 s is free again.
        let _third = limiter.start(0).await;
        assert_eq!(start.elapsed(), Duration::from_secs(1));
    }
}
