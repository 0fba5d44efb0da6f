//! [`AgentBreakers`]: one agent's resource and behavioural breakers, a plain synchronous state machine.
//!
//! # Operations
//! One *operation* is one LLM call ([`AgentBreakers::after_llm_call`]) or one tool call
//! ([`AgentBreakers::after_tool_execution`]). Both enter the error-cascade window.
//!
//! # Invariants
//! * No async, no clock, no I/O: the caller passes elapsed time and outcomes; every hook returns a
//!   [`Verdict`] and the caller makes the state transition.
//! * Once a hook has answered [`Verdict::Lockout`], every hook answers the same lockout until
//!   [`AgentBreakers::on_unlock`] (fail closed: a caller that ignores one verdict meets it again).
//! * The near-budget [`Verdict::Warn`] is given at most once per agent (and once per team), and
//!   before any budget stop: a stop that comes first owes it ([`AgentBreakers::take_budget_warning`]).
//! * Consecutive errors: every failed or anomalous operation adds 1. Only a *productive success* — a
//!   tool call that succeeds, or a final answer — resets the count. An LLM call that merely asks for
//!   tools is neutral (it enters the window as a good operation but does not reset the count), so a
//!   model alternating "call tool" / "tool fails" cannot dodge the emergency stop by its LLM
//!   successes; and a run of pure failures trips whichever of `max_consecutive_errors` and
//!   `error_window_threshold` is smaller, exactly at that operation. A true 50 % failure rate (tool
//!   fails, tool succeeds, …) is not a cascade unless `error_window_threshold` ≤ half the window.
//! * Several breakers may trip on the same operation; the verdict is the most severe, in the order
//!   Repetition lockout › ConsecutiveErrors lockout › ErrorCascade lockout › Stuck stop › Alert.

use super::budget::{TeamBudget, TeamCheck, UsageTotals, COST_EPSILON};
use super::fingerprint::Fingerprint;
use std::{collections::VecDeque, sync::Arc, time::Duration};
use warden_protocols::{
    AgentKey, Breaker, LimitKind, LlmOutcome, SafetyConfig, ToolCall, ToolOutcome, Usage,
};

/// The system-level message injected when a failing action is repeated.
pub const REPETITION_ALERT: &str =
    "SYSTEM ALERT: You are repeating a failed action. STOP and analyze why.";

/// What the caller must do after a hook.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Go on.
    Continue,
    /// Go on, and tell the operator (journal / log) — near-budget warning. Given once.
    Warn {
        /// The warning, for the journal and the log.
        message: String,
    },
    /// Go on, after injecting `message` into the context as an internal system message.
    Alert {
        /// The text the model sees (e.g. "You are repeating a failed action").
        message: String,
    },
    /// A checkpointed limit is exceeded: route it through `LimitCheckpoint::handle_limit_exceeded`.
    /// `current` and `configured` are counts, or seconds for the wall clock.
    Limit {
        /// Which limit.
        kind: LimitKind,
        /// The value reached (count, or seconds).
        current: f64,
        /// The limit in force (count, or seconds).
        configured: f64,
    },
    /// Hard stop: make no call, end the turn. A budget stop ([`Breaker::BudgetExceeded`]) moves
    /// `EXECUTING → STOPPED` (a resume or a raised budget lets it go on); any other breaker's stop
    /// (the stuck detector) trips into `SAFETY_LOCKOUT`, as [`Verdict::Lockout`] does.
    Stop {
        /// The breaker that stopped the agent.
        breaker: Breaker,
        /// Why, for the operator (journaled).
        reason: String,
    },
    /// Trip: end the turn, journal `LockedOut`, `EXECUTING → SAFETY_LOCKOUT`.
    Lockout {
        /// The breaker that tripped.
        breaker: Breaker,
        /// Why, for the operator (journaled with the lockout).
        reason: String,
    },
}

impl Verdict {
    /// `true` for `Continue`, `Warn` and `Alert` (the operation may go ahead).
    pub fn proceeds(&self) -> bool {
        matches!(
            self,
            Verdict::Continue | Verdict::Warn { .. } | Verdict::Alert { .. }
        )
    }
}

/// One agent's breakers. Keep it next to the agent (e.g. a `parking_lot::Mutex` in its cell); never
/// hold that lock across an await.
#[derive(Debug)]
pub struct AgentBreakers {
    key: AgentKey,
    /// The model, the config and the team: the same for every agent of a profile (one `Arc`, not
    /// a copy of the model's name and three handles per agent of an idle fleet).
    shared: Arc<BreakersShared>,
    totals: UsageTotals,
    budget_warned: bool,
    consecutive_errors: u32,
    steps: u64,
    /// What the behaviour breakers remember, from the first operation on: boxed, because an agent
    /// that never worked (most of a large idle fleet) should not carry it (~190 bytes).
    patterns: Option<Box<Patterns>>,
}

/// What the breakers of agents calling one model in one team share ([`AgentBreakers::shared`]).
#[derive(Debug)]
pub(crate) struct BreakersShared {
    model: String,
    config: Arc<SafetyConfig>,
    team: Option<Arc<TeamBudget>>,
}

impl BreakersShared {
    /// For agents calling `model`, charging `team` too when given.
    pub(crate) fn new(
        config: Arc<SafetyConfig>,
        model: impl Into<String>,
        team: Option<Arc<TeamBudget>>,
    ) -> Self {
        BreakersShared {
            model: model.into(),
            config,
            team,
        }
    }

