//! Retries with exponential backoff for the OpenAI-compatible provider.
//!
//! - Retried: timeouts, connection errors, HTTP 408, 429 and 5xx (exactly
//!   [`ProviderError::is_retryable`]). Never retried: other 4xx (400, 401, 403, 404, ...) and
//!   malformed responses.
//! - The delay before attempt `n + 1` is `base * multiplier^(n - 1)`, capped at `max`; with `jitter`
//!   it is drawn uniformly from 50 % to 100 % of that value.
//! - A `Retry-After` header (RFC 9110 §10.2.3) replaces the computed delay (no jitter), capped at
//!   [`RetryPolicy::retry_after_cap`] (60 s by default) so a misbehaving server cannot park an agent
//!   for hours. Both forms are read: delay-seconds (`120`) and an HTTP date (IMF-fixdate
//!   `Wed, 21 Oct 2015 07:28:00 GMT`, and the obsolete RFC 850 and asctime forms), which means
//!   `date - now`, 0 for a date in the past. An unreadable value is ignored (the computed delay is
//!   used).
//! - Every retry is logged at `warn` (attempt, class, error, delay) and counted per class in a
//!   process-wide counter ([`retry_counts`], `warden_provider_retries_total` on `/metrics`). A
//!   call that still fails after retries fails as [`ProviderError::Retried`] (`… (after 4
//!   attempts)`), logged at `error` (the binary's default level).
//! - Waiting uses `tokio::time::sleep`, so it follows a paused test clock, and dropping the future
//!   stops the retries.

use super::duration_secs;
use crate::provider::ProviderError;
use serde::{Deserialize, Serialize};
use std::{
    fmt,
    future::Future,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, SystemTime},
};

/// How often and how patiently a failed call is retried.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetryPolicy {
    /// Total attempts, the first one included (`1` disables retries; `0` is treated as `1`).
    pub max_attempts: u32,
    /// Delay before the second attempt (seconds in config files).
    #[serde(with = "duration_secs")]
    pub base: Duration,
    /// Upper bound of the computed delay (seconds in config files).
    #[serde(with = "duration_secs")]
    pub max: Duration,
    /// Growth factor of the delay per attempt.
    pub multiplier: f64,
    /// Randomise each computed delay to 50–100 % of its value, against thundering herds.
    pub jitter: bool,
    /// Upper bound of a server's `Retry-After` (seconds in config files).
    #[serde(with = "duration_secs")]
    pub retry_after_cap: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 4,
            base: Duration::from_secs(1),
            max: Duration::from_secs(10),
            multiplier: 2.0,
            jitter: true,
            retry_after_cap: Duration::from_secs(60),
        }
    }
}

impl RetryPolicy {
    /// No retries: one attempt only.
    pub fn none() -> Self {
        RetryPolicy {
            max_attempts: 1,
            ..RetryPolicy::default()
        }
    }

    /// The delay after failed attempt `attempt` (1-based), given the server's `Retry-After`.
    pub fn delay_after(&self, attempt: u32, retry_after: Option<Duration>) -> Duration {
        if let Some(wait) = retry_after {
            return wait.min(self.retry_after_cap);
        }
        crate::tools::retry::backoff(self.base, self.max, self.multiplier, self.jitter, attempt)
    }
}

/// One failed attempt, as reported to an [`AttemptObserver`].
#[derive(Debug, Clone, PartialEq)]
pub struct FailedAttempt {
    /// 1-based number of the attempt that failed.
    pub attempt: u32,
    /// Why it failed.
    pub error: ProviderError,
    /// `Some(delay)` when another attempt follows after `delay`; `None` when this failure is the
    /// call's final outcome.
    pub retry_in: Option<Duration>,
}

/// Called once for every failed attempt of a call, including the last one.
///
/// For breakers: a call that failed, was retried and then succeeded is **not** an error for the
/// consecutive-error breaker — only a call's final outcome (what `complete` returns, or the
/// `Finished` event of a stream) counts there. Each failed attempt is still reported here, so the
/// agent can count attempts (e.g. toward a rate or cost breaker) and show them in its status.
///
/// The observer runs inline in the provider's future: keep it short and non-blocking.
#[derive(Clone)]
pub struct AttemptObserver(Arc<dyn Fn(&FailedAttempt) + Send + Sync>);

