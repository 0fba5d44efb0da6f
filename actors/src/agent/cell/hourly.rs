//! The rolling token budget, `safety.budget.tokens_per_hour` (0 = off): the tokens of the agent's
//! model calls of the last hour bound its spending. Exact per call: every call's tokens are kept with
//! the moment they were recorded and age out one hour later, so the window slides call by call (at
//! most one entry a call of the last hour is kept). When the last hour's tokens reach the limit, a
//! turn does not start its next model call (a request or a summary) until enough of them aged out:
//! it waits — cancellable by a halt, journaled once as `token_budget_waiting`, shown in the status
//! (`budget_wait_until_ms`) — instead of stopping. The call that crosses the limit is not cut: the
//! limit is checked before a call, so the last hour may exceed it by one call. A restart keeps the
//! window: a restored agent starts it from the journal's `usage_recorded` events of the last hour,
//! each at the time it was journaled ([`crate::Journal::recent_usage`]), so restarts (a crash loop
//! included) do not hand out a fresh hour.

use super::*;
use std::collections::VecDeque;
use tokio::time::Instant;

/// One hour.
const HOUR: Duration = Duration::from_secs(3600);

/// The calls of the last hour and their sum.
#[derive(Debug, Default)]
pub(crate) struct HourlyWindow {
    calls: VecDeque<(Instant, u64)>,
    sum: u64,
    /// Until when (ms since the epoch) the agent waits now, if it does.
    waiting_until_ms: Option<u64>,
}

impl HourlyWindow {
    fn age(&mut self, now: Instant) {
        while let Some(&(at, tokens)) = self.calls.front() {
            if at + HOUR > now {
                break;
            }
            self.sum = self.sum.saturating_sub(tokens);
            self.calls.pop_front();
        }
    }

    /// When the last hour's tokens will be below `limit` again (`None`: they are now).
    fn free_at(&self, limit: u64) -> Option<Instant> {
        if self.sum < limit {
            return None;
        }
        let mut left = self.sum;
        for &(at, tokens) in &self.calls {
            left = left.saturating_sub(tokens);
            if left < limit {
                return Some(at + HOUR);
            }
        }
        // Unreachable with calls of the last hour summing to `sum`; wait a full hour to be safe.
        Some(Instant::now() + HOUR)
    }
}

impl AgentCell {
    fn tokens_per_hour(&self) -> u64 {
        self.safety.config.budget.tokens_per_hour
    }

    /// After a restart: the last hour's calls as the journal has them, each aging out one hour
    /// after it was journaled (when the rolling budget is on).
    pub(crate) fn hourly_restore(&self) {
        if self.tokens_per_hour() == 0 {
            return;
        }
        let now_ms = now_ms();
        let calls = self
            .journal
            .recent_usage(&self.key, now_ms.saturating_sub(HOUR.as_millis() as u64));
        if calls.is_empty() {
            return;
        }
        let now = Instant::now();
        let mut w = self.busy().hourly.lock();
        for (at_ms, tokens) in calls {
            // A call journaled "in the future" (the clock went back) counts as made now.
            let ago = Duration::from_millis(now_ms.saturating_sub(at_ms));
            let at = now.checked_sub(ago).unwrap_or(now);
            w.calls.push_back((at, tokens));
            w.sum = w.sum.saturating_add(tokens);
        }
    }

    /// Counts a call's `tokens` in the last hour (when the rolling budget is on).
    pub(crate) fn hourly_spent(&self, tokens: u64) {
        if self.tokens_per_hour() == 0 || tokens == 0 {
            return;
        }
        let mut w = self.busy().hourly.lock();
        w.calls.push_back((Instant::now(), tokens));
        w.sum = w.sum.saturating_add(tokens);
    }

    /// Until when the agent waits for its rolling budget (ms since the epoch), if it does.
    pub(crate) fn hourly_wait_until_ms(&self) -> Option<u64> {
        self.busy_now()
            .and_then(|b| b.hourly.lock().waiting_until_ms)
    }

    /// Waits until the last hour's tokens are below `tokens_per_hour` (at once when they are, or
    /// when the budget is off). `false`: a halt came first.
    pub(crate) async fn hourly_budget(&self, token: &CancellationToken) -> bool {
        let limit = self.tokens_per_hour();
        if limit == 0 {
            return true;
        }
        // However the wait ends — the budget freed, the halt's token, or the turn dropped with it
        // (a halt read by the actor before the turn was polled again) — the status stops showing it.
        let _shown = ClearWait(self);
        loop {
            let (wake, tokens, announce) = {
                let mut w = self.busy().hourly.lock();
                let now = Instant::now();
                w.age(now);
                let Some(wake) = w.free_at(limit) else {
                    w.waiting_until_ms = None;
                    return true;
                };
                let wait = wake.saturating_duration_since(now);
                let until =
                    now_ms().saturating_add(u64::try_from(wait.as_millis()).unwrap_or(u64::MAX));
                let announce = w.waiting_until_ms.is_none();
                w.waiting_until_ms = Some(until);
                (wake, w.sum, announce.then_some(wait))
            };
            if let Some(wait) = announce {
                tracing::info!(agent = %self.key, tokens, limit, "rolling token budget spent; waiting");
                self.note(EventKind::TokenBudgetWaiting {
                    tokens,
                    limit,
                    wait_ms: u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
                });
            }
            tokio::select! {
                biased;
                _ = token.cancelled() => {
                    self.busy().hourly.lock().waiting_until_ms = None;
                    return false;
                }
                _ = tokio::time::sleep_until(wake) => {}
            }
        }
    }
}

/// Clears the shown wait (`budget_wait_until_ms`) when dropped.
struct ClearWait<'a>(&'a AgentCell);

impl Drop for ClearWait<'_> {
    fn drop(&mut self) {
        if let Some(busy) = self.0.busy_now() {
            busy.hourly.lock().waiting_until_ms = None;
        }
    }
}