    /// Counts agent `key` in the team budget's fleet view (once an agent: [`AgentBreakers::shared`]
    /// does it when it makes the breakers, a spawn that defers them does it itself).
    pub(crate) fn register(&self, key: &AgentKey) {
        if let Some(team) = &self.team {
            team.register(key);
        }
    }
}

/// The behaviour breakers' memory of recent operations (see [`AgentBreakers::patterns`]).
#[derive(Debug, Default)]
struct Patterns {
    /// A near-budget warning owed when a budget stop came first (see
    /// [`AgentBreakers::take_budget_warning`]).
    owed_warning: Option<String>,
    /// The current run of identical failing calls, and whether the alert was given for it.
    failing: Option<(Fingerprint, u32)>,
    alerted: bool,
    /// The current run of identical successful calls.
    succeeding: Option<(Fingerprint, u32)>,
    /// `true` = failed/anomalous operation, newest at the back.
    window: VecDeque<bool>,
    /// The window moved while it held a failure since [`AgentBreakers::take_window_change`] last
    /// looked: the journal must learn its new marks.
    window_moved: bool,
    /// Extensions the limit checkpoint granted, by limit (a few at most: a short list).
    extensions: Vec<(LimitKind, u32)>,
    locked: Option<(Breaker, String)>,
}

/// The patterns, allocated at the first use (a free function so that it borrows only that field).
fn pat(patterns: &mut Option<Box<Patterns>>) -> &mut Patterns {
    patterns.get_or_insert_with(Box::default)
}

impl AgentBreakers {
    /// Breakers for agent `key` calling `model`, charging `team` too when given (and registering the
    /// agent there).
    pub fn new(
        key: AgentKey,
        config: Arc<SafetyConfig>,
        model: impl Into<String>,
        team: Option<Arc<TeamBudget>>,
    ) -> Self {
        Self::shared(key, Arc::new(BreakersShared::new(config, model, team)))
    }

    /// [`AgentBreakers::new`] with the model, config and team of other agents' breakers.
    pub(crate) fn shared(key: AgentKey, shared: Arc<BreakersShared>) -> Self {
        shared.register(&key);
        Self::registered(key, shared)
    }

    /// [`AgentBreakers::shared`] for an agent counted in the team's budget already
    /// ([`BreakersShared::register`]: an agent's breakers made at its first use, not its spawn).
    pub(crate) fn registered(key: AgentKey, shared: Arc<BreakersShared>) -> Self {
        AgentBreakers {
            key,
            shared,
            totals: UsageTotals::default(),
            budget_warned: false,
            consecutive_errors: 0,
            steps: 0,
            patterns: None,
        }
    }

    /// The fingerprint of a model's tool call under this config.
    pub fn fingerprint(&self, call: &ToolCall) -> Fingerprint {
        Fingerprint::of(
            &call.function.name,
            &call.function.arguments,
            self.shared.config.breakers.fingerprint_value_chars as usize,
        )
    }

    // ---- budget -----------------------------------------------------------------------------------

    /// Before each LLM call: would a prompt of about `estimated_prompt_tokens` exceed the agent's or
    /// the team's token or cost budget? `Stop{BudgetExceeded}` means: make no call, `STOPPED`.
    ///
    /// The near-budget warning comes before any budget stop: when a stop is the first this agent
    /// (or, for the team's budget, the team) hears of its budget — one call jumped from below the
    /// reserve band to over the budget, or an estimate did — the warning is owed, and
    /// [`AgentBreakers::take_budget_warning`] gives it, to be journaled before the stop.
    pub fn before_llm_call(&mut self, estimated_prompt_tokens: u64) -> Verdict {
        let mut team_stop = false;
        let verdict = self.check_budgets(estimated_prompt_tokens, &mut team_stop);
        if let Verdict::Stop {
            breaker: Breaker::BudgetExceeded,
            ..
        } = &verdict
        {
            let first = if team_stop {
                self.shared.team.as_ref().is_some_and(|t| t.claim_warning())
            } else {
                !std::mem::replace(&mut self.budget_warned, true)
            };
            if first {
                let b = &self.shared.config.budget;
                let t = &self.totals;
                pat(&mut self.patterns).owed_warning = Some(match (team_stop, &self.shared.team) {
                    (true, Some(team)) => format!(
                        "team budget nearly exhausted: {} of {} tokens, {:.4} of {} cost",
                        team.tokens(),
                        b.tokens_per_team,
                        team.cost(),
                        b.cost_per_team
                    ),
                    _ => format!(
                        "agent {} budget nearly exhausted: {} of {} tokens, {:.4} of {} cost used",
                        self.key,
                        t.tokens(),
                        b.tokens_per_agent,
                        t.cost,
                        b.cost_per_agent
                    ),
                });
            }
        }
        verdict
    }

    /// The near-budget warning owed because a budget stop came before it (once; `None` after).
    /// Journal it before the stop.
    pub fn take_budget_warning(&mut self) -> Option<String> {
        self.patterns.as_mut().and_then(|p| p.owed_warning.take())
    }

    /// What a call of about `prompt_tokens` costs at this agent's model's price, as the budget
    /// check estimates it (0 without a price).
    pub(crate) fn estimated_cost(&self, prompt_tokens: u64) -> f64 {
        self.shared
            .config
            .budget
            .price(&self.shared.model)
            .map_or(0.0, |p| p.cost(prompt_tokens, 0))
    }