impl AttemptObserver {
    /// An observer calling `f` for every failed attempt (inline: keep it short).
    pub fn new(f: impl Fn(&FailedAttempt) + Send + Sync + 'static) -> Self {
        AttemptObserver(Arc::new(f))
    }

    pub(super) fn report(&self, failed: &FailedAttempt) {
        (self.0)(failed)
    }
}

impl fmt::Debug for AttemptObserver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AttemptObserver(..)")
    }
}

/// An attempt's failure with the server's `Retry-After`, if any.
#[derive(Debug)]
pub(super) struct AttemptError {
    pub error: ProviderError,
    pub retry_after: Option<Duration>,
}

impl From<ProviderError> for AttemptError {
    fn from(error: ProviderError) -> Self {
        AttemptError {
            error,
            retry_after: None,
        }
    }
}

/// Parses a `Retry-After` value: delay-seconds (`"120"`) or an HTTP date (IMF-fixdate, RFC 850 or
/// asctime), the latter as the time from `now` to it (zero for a date in the past). `None` when the
/// value is neither.
pub(super) fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let date = httpdate::parse_http_date(value).ok()?;
    Some(date.duration_since(now).unwrap_or(Duration::ZERO))
}

/// The classes retries are counted by, in the order [`retry_counts`] lists them.
pub const RETRY_CLASSES: [&str; 6] = ["408", "429", "5xx", "timeout", "connect", "other"];

/// Retries since the process started, by [`RETRY_CLASSES`] index.
static RETRIES: [AtomicU64; RETRY_CLASSES.len()] =
    [const { AtomicU64::new(0) }; RETRY_CLASSES.len()];

/// The class a retried error is counted under: `408`, `429`, `5xx`, `timeout`, `connect`, or
/// `other` (any other error a future policy might retry).
pub fn retry_class(error: &ProviderError) -> &'static str {
    match error.last_attempt() {
        ProviderError::Http { status: 408, .. } => "408",
        ProviderError::Http { status: 429, .. } => "429",
        ProviderError::Http { status, .. } if (500..=599).contains(status) => "5xx",
        ProviderError::Timeout { .. } => "timeout",
        ProviderError::Connection { .. } => "connect",
        _ => "other",
    }
}

