//! Retries of a tool call (design 001's `_TOOL_RETRY_CONFIG`): which errors are retryable, and the
//! wait before the next attempt.
//!
//! * **Retryable** ([`is_retryable`]): a [`ToolError::Timeout`], and a [`ToolError::Failed`] whose
//!   text says the trouble is passing — the design's words `timeout`, `connection`, `network`,
//!   `temporary`, `rate limit`, `try again`, and their usual spellings (`timed out`,
//!   `temporarily`, `rate-limit`, `too many requests`, `unavailable`), case-insensitively. A tool's
//!   own text is all warden has: an MCP server's `isError` result and a transport failure both
//!   arrive as text. Never retried: invalid arguments, an unknown tool, a panic, a refusal by the
//!   permission gate, and any other failure (a tool that says what was wrong will say it again).
//! * **Never for DANGEROUS tools** unless the tool declares itself idempotent ([`super::Tool::idempotent`]):
//!   a retried side effect would happen twice.
//! * **The wait** before attempt `n + 1` is `base * multiplier^(n - 1)`, capped at the maximum;
//!   with jitter it is drawn from 50 % to 100 % of that. It is a `tokio::time::sleep`: paused time
//!   in tests, and a halt that drops the call's future ends it at once.
//! * **The breakers count the final outcome once**: the circuit's permit is held across the
//!   attempts and records only the last, and the turn counts only what the call finally returned.

use super::ToolError;
use rand::Rng;
use std::time::Duration;
use warden_protocols::ToolRetryConfig;

/// The words of a retryable failure (matched lower-case, anywhere in the text).
const RETRYABLE_WORDS: &[&str] = &[
    "timeout",
    "timed out",
    "connection",
    "network",
    "temporary",
    "temporarily",
    "rate limit",
    "rate-limit",
    "ratelimit",
    "too many requests",
    "try again",
    "unavailable",
];

/// Whether `error` is worth another attempt (see the module docs).
pub fn is_retryable(error: &ToolError) -> bool {
    match error {
        ToolError::Timeout { .. } => true,
        ToolError::Failed(text) => {
            let text = text.to_lowercase();
            RETRYABLE_WORDS.iter().any(|word| text.contains(word))
        }
        ToolError::InvalidArguments(_)
        | ToolError::Unknown(_)
        | ToolError::Panicked(_)
        | ToolError::Refused(_) => false,
    }
}

/// The exponential wait after failed attempt `attempt` (from 1): `base * multiplier^(attempt-1)`,
/// at most `max`, with `jitter` drawn from 50 % to 100 % of that. Shared with the OpenAI-compatible
/// provider's retries.
pub(crate) fn backoff(
    base: Duration,
    max: Duration,
    multiplier: f64,
    jitter: bool,
    attempt: u32,
) -> Duration {
    let multiplier = if multiplier.is_finite() && multiplier >= 1.0 {
        multiplier
    } else {
        1.0
    };
    let exponent = i32::try_from(attempt.saturating_sub(1)).unwrap_or(i32::MAX);
    let raw = base.as_secs_f64() * multiplier.powi(exponent);
    let capped = if raw.is_finite() {
        raw.min(max.as_secs_f64())
    } else {
        max.as_secs_f64()
    };
    let secs = if jitter {
        capped * rand::thread_rng().gen_range(0.5..=1.0)
    } else {
        capped
    };
    Duration::try_from_secs_f64(secs).unwrap_or(max)
}

/// [`backoff`] with a tool's retry settings.
pub(crate) fn delay_after(retry: &ToolRetryConfig, attempt: u32) -> Duration {
    let secs = |s: f64| Duration::try_from_secs_f64(s).unwrap_or(Duration::ZERO);
    backoff(
        secs(retry.base_seconds),
        secs(retry.max_seconds),
        retry.multiplier,
        retry.jitter,
        attempt,
    )
}

/// What the caller of [`super::PendingCall::execute_observed`] hears of the retries, and how it
/// stops them.
pub trait RetryObserver: Sync {
    /// Attempt `attempt` of `max_attempts` failed with `error`; the next starts after `delay`.
    fn retrying(&self, attempt: u32, max_attempts: u32, error: &ToolError, delay: Duration);
    /// Asked after the wait, right before the next attempt starts: `false` stops the retries
    /// (a halt came) and the call ends without a result.
    fn may_retry(&self) -> bool;
}

/// The observer of a caller that does not listen: every retry is made.
#[derive(Debug, Clone, Copy, Default)]
pub struct Unobserved;

impl RetryObserver for Unobserved {
    fn retrying(&self, _: u32, _: u32, _: &ToolError, _: Duration) {}
    fn may_retry(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_designs_words_are_retryable_and_other_failures_are_not() {
        for text in [
            "request timeout",
            "Connection reset by peer",
            "network unreachable",
            "temporary failure in name resolution",
            "Service temporarily unavailable",
            "429 Too Many Requests",
            "rate limit exceeded",
            "busy, try again later",
        ] {
            assert!(is_retryable(&ToolError::Failed(text.into())), "{text}");
        }
        assert!(is_retryable(&ToolError::Timeout { after_ms: 5 }));
        for error in [
            ToolError::Failed("no such file".into()),
            ToolError::InvalidArguments("timeout must be a number".into()),
            ToolError::Unknown("timeout".into()),
            ToolError::Panicked("connection".into()),
            ToolError::Refused("network tools are refused".into()),
        ] {
            assert!(!is_retryable(&error), "{error:?}");
        }
    }

    #[test]
    fn the_wait_doubles_from_one_second_and_stops_at_ten() {
        let retry = ToolRetryConfig {
            jitter: false,
            ..ToolRetryConfig::default()
        };
        let waits: Vec<u64> = (1..=5)
            .map(|n| delay_after(&retry, n).as_millis() as u64)
            .collect();
        assert_eq!(waits, [1000, 2000, 4000, 8000, 10_000]);
        let jittered = ToolRetryConfig::default();
        for _ in 0..100 {
            let wait = delay_after(&jittered, 2);
            assert!(
                (Duration::from_secs(1)..=Duration::from_secs(2)).contains(&wait),
                "{wait:?}"
            );
        }
    }
}