    /// The budget checks; `team_stop` is set when the team's budget (not the agent's) stops the call.
    fn check_budgets(&mut self, estimated_prompt_tokens: u64, team_stop: &mut bool) -> Verdict {
        if let Some(v) = self.locked_verdict() {
            return v;
        }
        let b = &self.shared.config.budget;
        let est = estimated_prompt_tokens;
        let used = self.totals.tokens();
        let after = used.saturating_add(est);
        if b.tokens_per_agent > 0 && (used >= b.tokens_per_agent || after > b.tokens_per_agent) {
            return Verdict::Stop {
                breaker: Breaker::BudgetExceeded,
                reason: format!(
                    "token budget exhausted: {used} used + about {est} for this call > {} (safety.budget.tokens_per_agent)",
                    b.tokens_per_agent
                ),
            };
        }
        let est_cost = self.estimated_cost(est);
        let used_cost = self.totals.cost;
        let after_cost = used_cost + est_cost;
        if b.cost_per_agent > 0.0
            && (used_cost >= b.cost_per_agent || after_cost > b.cost_per_agent)
        {
            return Verdict::Stop {
                breaker: Breaker::BudgetExceeded,
                reason: format!(
                    "cost budget exhausted: {used_cost:.4} used + about {est_cost:.4} for this call > {} (safety.budget.cost_per_agent)",
                    b.cost_per_agent
                ),
            };
        }
        let team_warning = match self.shared.team.as_ref().map(|t| t.check(est, est_cost)) {
            Some(TeamCheck::Exceeded(reason)) => {
                *team_stop = true;
                return Verdict::Stop {
                    breaker: Breaker::BudgetExceeded,
                    reason,
                };
            }
            Some(TeamCheck::Warn(message)) => Some(message),
            Some(TeamCheck::Ok) | None => None,
        };
        let near_tokens = b.tokens_per_agent > 0 && b.tokens_per_agent - after <= b.reserve_tokens;
        let near_cost = b.cost_per_agent > 0.0
            && b.cost_per_agent - after_cost
                <= (b.reserve_cost_fraction + COST_EPSILON) * b.cost_per_agent;
        let agent_warning = if (near_tokens || near_cost) && !self.budget_warned {
            self.budget_warned = true;
            Some(format!(
                "agent {} budget nearly exhausted: about {after} of {} tokens, {after_cost:.4} of {} cost after this call",
                self.key, b.tokens_per_agent, b.cost_per_agent
            ))
        } else {
            None
        };
        match (agent_warning, team_warning) {
            (None, None) => Verdict::Continue,
            (Some(m), None) | (None, Some(m)) => Verdict::Warn { message: m },
            (Some(a), Some(t)) => Verdict::Warn {
                message: format!("{a}; {t}"),
            },
        }
    }

    /// After each LLM call that reported (or estimated) usage: accumulate tokens and cost, for the
    /// agent and the team. A model with no price (and no `"*"` price) adds to `unpriced_tokens`.
    /// Returns what the call was charged: `(cost, unpriced)`, for the journal (`UsageRecorded`).
    pub fn record_usage(&mut self, usage: Usage, model: &str) -> (f64, bool) {
        let price = self.shared.config.budget.price(model);
        let cost = price
            .map_or(0.0, |p| {
                p.cost(usage.prompt_tokens, usage.completion_tokens)
            })
            .max(0.0);
        // A price that is not a number charges nothing rather than poisoning the totals.
        let cost = if cost.is_finite() { cost } else { 0.0 };
        let unpriced = price.is_none();
        self.totals.add(usage, cost, unpriced);
        if let Some(team) = &self.shared.team {
            team.record(&self.key, usage.total(), cost);
        }
        (cost, unpriced)
    }

    /// After a restart: the agent's totals are what its journal says it spent (the record's
    /// `usage`), and the team is charged with them again — so a restarted process enforces the same
    /// per-agent and team budgets. Call once, on fresh breakers.
    pub fn restore_usage(&mut self, totals: UsageTotals) {
        self.totals = totals;
        if let Some(team) = &self.shared.team {
            team.record(&self.key, totals.tokens(), totals.cost);
        }
    }

    /// The agent's token and cost totals so far (restored ones included).
    pub fn totals(&self) -> UsageTotals {
        self.totals
    }

    /// Tokens used so far (prompt and completion).
    pub fn tokens_used(&self) -> u64 {
        self.totals.tokens()
    }

    /// Cost so far, in the currency of `safety.budget.prices`.
    pub fn cost_used(&self) -> f64 {
        self.totals.cost
    }

    // ---- behaviour --------------------------------------------------------------------------------

    /// After each LLM call (one operation).
    pub fn after_llm_call(&mut self, outcome: LlmOutcome) -> Verdict {
        if let Some(v) = self.locked_verdict() {
            return v;
        }
        match outcome {
            LlmOutcome::Answer => {
                self.productive_success();
                Verdict::Continue
            }
            LlmOutcome::ToolCalls => {
                self.push_window(false);
                Verdict::Continue
            }
            LlmOutcome::Failed | LlmOutcome::Anomaly(_) => {
                pat(&mut self.patterns).succeeding = None;
                let v = self.count_failure(None);
                self.settle(v)
            }
        }
    }

