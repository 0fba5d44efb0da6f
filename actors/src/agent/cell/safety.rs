//! Errors and breakers: counting failures, obeying a [`Verdict`], tripping into `SAFETY_LOCKOUT`,
//! usage and budgets.

use super::*;

impl AgentCell {
    /// A failed operation with the breakers' verdict on it: counts it, obeys the verdict (a breaker's
    /// lockout or stop wins over the consecutive-error stop, whose reason would be less specific), and
    /// trips the emergency stop at `max_consecutive_errors`.
    pub(crate) fn fail(&self, error: &str, verdict: Verdict) -> Counted {
        let mut rec = self.lock();
        let n = rec.consecutive_errors.saturating_add(1);
        self.emit(
            &mut rec,
            EventKind::ErrorCounted {
                consecutive_errors: n,
                error: error.to_owned(),
            },
        );
        self.journal_error_window(&mut rec);
        if rec.state != AgentState::Executing {
            return Counted::Below;
        }
        let counted = self.obey_locked(&mut rec, verdict);
        if counted != Counted::Below {
            return counted;
        }
        if n >= rec.max_consecutive_errors {
            self.trip(
                &mut rec,
                Breaker::ConsecutiveErrors,
                format!("Maximum consecutive errors reached ({n})"),
            );
            return Counted::Tripped;
        }
        Counted::Below
    }

    /// A successful action: resets the count, then obeys the breakers' verdict (e.g. stuck).
    pub(crate) fn succeed(&self, verdict: Verdict) -> Counted {
        let mut rec = self.lock();
        if rec.consecutive_errors > 0 {
            self.emit(&mut rec, EventKind::ErrorsReset);
        }
        self.journal_error_window(&mut rec);
        self.obey_locked(&mut rec, verdict)
    }

    /// Obeys a verdict that is neither a success nor a failure (budget check, loop start, a model
    /// call that asked for tools: that one moves the error window).
    pub(crate) fn obey(&self, verdict: Verdict) -> Counted {
        let moved = self
            .safety
            .checks
            .then(|| self.breakers_lock().take_window_change())
            .flatten();
        if matches!(verdict, Verdict::Continue) && moved.is_none() {
            return Counted::Below;
        }
        let mut rec = self.lock();
        if let Some(window) = moved {
            self.journal_window(&mut rec, window);
        }
        self.obey_locked(&mut rec, verdict)
    }

    /// Journals the breakers' error window if it moved while it held a failure (`ErrorWindow`), so
    /// a restart restores it (under the record lock; the breakers' lock is taken inside it).
    fn journal_error_window(&self, rec: &mut AgentRecord) {
        if !self.safety.checks {
            return;
        }
        let moved = self.breakers_lock().take_window_change();
        if let Some(window) = moved {
            self.journal_window(rec, window);
        }
    }

    fn journal_window(&self, rec: &mut AgentRecord, window: String) {
        if window != rec.error_window() {
            self.emit(rec, EventKind::ErrorWindow { window });
        }
    }

    fn obey_locked(&self, rec: &mut AgentRecord, verdict: Verdict) -> Counted {
        match verdict {
            Verdict::Continue | Verdict::Limit { .. } => Counted::Below,
            Verdict::Warn { message } => {
                tracing::warn!(agent = %self.key, %message, "near budget");
                self.emit(rec, EventKind::BudgetWarning { message });
                Counted::Below
            }
            Verdict::Alert { message } => {
                self.emit(
                    rec,
                    EventKind::SafetyAlert {
                        message: message.clone(),
                    },
                );
                self.emit(
                    rec,
                    EventKind::HistoryAppended {
                        message: ChatMessage::system(message).internal(),
                    },
                );
                Counted::Below
            }
            Verdict::Stop {
                breaker: Breaker::BudgetExceeded,
                reason,
            } => {
                // The near-budget warning before any budget stop, if this stop came first.
                let owed = self.breakers_lock().take_budget_warning();
                if let Some(message) = owed {
                    tracing::warn!(agent = %self.key, %message, "near budget");
                    self.emit(rec, EventKind::BudgetWarning { message });
                }
                if rec.state != AgentState::Executing {
                    return Counted::Below;
                }
                tracing::warn!(agent = %self.key, %reason, "budget exceeded");
                let stopped = EventKind::BreakerStopped {
                    breaker: Breaker::BudgetExceeded,
                    reason: reason.clone(),
                };
                let _ = self.transition_with(rec, vec![stopped], AgentState::Stopped, &reason);
                self.safety.notify(TripNotice {
                    agent: self.key.clone(),
                    breaker: Breaker::BudgetExceeded,
                    reason,
                    lockout: false,
                    at_ms: now_ms(),
                });
                Counted::Stopped
            }
            // Every other stop (stuck) and every lockout is a trip into SAFETY_LOCKOUT.
            Verdict::Stop { breaker, reason } | Verdict::Lockout { breaker, reason } => {
                if rec.state != AgentState::Executing {
                    return Counted::Below;
                }
                self.trip(rec, breaker, reason);
                Counted::Tripped
            }
        }
    }