/// Retries made by every OpenAI-compatible provider of this process since it started, per class
/// (every class listed, in [`RETRY_CLASSES`] order). A retry is counted when it is decided, before
/// its wait.
pub fn retry_counts() -> [(&'static str, u64); RETRY_CLASSES.len()] {
    std::array::from_fn(|i| (RETRY_CLASSES[i], RETRIES[i].load(Ordering::Relaxed)))
}

fn count_retry(class: &'static str) {
    let i = RETRY_CLASSES
        .iter()
        .position(|&c| c == class)
        .unwrap_or(RETRY_CLASSES.len() - 1);
    RETRIES[i].fetch_add(1, Ordering::Relaxed);
}

/// Runs `attempt` until it succeeds, fails for good, or `policy.max_attempts` is reached.
/// Returns the outcome and the number of attempts made.
pub(super) async fn run_with_retries<T, F, Fut>(
    policy: &RetryPolicy,
    observer: Option<&AttemptObserver>,
    mut attempt: F,
) -> (Result<T, ProviderError>, u32)
where
    F: FnMut(u32) -> Fut,
    Fut: Future<Output = Result<T, AttemptError>>,
{
    let max_attempts = policy.max_attempts.max(1);
    let mut number = 1;
    loop {
        match attempt(number).await {
            Ok(value) => return (Ok(value), number),
            Err(AttemptError { error, retry_after }) => {
                let retry_in = (error.is_retryable() && number < max_attempts)
                    .then(|| policy.delay_after(number, retry_after));
                let failed = FailedAttempt {
                    attempt: number,
                    error,
                    retry_in,
                };
                if let Some(observer) = observer {
                    observer.report(&failed);
                }
                match retry_in {
                    None if number > 1 => {
                        let class = retry_class(&failed.error);
                        // At `error`: the default level of `warden serve` shows it.
                        tracing::error!(
                            attempts = number,
                            class,
                            error = %failed.error,
                            "llm call failed after {number} attempts ({class}): {}",
                            failed.error
                        );
                        let error = ProviderError::Retried {
                            attempts: number,
                            last: Box::new(failed.error),
                        };
                        return (Err(error), number);
                    }
                    None => return (Err(failed.error), number),
                    Some(delay) => {
                        let class = retry_class(&failed.error);
                        count_retry(class);
                        tracing::warn!(
                            attempt = number,
                            max_attempts,
                            class,
                            delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                            retry_after = retry_after.is_some(),
                            error = %failed.error,
                            "llm call attempt {number}/{max_attempts} failed ({class}); retrying in {delay:?}"
                        );
                        tokio::time::sleep(delay).await;
                        number += 1;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use parking_lot::Mutex;

    fn fixed(base_ms: u64, max_ms: u64) -> RetryPolicy {
        RetryPolicy {
            max_attempts: 4,
            base: Duration::from_millis(base_ms),
            max: Duration::from_millis(max_ms),
            multiplier: 2.0,
            jitter: false,
            retry_after_cap: Duration::from_secs(60),
        }
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        let p = fixed(1000, 10_000);
        let delays: Vec<_> = (1..=6)
            .map(|n| p.delay_after(n, None).as_millis())
            .collect();
        assert_eq!(delays, vec![1000, 2000, 4000, 8000, 10_000, 10_000]);
    }

    #[test]
    fn jitter_stays_within_half_and_full() {
        let p = RetryPolicy::default();
        for _ in 0..200 {
            let d = p.delay_after(2, None);
            assert!(
                d >= Duration::from_secs(1) && d <= Duration::from_secs(2),
                "{d:?}"
            );
        }
    }

    #[test]
    fn retry_after_replaces_backoff_and_is_capped() {
        let p = fixed(1000, 10_000);
        assert_eq!(
            p.delay_after(1, Some(Duration::from_secs(30))),
            Duration::from_secs(30)
        );
        assert_eq!(
            p.delay_after(1, Some(Duration::from_secs(3600))),
            Duration::from_secs(60)
        );
        assert_eq!(
            parse_retry_after(" 7 ", SystemTime::now()),
            Some(Duration::from_secs(7))
        );
    }

    #[test]
    fn retry_after_http_dates_are_read_in_every_form() {
        // Wed, 21 Oct 2015 07:28:00 GMT
        let date = SystemTime::UNIX_EPOCH + Duration::from_secs(1_445_412_480);
        let now = date - Duration::from_secs(90);
        for value in [
            "Wed, 21 Oct 2015 07:28:00 GMT",     // IMF-fixdate
            "Wednesday, 21-Oct-15 07:28:00 GMT", // obsolete RFC 850
            "Wed Oct 21 07:28:00 2015",          // obsolete asctime
            " Wed, 21 Oct 2015 07:28:00 GMT ",
        ] {
            assert_eq!(
                parse_retry_after(value, now),
                Some(Duration::from_secs(90)),
                "{value}"
            );
        }
        // A date in the past means "now"; sub-second parts of `now` are honoured.
        assert_eq!(
            parse_retry_after(
                "Wed, 21 Oct 2015 07:28:00 GMT",
                date + Duration::from_secs(5)
            ),
            Some(Duration::ZERO)
        );
        assert_eq!(
            parse_retry_after(
                "Wed, 21 Oct 2015 07:28:00 GMT",
                now + Duration::from_millis(250)
            ),
            Some(Duration::from_millis(89_750))
        );
        for junk in ["", "soon", "-5", "1.5", "Wed, 32 Oct 2015 07:28:00 GMT"] {
            assert_eq!(parse_retry_after(junk, now), None, "{junk:?}");
        }
        // The cap applies to dates too.
        let far = parse_retry_after(
            "Wed, 21 Oct 2015 07:28:00 GMT",
            date - Duration::from_secs(7200),
        );
        assert_eq!(
            fixed(1000, 10_000).delay_after(1, far),
            Duration::from_secs(60)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn retries_are_counted_by_class() {
        // Only this test retries 408s, so its count is exact even with tests running in parallel.
        let count = |class: &str| {
            retry_counts()
                .iter()
                .find(|(c, _)| *c == class)
                .map_or(0, |(_, n)| *n)
        };
        let before = count("408");
        let start = tokio::time::Instant::now();
        let (result, attempts) = run_with_retries(&fixed(100, 1000), None, |n| async move {
            if n < 3 {
                Err(AttemptError {
                    error: ProviderError::Http {
                        status: 408,
                        body: String::new(),
                    },
                    retry_after: None,
                })
            } else {
                Ok(n)
            }
        })
        .await;
        assert_eq!((result, attempts), (Ok(3), 3));
        assert_eq!(start.elapsed(), Duration::from_millis(300));
        assert_eq!(count("408") - before, 2);
        assert_eq!(
            retry_counts().map(|(c, _)| c),
            RETRY_CLASSES,
            "every class is listed, in order"
        );
        let class = |status| {
            retry_class(&ProviderError::Http {
                status,
                body: String::new(),
            })
        };
        assert_eq!((class(429), class(503), class(408)), ("429", "5xx", "408"));
        assert_eq!(
            retry_class(&ProviderError::Timeout { after_ms: 1 }),
            "timeout"
        );
        assert_eq!(
            retry_class(&ProviderError::Connection {
                message: String::new()
            }),
            "connect"
        );
    }

    #[test]
    fn absurd_multiplier_does_not_panic() {
        let mut p = fixed(1000, 10_000);
        p.multiplier = f64::INFINITY;
        assert_eq!(p.delay_after(3, None), Duration::from_secs(1));
        p.multiplier = 1e308;
        assert_eq!(p.delay_after(u32::MAX, None), Duration::from_secs(10));
    }

    #[tokio::test(start_paused = true)]
    async fn waits_on_tokio_clock_and_reports_every_failure() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let observer = {
            let seen = seen.clone();
            AttemptObserver::new(move |f| seen.lock().push(f.clone()))
        };
        let start = tokio::time::Instant::now();
        let (result, attempts) =
            run_with_retries(&fixed(1000, 10_000), Some(&observer), |n| async move {
                match n {
                    1 => Err(AttemptError {
                        error: ProviderError::Http {
                            status: 429,
                            body: String::new(),
                        },
                        retry_after: Some(Duration::from_secs(5)),
                    }),
                    2 => Err(ProviderError::Timeout { after_ms: 1 }.into()),
                    _ => Ok(n),
                }
            })
            .await;
        assert_eq!(result, Ok(3));
        assert_eq!(attempts, 3);
        // 5 s from Retry-After, then 2 s of backoff after the second attempt.
        assert_eq!(start.elapsed(), Duration::from_secs(7));
        let seen = seen.lock();
        assert_eq!(seen.len(), 2);
        assert_eq!(seen[0].retry_in, Some(Duration::from_secs(5)));
        assert_eq!(seen[1].retry_in, Some(Duration::from_secs(2)));
    }

    #[tokio::test(start_paused = true)]
    async fn gives_up_after_max_attempts_and_never_retries_client_errors() {
        let calls = Mutex::new(0u32);
        let (result, attempts) = run_with_retries::<(), _, _>(&fixed(10, 100), None, |_| {
            *calls.lock() += 1;
            async {
                Err(ProviderError::Connection {
                    message: "x".into(),
                }
                .into())
            }
        })
        .await;
        assert!(matches!(
            &result,
            Err(ProviderError::Retried { attempts: 4, last })
                if matches!(**last, ProviderError::Connection { .. })
        ));
        assert_eq!((attempts, *calls.lock()), (4, 4));

        let (result, attempts) = run_with_retries::<(), _, _>(&fixed(10, 100), None, |_| async {
            Err(ProviderError::Http {
                status: 401,
                body: String::new(),
            }
            .into())
        })
        .await;
        assert!(matches!(
            result,
            Err(ProviderError::Http { status: 401, .. })
        ));
        assert_eq!(attempts, 1);
    }
}