    /// After each tool call (one operation), with the call's fingerprint.
    pub fn after_tool_execution(
        &mut self,
        fingerprint: Fingerprint,
        outcome: ToolOutcome,
    ) -> Verdict {
        if let Some(v) = self.locked_verdict() {
            return v;
        }
        match outcome {
            ToolOutcome::Ok => {
                self.productive_success();
                let succeeding = &mut pat(&mut self.patterns).succeeding;
                let n = match *succeeding {
                    Some((fp, n)) if fp == fingerprint => n.saturating_add(1),
                    _ => 1,
                };
                *succeeding = Some((fingerprint, n));
                let max = self.shared.config.breakers.max_repeated_tool_steps;
                if n >= max {
                    return Verdict::Stop {
                        breaker: Breaker::Stuck,
                        reason: format!(
                            "stuck: the same tool call repeated {n} times in a row (safety.breakers.max_repeated_tool_steps = {max})"
                        ),
                    };
                }
                Verdict::Continue
            }
            ToolOutcome::Failed | ToolOutcome::Anomaly(_) => {
                pat(&mut self.patterns).succeeding = None;
                let v = self.count_failure(Some(fingerprint));
                self.settle(v)
            }
        }
    }

    fn productive_success(&mut self) {
        self.consecutive_errors = 0;
        let p = pat(&mut self.patterns);
        p.failing = None;
        p.alerted = false;
        self.push_window(false);
    }

    fn push_window(&mut self, bad: bool) {
        let size = self.shared.config.breakers.error_window.max(1) as usize;
        let p = pat(&mut self.patterns);
        // A window of good operations only is not journaled (nothing to restore from it).
        p.window_moved |= bad || p.window.contains(&true);
        while p.window.len() >= size {
            p.window.pop_front();
        }
        p.window.push_back(bad);
    }

    /// The error-cascade window's marks (`x` failed, `.` good, oldest first; empty when no failure
    /// is in it) if it moved while it held a failure since the last call, for the journal
    /// (`ErrorWindow`); `None` when there is nothing new to journal.
    pub fn take_window_change(&mut self) -> Option<String> {
        let p = self.patterns.as_deref_mut()?;
        if !std::mem::take(&mut p.window_moved) {
            return None;
        }
        if !p.window.contains(&true) {
            return Some(String::new());
        }
        Some(
            p.window
                .iter()
                .map(|&bad| if bad { 'x' } else { '.' })
                .collect(),
        )
    }

    /// Seeds the error-cascade window from the journaled record's marks after a restart (see
    /// [`AgentBreakers::take_window_change`]); the newest `error_window` of them are kept.
    pub fn restore_error_window(&mut self, marks: &str) {
        if marks.is_empty() {
            return;
        }
        let size = self.shared.config.breakers.error_window.max(1) as usize;
        let window = &mut pat(&mut self.patterns).window;
        window.clear();
        window.extend(marks.chars().map(|c| c == 'x'));
        while window.len() > size {
            window.pop_front();
        }
    }

    /// Counts one failed operation; `fingerprint` for tool calls. Returns the most severe verdict.
    fn count_failure(&mut self, fingerprint: Option<Fingerprint>) -> Verdict {
        self.consecutive_errors = self.consecutive_errors.saturating_add(1);
        self.push_window(true);
        let cfg = &self.shared.config.breakers;

        let mut alert = None;
        if let Some(fp) = fingerprint {
            let p = pat(&mut self.patterns);
            let n = match p.failing {
                Some((last, n)) if last == fp => n.saturating_add(1),
                _ => {
                    p.alerted = false;
                    1
                }
            };
            p.failing = Some((fp, n));
            if p.alerted {
                return Verdict::Lockout {
                    breaker: Breaker::Repetition,
                    reason: format!(
                        "repeated a failed action after the system alert ({n} identical failures in a row)"
                    ),
                };
            }
            if n >= cfg.repeated_failure_threshold {
                p.alerted = true;
                alert = Some(Verdict::Alert {
                    message: REPETITION_ALERT.to_owned(),
                });
            }
        }
        // An LLM failure leaves the run of identical tool failures as it is.

        let n = self.consecutive_errors;
        if n >= cfg.max_consecutive_errors.get() {
            return Verdict::Lockout {
                breaker: Breaker::ConsecutiveErrors,
                reason: format!("Maximum consecutive errors reached ({n})"),
            };
        }
        let window = &pat(&mut self.patterns).window;
        let bad = window.iter().filter(|&&b| b).count();
        if bad >= cfg.error_window_threshold as usize {
            return Verdict::Lockout {
                breaker: Breaker::ErrorCascade,
                reason: format!(
                    "error cascade: {bad} failed operations in the last {} (safety.breakers.error_window_threshold = {}, error_window = {})",
                    window.len(),
                    cfg.error_window_threshold,
                    cfg.error_window
                ),
            };
        }
        alert.unwrap_or(Verdict::Continue)
    }

    /// Makes a lockout sticky and visible in the fleet view.
    fn settle(&mut self, verdict: Verdict) -> Verdict {
        if let Verdict::Lockout { breaker, reason } = &verdict {
            pat(&mut self.patterns).locked = Some((*breaker, reason.clone()));
            if let Some(team) = &self.shared.team {
                team.set_locked_out(&self.key, true);
            }
        }
        verdict
    }

    fn locked(&self) -> Option<&(Breaker, String)> {
        self.patterns.as_ref().and_then(|p| p.locked.as_ref())
    }

    fn locked_verdict(&self) -> Option<Verdict> {
        self.locked().map(|(breaker, reason)| Verdict::Lockout {
            breaker: *breaker,
            reason: reason.clone(),
        })
    }