    /// Locks the agent out: journals the lockout and `EXECUTING → SAFETY_LOCKOUT` in one batch; tells
    /// the monitor and every agent waiting on a delegation to this one. Only from `EXECUTING` (a
    /// breaker trips while a turn runs): anywhere else the transition is refused and nothing is
    /// locked out.
    pub(crate) fn trip(&self, rec: &mut AgentRecord, breaker: Breaker, reason: String) {
        tracing::warn!(agent = %self.key, ?breaker, %reason, "breaker tripped");
        let locked = EventKind::LockedOut {
            breaker,
            reason: reason.clone(),
            consecutive_errors: rec.consecutive_errors,
        };
        if self
            .transition_with(rec, vec![locked], AgentState::SafetyLockout, &reason)
            .is_err()
        {
            return;
        }
        self.safety.notify(TripNotice {
            agent: self.key.clone(),
            breaker,
            reason: reason.clone(),
            lockout: true,
            at_ms: now_ms(),
        });
        let delegators: Vec<Arc<AgentCell>> = self.busy_now().map_or_else(Vec::new, |b| {
            b.delegators
                .lock()
                .values()
                .filter_map(Weak::upgrade)
                .collect()
        });
        for delegator in delegators {
            let _ = delegator
                .mailbox
                .try_send(AgentMsg::Signal(Signal::DelegateLockedOut {
                    delegate: self.key.clone(),
                    reason: reason.clone(),
                }));
        }
    }

    /// Runs `f` on the breakers (only when the team's safety checks are on).
    pub(crate) fn breakers<R>(&self, f: impl FnOnce(&mut AgentBreakers) -> R) -> Option<R> {
        self.safety.checks.then(|| f(&mut self.breakers_lock()))
    }

    /// Usage is always accounted (status, team totals), even with the checks off, and journaled
    /// (`UsageRecorded`, not waited for: it is committed with the turn's other events), so the
    /// record's `usage` always equals the breakers' totals and a restart keeps the budgets spent.
    pub(crate) fn record_usage(&self, usage: warden_protocols::Usage) {
        self.busy().turn_usage.lock().add(usage);
        self.hourly_spent(usage.total());
        let mut rec = self.lock();
        let (cost, unpriced) = self
            .breakers_lock()
            .record_usage(usage, self.provider.model());
        if usage.is_zero() && cost == 0.0 {
            return; // nothing spent, nothing to journal
        }
        self.emit(
            &mut rec,
            EventKind::UsageRecorded {
                usage,
                cost,
                unpriced,
            },
        );
    }

    /// After an unlock / history reset / resume: the breakers start clean.
    pub(crate) fn breakers_cleared(&self) {
        let mut b = self.breakers_lock();
        b.on_unlock();
        b.restore_consecutive_errors(0);
        drop(b);
        self.safety.cleared(&self.key);
    }

    /// After a restart: the breakers' count follows the record's.
    pub(crate) fn breakers_restore(&self, consecutive_errors: u32) {
        self.breakers_lock()
            .restore_consecutive_errors(consecutive_errors);
    }

    /// The running turn's usage so far, reset to zero (a turn starts, or it finished).
    pub(crate) fn take_turn_usage(&self) -> Usage {
        self.busy_now()
            .map(|b| std::mem::take(&mut *b.turn_usage.lock()))
            .unwrap_or_default()
    }
}