    /// The lockout in force, if any.
    pub fn lockout(&self) -> Option<(Breaker, &str)> {
        self.locked().map(|(b, r)| (*b, r.as_str()))
    }

    /// Failed or anomalous operations since the last productive success (a tool call that
    /// succeeded, or a final answer), an unlock or a history reset;
    /// `safety.breakers.max_consecutive_errors` of them lock the agent out.
    pub fn consecutive_errors(&self) -> u32 {
        self.consecutive_errors
    }

    /// Seeds the consecutive-error count (e.g. from the journaled record after a restart).
    pub fn restore_consecutive_errors(&mut self, n: u32) {
        self.consecutive_errors = n;
    }

    /// After an operator's unlock (or resume, or history reset): clears the lockout and all
    /// behavioural state (counts, runs, window, alert). Budgets, totals, steps and the one-time
    /// budget warning are kept.
    pub fn on_unlock(&mut self) {
        self.consecutive_errors = 0;
        if let Some(p) = self.patterns.as_deref_mut() {
            p.locked = None;
            p.failing = None;
            p.alerted = false;
            p.succeeding = None;
            p.window.clear();
            // The journal clears its copy with the unlock, reset or resume itself.
            p.window_moved = false;
        }
        if let Some(team) = &self.shared.team {
            team.set_locked_out(&self.key, false);
        }
    }

    // ---- loop limits ------------------------------------------------------------------------------

    /// A new task (user event or delegated task) begins: task-scoped extensions (iterations per
    /// task, task wall clock) are dropped.
    pub fn begin_task(&mut self) {
        let Some(p) = self.patterns.as_deref_mut() else {
            return; // nothing to forget
        };
        p.extensions
            .retain(|(k, _)| !matches!(k, LimitKind::IterationsPerTask | LimitKind::TaskWallClock));
        // Repetition and stuck detection look within one task: the same successful call in a new
        // task (a player asking the same thing twice) is not a loop. The error window and the
        // consecutive count run on across tasks.
        p.failing = None;
        p.alerted = false;
        p.succeeding = None;
    }

    /// After the limit checkpoint allowed `kind`: its limit grows by one configured amount.
    pub fn extend(&mut self, kind: LimitKind) {
        let extensions = &mut pat(&mut self.patterns).extensions;
        match extensions.iter_mut().find(|(k, _)| *k == kind) {
            Some((_, n)) => *n = n.saturating_add(1),
            None => extensions.push((kind, 1)),
        }
    }

    /// The limit in force for `kind` (configured × (1 + extensions)); `None` if off or not owned
    /// here (only iterations per task, steps and task wall clock are).
    pub fn effective_limit(&self, kind: LimitKind) -> Option<f64> {
        let base = match kind {
            LimitKind::IterationsPerTask => {
                f64::from(self.shared.config.loop_.max_iterations_per_task)
            }
            LimitKind::Steps => self.shared.config.loop_.max_steps as f64,
            LimitKind::TaskWallClock => self.shared.config.timeout.task_seconds,
            _ => return None,
        };
        if base <= 0.0 {
            return None;
        }
        let ext = self
            .patterns
            .as_ref()
            .and_then(|p| p.extensions.iter().find(|(k, _)| *k == kind))
            .map_or(0, |(_, n)| *n);
        Some(base * (1.0 + f64::from(ext)))
    }

    /// At the start of each loop iteration: `iteration_in_task` is 1-based, `elapsed` is the task's
    /// wall clock so far. Checks, in order, iterations per task, steps and task wall clock; the first
    /// exceeded gives `Limit` (nothing is counted). Otherwise the step is counted and `Continue`.
    pub fn on_loop_start(&mut self, iteration_in_task: u32, elapsed: Duration) -> Verdict {
        if let Some(v) = self.locked_verdict() {
            return v;
        }
        let checks = [
            (LimitKind::IterationsPerTask, f64::from(iteration_in_task)),
            (LimitKind::Steps, self.steps.saturating_add(1) as f64),
            (LimitKind::TaskWallClock, elapsed.as_secs_f64()),
        ];
        for (kind, current) in checks {
            if let Some(limit) = self.effective_limit(kind) {
                if current > limit {
                    return Verdict::Limit {
                        kind,
                        current,
                        configured: limit,
                    };
                }
            }
        }
        self.steps = self.steps.saturating_add(1);
        Verdict::Continue
    }

    /// Loop iterations counted so far (all tasks).
    pub fn steps(&self) -> u64 {
        self.steps
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::num::NonZeroU32;
    use warden_protocols::{AnomalyKind, ModelPrice, SafetyBudgetConfig};

    fn config() -> SafetyConfig {
        SafetyConfig::default()
    }

    fn breakers(config: &SafetyConfig) -> AgentBreakers {
        AgentBreakers::new("a".into(), Arc::new(config.clone()), "m", None)
    }

    fn fp(n: u64) -> Fingerprint {
        Fingerprint(n)
    }

    fn is_lockout(v: &Verdict, b: Breaker) -> bool {
        matches!(v, Verdict::Lockout { breaker, .. } if *breaker == b)
    }

    #[test]
    fn token_budget_stops_before_the_call_that_would_exceed_it_and_warns_once() {
        let mut c = config();
        c.budget.tokens_per_agent = 2000;
        c.budget.reserve_tokens = 512;
        let mut b = breakers(&c);
        assert_eq!(b.before_llm_call(1000), Verdict::Continue);
        b.record_usage(usage(1000, 200), "m");
        // 1200 used + 300 = 1500 → 500 left ≤ 512: warn, once.
        assert!(matches!(b.before_llm_call(300), Verdict::Warn { .. }));
        assert_eq!(b.before_llm_call(300), Verdict::Continue);
        assert_eq!(
            b.before_llm_call(800),
            Verdict::Continue,
            "exactly at the limit fits"
        );
        let v = b.before_llm_call(801);
        assert_eq!(
            v,
            Verdict::Stop {
                breaker: Breaker::BudgetExceeded,
                reason: "token budget exhausted: 1200 used + about 801 for this call > 2000 (safety.budget.tokens_per_agent)".into()
            }
        );
        b.record_usage(usage(800, 0), "m");
        assert!(
            matches!(b.before_llm_call(0), Verdict::Stop { .. }),
            "used up"
        );
        assert_eq!(b.tokens_used(), 2000);
    }

    fn usage(p: u64, c: u64) -> Usage {
        Usage {
            prompt_tokens: p,
            completion_tokens: c,
            estimated: false,
        }
    }

    #[test]
    fn cost_budget_uses_the_price_table_and_counts_unpriced_tokens() {
        let mut c = config();
        c.budget = SafetyBudgetConfig {
            tokens_per_agent: 0,
            cost_per_agent: 1.0,
            reserve_cost_fraction: 0.1,
            ..SafetyBudgetConfig::default()
        };
        c.budget.prices.insert(
            "m".into(),
            ModelPrice {
                prompt_per_1k: 0.1,
                completion_per_1k: 0.2,
            },
        );
        let mut b = breakers(&c);
        b.record_usage(usage(5000, 1000), "m"); // 0.5 + 0.2
        assert!((b.cost_used() - 0.7).abs() < 1e-12);
        b.record_usage(usage(100, 100), "unknown");
        assert_eq!(b.totals().unpriced_tokens, 200);
        assert!((b.cost_used() - 0.7).abs() < 1e-12);
        // 0.7 + 2000 prompt tokens × 0.1/1k = 0.9 → 0.1 left ≤ 0.1 × 1.0: warn once.
        let v = b.before_llm_call(2000);
        assert!(matches!(v, Verdict::Warn { .. }), "{v:?}");
        assert_eq!(b.before_llm_call(1000), Verdict::Continue);
        assert!(matches!(
            b.before_llm_call(3001),
            Verdict::Stop {
                breaker: Breaker::BudgetExceeded,
                ..
            }
        ));
    }

    #[test]
    fn the_team_budget_stops_every_agent_and_is_charged_by_each() {
        let mut c = config();
        c.budget.tokens_per_team = 1000;
        let team = Arc::new(TeamBudget::new(&c.budget));
        let mut a = AgentBreakers::new("a".into(), Arc::new(c.clone()), "m", Some(team.clone()));
        let mut b = AgentBreakers::new("b".into(), Arc::new(c.clone()), "m", Some(team.clone()));
        a.record_usage(usage(300, 100), "m");
        b.record_usage(usage(300, 100), "m");
        assert_eq!(team.tokens(), 800);
        assert!(matches!(a.before_llm_call(200), Verdict::Warn { .. }));
        assert_eq!(b.before_llm_call(200), Verdict::Continue, "team warns once");
        assert!(matches!(
            b.before_llm_call(201),
            Verdict::Stop {
                breaker: Breaker::BudgetExceeded,
                ..
            }
        ));
        assert_eq!(team.fleet_view().agents_total, 2);
    }

    #[test]
    fn a_budget_stop_that_comes_first_owes_the_warning_once() {
        let mut c = config();
        c.budget.tokens_per_team = 1000;
        let team = Arc::new(TeamBudget::new(&c.budget));
        let mut a = AgentBreakers::new("a".into(), Arc::new(c.clone()), "m", Some(team.clone()));
        let mut b = AgentBreakers::new("b".into(), Arc::new(c.clone()), "m", Some(team.clone()));
        assert_eq!(a.before_llm_call(10), Verdict::Continue);
        a.record_usage(usage(1000, 200), "m"); // from far below the band to over the budget
        assert!(matches!(b.before_llm_call(10), Verdict::Stop { .. }));
        assert_eq!(
            b.take_budget_warning().as_deref(),
            Some("team budget nearly exhausted: 1200 of 1000 tokens, 0.0000 of 0 cost")
        );
        assert_eq!(b.take_budget_warning(), None);
        assert!(matches!(a.before_llm_call(10), Verdict::Stop { .. }));
        assert_eq!(a.take_budget_warning(), None, "the team warns once");
    }

    #[test]
    fn three_identical_failures_alert_and_the_fourth_locks_out() {
        let mut b = breakers(&config());
        assert_eq!(
            b.after_tool_execution(fp(1), ToolOutcome::Failed),
            Verdict::Continue
        );
        assert_eq!(
            b.after_tool_execution(fp(1), ToolOutcome::Failed),
            Verdict::Continue
        );
        assert_eq!(
            b.after_tool_execution(fp(1), ToolOutcome::Failed),
            Verdict::Alert {
                message: REPETITION_ALERT.into()
            }
        );
        let v = b.after_tool_execution(fp(1), ToolOutcome::Failed);
        assert_eq!(
            v,
            Verdict::Lockout {
                breaker: Breaker::Repetition,
                reason: "repeated a failed action after the system alert (4 identical failures in a row)".into()
            }
        );
        // Sticky until unlocked.
        assert_eq!(b.after_tool_execution(fp(2), ToolOutcome::Ok), v);
        assert_eq!(b.before_llm_call(1), v);
        assert_eq!(b.on_loop_start(1, Duration::ZERO), v);
        b.on_unlock();
        assert_eq!(b.lockout(), None);
        assert_eq!(
            b.after_tool_execution(fp(1), ToolOutcome::Failed),
            Verdict::Continue
        );
    }

    #[test]
    fn a_different_fingerprint_or_a_success_resets_the_repetition_run() {
        let mut c = config();
        c.breakers.max_consecutive_errors = NonZeroU32::new(100).unwrap();
        c.breakers.error_window_threshold = 10;
        let mut b = breakers(&c);
        b.after_tool_execution(fp(1), ToolOutcome::Failed);
        b.after_tool_execution(fp(1), ToolOutcome::Failed);
        assert_eq!(
            b.after_tool_execution(fp(2), ToolOutcome::Failed),
            Verdict::Continue
        );
        b.after_tool_execution(fp(1), ToolOutcome::Failed);
        b.after_tool_execution(fp(1), ToolOutcome::Failed);
        assert_eq!(
            b.after_tool_execution(fp(9), ToolOutcome::Ok),
            Verdict::Continue
        );
        b.after_tool_execution(fp(1), ToolOutcome::Anomaly(AnomalyKind::BadArguments));
        b.after_tool_execution(fp(1), ToolOutcome::Failed);
        assert!(matches!(
            b.after_tool_execution(fp(1), ToolOutcome::Failed),
            Verdict::Alert { .. }
        ));
        // After an alert, a different failure starts a new run (no lockout).
        assert_eq!(
            b.after_tool_execution(fp(3), ToolOutcome::Failed),
            Verdict::Continue
        );
    }

    #[test]
    fn identical_successful_steps_stop_as_stuck_exactly_at_the_threshold() {
        let mut b = breakers(&config());
        assert_eq!(
            b.after_tool_execution(fp(5), ToolOutcome::Ok),
            Verdict::Continue
        );
        assert_eq!(
            b.after_tool_execution(fp(5), ToolOutcome::Ok),
            Verdict::Continue
        );
        assert_eq!(
            b.after_tool_execution(fp(5), ToolOutcome::Ok),
            Verdict::Stop {
                breaker: Breaker::Stuck,
                reason: "stuck: the same tool call repeated 3 times in a row (safety.breakers.max_repeated_tool_steps = 3)".into()
            }
        );
        let mut b = breakers(&config());
        b.after_tool_execution(fp(5), ToolOutcome::Ok);
        b.after_tool_execution(fp(5), ToolOutcome::Ok);
        b.after_tool_execution(fp(6), ToolOutcome::Ok);
        assert_eq!(
            b.after_tool_execution(fp(5), ToolOutcome::Ok),
            Verdict::Continue
        );
        b.after_tool_execution(fp(5), ToolOutcome::Failed);
        assert_eq!(
            b.after_tool_execution(fp(5), ToolOutcome::Ok),
            Verdict::Continue
        );
    }

    /// Pure failure run, defaults (consecutive 5, window 8/10): the consecutive stop trips at the 5th
    /// failure, not the 4th.
    #[test]
    fn a_pure_failure_run_trips_the_consecutive_stop_exactly_at_its_threshold() {
        let mut b = breakers(&config());
        for i in 1..=4 {
            assert_eq!(
                b.after_tool_execution(fp(i), ToolOutcome::Failed),
                Verdict::Continue,
                "op {i}"
            );
        }
        assert_eq!(
            b.after_tool_execution(fp(5), ToolOutcome::Failed),
            Verdict::Lockout {
                breaker: Breaker::ConsecutiveErrors,
                reason: "Maximum consecutive errors reached (5)".into()
            }
        );
    }

    /// Pure failure run with the consecutive stop set high: the cascade trips at the 8th operation.
    #[test]
    fn a_pure_failure_run_trips_the_cascade_exactly_at_its_threshold() {
        let mut c = config();
        c.breakers.max_consecutive_errors = NonZeroU32::new(100).unwrap();
        let mut b = breakers(&c);
        for i in 1..=7 {
            let v = if i % 2 == 0 {
                b.after_llm_call(LlmOutcome::Failed)
            } else {
                b.after_tool_execution(fp(i), ToolOutcome::Anomaly(AnomalyKind::UnknownTool))
            };
            assert_eq!(v, Verdict::Continue, "op {i}");
        }
        assert_eq!(
            b.after_llm_call(LlmOutcome::Anomaly(AnomalyKind::InvalidJson)),
            Verdict::Lockout {
                breaker: Breaker::ErrorCascade,
                reason: "error cascade: 8 failed operations in the last 8 (safety.breakers.error_window_threshold = 8, error_window = 10)".into()
            }
        );
    }

    /// "Call tool" (LLM ok) / "tool fails", alternating: half the window is good, so the cascade never
    /// trips, but the LLM successes do not reset the consecutive count: it trips at the 5th failure.
    #[test]
    fn llm_successes_between_failures_cannot_dodge_the_consecutive_stop() {
        let mut b = breakers(&config());
        for i in 1..=4 {
            assert_eq!(b.after_llm_call(LlmOutcome::ToolCalls), Verdict::Continue);
            assert_eq!(
                b.after_tool_execution(fp(i), ToolOutcome::Failed),
                Verdict::Continue,
                "failure {i}"
            );
        }
        assert_eq!(b.after_llm_call(LlmOutcome::ToolCalls), Verdict::Continue);
        assert!(is_lockout(
            &b.after_tool_execution(fp(5), ToolOutcome::Failed),
            Breaker::ConsecutiveErrors
        ));
    }

    /// Tool fails / tool succeeds, alternating: every success resets the consecutive count, so only
    /// the window can see it. With a threshold of 5 in 10 it trips at the 5th failure (operation 9),
    /// not before; with the default 8 in 10 a 50 % rate never trips.
    #[test]
    fn alternating_failures_and_successes_trip_the_window_exactly_at_its_threshold() {
        let mut c = config();
        c.breakers.error_window_threshold = 5;
        let mut b = breakers(&c);
        for op in 1..=8u64 {
            let outcome = if op % 2 == 1 {
                ToolOutcome::Failed
            } else {
                ToolOutcome::Ok
            };
            assert_eq!(
                b.after_tool_execution(fp(op), outcome),
                Verdict::Continue,
                "op {op}"
            );
        }
        assert!(is_lockout(
            &b.after_tool_execution(fp(9), ToolOutcome::Failed),
            Breaker::ErrorCascade
        ));

        let mut b = breakers(&config());
        for op in 1..=100u64 {
            let outcome = if op % 2 == 1 {
                ToolOutcome::Failed
            } else {
                ToolOutcome::Ok
            };
            assert_eq!(
                b.after_tool_execution(fp(op), outcome),
                Verdict::Continue,
                "op {op}"
            );
        }
    }

    #[test]
    fn loop_limits_give_limit_verdicts_and_extend_by_one_configured_amount() {
        let mut c = config();
        c.loop_.max_iterations_per_task = 2;
        c.loop_.max_steps = 5;
        c.timeout.task_seconds = 10.0;
        let mut b = breakers(&c);
        assert_eq!(b.on_loop_start(1, Duration::ZERO), Verdict::Continue);
        assert_eq!(
            b.on_loop_start(2, Duration::from_secs(10)),
            Verdict::Continue
        );
        assert_eq!(
            b.on_loop_start(3, Duration::ZERO),
            Verdict::Limit {
                kind: LimitKind::IterationsPerTask,
                current: 3.0,
                configured: 2.0
            }
        );
        assert_eq!(b.steps(), 2, "a refused start is not counted");
        b.extend(LimitKind::IterationsPerTask);
        assert_eq!(b.effective_limit(LimitKind::IterationsPerTask), Some(4.0));
        assert_eq!(b.on_loop_start(3, Duration::ZERO), Verdict::Continue);
        assert_eq!(
            b.on_loop_start(4, Duration::from_millis(10_001)),
            Verdict::Limit {
                kind: LimitKind::TaskWallClock,
                current: 10.001,
                configured: 10.0
            }
        );
        b.begin_task();
        assert_eq!(b.effective_limit(LimitKind::IterationsPerTask), Some(2.0));
        assert_eq!(b.on_loop_start(1, Duration::ZERO), Verdict::Continue);
        assert_eq!(b.on_loop_start(2, Duration::ZERO), Verdict::Continue);
        assert_eq!(
            b.on_loop_start(1, Duration::ZERO),
            Verdict::Limit {
                kind: LimitKind::Steps,
                current: 6.0,
                configured: 5.0
            }
        );
        let mut off = config();
        off.loop_.max_steps = 0;
        let b = breakers(&off);
        assert_eq!(b.effective_limit(LimitKind::Steps), None);
        assert_eq!(b.effective_limit(LimitKind::TaskWallClock), None);
        assert_eq!(b.effective_limit(LimitKind::AgentHops), None);
    }

    #[derive(Debug, Clone)]
    enum Op {
        LlmToolCalls,
        LlmFailed,
        ToolFailed(u64),
        ToolAnomaly(u64),
    }

    fn arb_failure_run() -> impl Strategy<Value = Vec<Op>> {
        prop::collection::vec(
            prop_oneof![
                Just(Op::LlmToolCalls),
                Just(Op::LlmFailed),
                (0u64..4).prop_map(Op::ToolFailed),
                (0u64..4).prop_map(Op::ToolAnomaly),
            ],
            1..60,
        )
    }

    proptest! {
        /// With no productive success, the agent is locked out by the `max_consecutive_errors`-th
        /// failure at the latest, whatever the mix of failures, anomalies and neutral LLM calls.
        #[test]
        fn no_unbroken_failure_run_slips_past_the_breakers(ops in arb_failure_run(), max in 1u32..8) {
            let mut c = config();
            c.breakers.max_consecutive_errors = NonZeroU32::new(max).unwrap();
            let mut b = breakers(&c);
            let mut failures = 0;
            let mut locked = false;
            for op in ops {
                let v = match op {
                    Op::LlmToolCalls => b.after_llm_call(LlmOutcome::ToolCalls),
                    Op::LlmFailed => { failures += 1; b.after_llm_call(LlmOutcome::Failed) }
                    Op::ToolFailed(f) => { failures += 1; b.after_tool_execution(fp(f), ToolOutcome::Failed) }
                    Op::ToolAnomaly(f) => {
                        failures += 1;
                        b.after_tool_execution(fp(f), ToolOutcome::Anomaly(AnomalyKind::InvalidJson))
                    }
                };
                if matches!(v, Verdict::Lockout { .. }) { locked = true; break; }
                prop_assert!(failures < max, "{failures} failures without a lockout");
            }
            prop_assert!(locked || failures < max);
        }
    }
}
