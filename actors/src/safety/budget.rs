//! The team budget: tokens and cost shared by every agent of a supervisor, and the fleet view.
//!
//! # Invariants
//! * Thread-safe: totals and the agent count are atomics; the set of locked-out agents is behind one
//!   `parking_lot` mutex that is never held across an await or while calling out. Per-agent spending
//!   is not kept here (each agent's breakers and record have it): a table of every agent cost a
//!   million-agent fleet ~60 bytes an agent and a tree insert under one lock per spawn.
//! * The check before an LLM call and the accounting after it are separate steps, so agents running
//!   concurrently may each pass the check and together overshoot the team budget by at most one call
//!   per agent. After that every agent is stopped at its next check.
//! * The near-budget warning for the team is given once (to whichever agent sees it first).
//! * Cost is kept in integer nano-units (1e-9 of the price currency) so that it can be an atomic.

use futures::future::BoxFuture;
use parking_lot::Mutex;
use std::{
    collections::BTreeSet,
    sync::{
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
        Arc, OnceLock,
    },
};
use warden_protocols::{AgentKey, FleetView, SafetyBudgetConfig};

const NANOS: f64 = 1e9;

fn to_nanos(cost: f64) -> u64 {
    if cost.is_finite() && cost > 0.0 {
        (cost * NANOS).round() as u64 // saturates
    } else {
        0
    }
}

/// Token and cost totals of one agent (kept in its record too, so a restart keeps them).
pub use warden_protocols::UsageTotals;

/// Relative slack in cost comparisons for the near-budget warning, so that float rounding of prices
/// cannot skip it (e.g. 0.7 + 0.2 = 0.8999999999999999). Used by the agent's breakers too.
pub(crate) const COST_EPSILON: f64 = 1e-9;

/// Why a team budget check failed, or a warning.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum TeamCheck {
    Ok,
    Warn(String),
    Exceeded(String),
}

/// Which team budget a slice is of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SliceOf {
    /// `safety.budget.tokens_per_team`, in tokens.
    Tokens,
    /// `safety.budget.cost_per_team`, in nano-units (1e-9 of the price currency), so that a
    /// slice is an integer like a token slice.
    Cost,
}

/// Where a node of a cluster claims slices of team budgets shared by several nodes
/// (`warden::cluster`): with it, the team's token and cost limits are what this node holds, and a
/// model call that would spend past either waits for [`BudgetSlices::claim`] first.
pub trait BudgetSlices: Send + Sync + 'static {
    /// Claims one more slice of `of` for this node (by compare-and-swap on the shared total).
    /// Resolves with what was granted (tokens, or cost in nano-units): 0 when that budget has no
    /// slice left, or the claim failed (the call is then stopped by the budget, as on one node).
    /// Bounded by the implementation.
    fn claim(&self, of: SliceOf) -> BoxFuture<'static, u64>;
}

impl std::fmt::Debug for dyn BudgetSlices {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BudgetSlices")
    }
}

/// Tokens and cost of the whole team. Share it with `Arc`.
#[derive(Debug)]
pub struct TeamBudget {
    token_limit: u64,
    cost_limit: f64,
    reserve_tokens: u64,
    reserve_cost_fraction: f64,
    tokens: AtomicU64,
    cost_nanos: AtomicU64,
    warned: AtomicBool,
    /// Agents registered (spawned), for the fleet view.
    agents: AtomicUsize,
    /// The agents locked out now, in key order.
    locked_out: Mutex<BTreeSet<AgentKey>>,
    /// With slices (a cluster): the tokens and the cost (nano-units) this node holds (claimed
    /// slices); each limit is the smaller of what is held and the configured one.
    slices: OnceLock<Arc<dyn BudgetSlices>>,
    held: AtomicU64,
    held_cost_nanos: AtomicU64,
    /// One claim at a time (agents waiting for a slice share it).
    claiming: tokio::sync::Mutex<()>,
}

impl TeamBudget {
    /// A team budget with `safety.budget.tokens_per_team` / `cost_per_team` (0 = off).
    pub fn new(config: &SafetyBudgetConfig) -> Self {
        TeamBudget {
            token_limit: config.tokens_per_team,
            cost_limit: config.cost_per_team,
            reserve_tokens: config.reserve_tokens,
            reserve_cost_fraction: config.reserve_cost_fraction,
            tokens: AtomicU64::new(0),
            cost_nanos: AtomicU64::new(0),
            warned: AtomicBool::new(false),
            agents: AtomicUsize::new(0),
            locked_out: Mutex::new(BTreeSet::new()),
            slices: OnceLock::new(),
            held: AtomicU64::new(0),
            held_cost_nanos: AtomicU64::new(0),
            claiming: tokio::sync::Mutex::new(()),
        }
    }

    /// Shares the team budgets (`tokens_per_team`, `cost_per_team`, those that are set) with other
    /// nodes: from now on this team may spend only what it holds — `held_tokens` and `held_cost`
    /// (what it claimed before a restart) and the slices it claims through `slices`
    /// ([`BudgetSlices`]). Once; `false` (ignored) when set already or when neither budget is set.
    pub fn set_slices(
        &self,
        slices: Arc<dyn BudgetSlices>,
        held_tokens: u64,
        held_cost: f64,
    ) -> bool {
        if (self.token_limit == 0 && !self.has_cost_limit()) || self.slices.set(slices).is_err() {
            return false;
        }
        self.held.store(held_tokens, Ordering::Release);
        self.held_cost_nanos
            .store(to_nanos(held_cost), Ordering::Release);
        true
    }

    fn has_cost_limit(&self) -> bool {
        to_nanos(self.cost_limit) > 0
    }

    /// Whether the budgets are shared through slices (a cluster with a team budget).
    pub fn shared(&self) -> bool {
        self.slices.get().is_some()
    }

    /// With a shared token budget: the tokens this node holds (`None` without).
    pub fn held(&self) -> Option<u64> {
        (self.shared() && self.token_limit > 0).then(|| self.held.load(Ordering::Acquire))
    }

    /// With a shared cost budget: the cost this node holds (`None` without).
    pub fn held_cost(&self) -> Option<f64> {
        (self.shared() && self.has_cost_limit())
            .then(|| self.held_cost_nanos.load(Ordering::Acquire) as f64 / NANOS)
    }

    /// With slices: claims slices until a call of about `tokens` more tokens and `cost` more
    /// cost fits what this node holds of each shared budget, or a claim grants nothing (the
    /// budget check then stops the call). At once without slices, or when it fits already.
    pub(crate) async fn cover(&self, tokens: u64, cost: f64) -> bool {
        let Some(slices) = self.slices.get() else {
            return true;
        };
        let cost = to_nanos(cost);
        let fits = |of: SliceOf| match of {
            SliceOf::Tokens => {
                self.token_limit == 0
                    || self.tokens().saturating_add(tokens) <= self.held.load(Ordering::Acquire)
            }
            SliceOf::Cost => {
                !self.has_cost_limit()
                    || self.cost_nanos.load(Ordering::Acquire).saturating_add(cost)
                        <= self.held_cost_nanos.load(Ordering::Acquire)
            }
        };
        if fits(SliceOf::Tokens) && fits(SliceOf::Cost) {
            return true;
        }
        let _one = self.claiming.lock().await;
        for of in [SliceOf::Tokens, SliceOf::Cost] {
            let held = match of {
                SliceOf::Tokens => &self.held,
                SliceOf::Cost => &self.held_cost_nanos,
            };
            while !fits(of) {
                let granted = slices.claim(of).await;
                if granted == 0 {
                    return false;
                }
                held.fetch_add(granted, Ordering::AcqRel);
            }
        }
        true
    }

    /// Counts an agent in the fleet (once per agent: `AgentBreakers::new` does it).
    pub fn register(&self, _agent: &AgentKey) {
        self.agents.fetch_add(1, Ordering::AcqRel);
    }

    /// Removes an agent from the fleet view (its spending stays in the totals). Once for each
    /// [`TeamBudget::register`].
    pub fn deregister(&self, agent: &AgentKey) {
        let _ = self
            .agents
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
        self.locked_out.lock().remove(agent);
    }

    /// Takes back a [`TeamBudget::register`] of an agent that never joined (a spawn that lost a
    /// race for its key to another agent, whose place in the view stays as it is).
    pub(crate) fn register_undone(&self) {
        let _ = self
            .agents
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
    }

    /// Marks an agent locked out (or not) in the fleet view.
    pub fn set_locked_out(&self, agent: &AgentKey, locked_out: bool) {
        let mut set = self.locked_out.lock();
        if locked_out {
            set.insert(agent.clone());
        } else {
            set.remove(agent);
        }
    }

    /// Adds one call's tokens and cost.
    pub fn record(&self, _agent: &AgentKey, tokens: u64, cost: f64) {
        let nanos = to_nanos(cost);
        let _ = self
            .tokens
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| {
                Some(t.saturating_add(tokens))
            });
        let _ = self
            .cost_nanos
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| {
                Some(c.saturating_add(nanos))
            });
    }

    /// Tokens the whole team used so far.
    pub fn tokens(&self) -> u64 {
        self.tokens.load(Ordering::Acquire)
    }

    /// Cost the whole team incurred so far, in the currency of `safety.budget.prices` (kept to
    /// 1e-9 of it).
    pub fn cost(&self) -> f64 {
        self.cost_nanos.load(Ordering::Acquire) as f64 / NANOS
    }

    /// Whether a call of about `tokens` more tokens and `cost` more cost fits the team budget.
    pub(crate) fn check(&self, tokens: u64, cost: f64) -> TeamCheck {
        let used = self.tokens();
        let after = used.saturating_add(tokens);
        if let Some(held) = self.held().filter(|&h| h < self.token_limit && after > h) {
            return TeamCheck::Exceeded(format!(
                "team token budget exhausted: {used} used + about {tokens} for this call > {held} held by this node (no slice of safety.budget.tokens_per_team = {} left to claim)",
                self.token_limit
            ));
        }
        if self.token_limit > 0 && after > self.token_limit {
            return TeamCheck::Exceeded(format!(
                "team token budget exhausted: {used} used + about {tokens} for this call > {} (safety.budget.tokens_per_team)",
                self.token_limit
            ));
        }
        let used_cost = self.cost();
        let after_cost = used_cost + cost;
        let held_cost = self
            .held_cost()
            .map(|_| self.held_cost_nanos.load(Ordering::Acquire));
        if let Some(held) = held_cost.filter(|&held| {
            let after = self
                .cost_nanos
                .load(Ordering::Acquire)
                .saturating_add(to_nanos(cost));
            held < to_nanos(self.cost_limit) && after > held
        }) {
            return TeamCheck::Exceeded(format!(
                "team cost budget exhausted: {used_cost:.4} used + about {cost:.4} for this call > {:.4} held by this node (no slice of safety.budget.cost_per_team = {} left to claim)",
                held as f64 / NANOS,
                self.cost_limit
            ));
        }
        if self.cost_limit > 0.0 && after_cost > self.cost_limit {
            return TeamCheck::Exceeded(format!(
                "team cost budget exhausted: {used_cost:.4} used + about {cost:.4} for this call > {} (safety.budget.cost_per_team)",
                self.cost_limit
            ));
        }
        let near_tokens = self.token_limit > 0 && self.token_limit - after <= self.reserve_tokens;
        let near_cost = self.cost_limit > 0.0
            && self.cost_limit - after_cost
                <= (self.reserve_cost_fraction + COST_EPSILON) * self.cost_limit;
        if (near_tokens || near_cost) && !self.warned.swap(true, Ordering::AcqRel) {
            return TeamCheck::Warn(format!(
                "team budget nearly exhausted: {after} of {} tokens, {after_cost:.4} of {} cost",
                self.token_limit, self.cost_limit
            ));
        }
        TeamCheck::Ok
    }

    /// Claims the team's one near-budget warning: `true` for the first caller only (a budget stop
    /// that came before the warning gives it; see `AgentBreakers::before_llm_call`).
    pub(crate) fn claim_warning(&self) -> bool {
        !self.warned.swap(true, Ordering::AcqRel)
    }

    /// What the monitor shows.
    pub fn fleet_view(&self) -> FleetView {
        let locked_out: Vec<AgentKey> = self.locked_out.lock().iter().cloned().collect();
        FleetView {
            tokens: self.tokens(),
            cost: self.cost(),
            token_limit: self.token_limit,
            cost_limit: self.cost_limit,
            agents_total: self.agents.load(Ordering::Acquire),
            agents_locked_out: locked_out.len(),
            locked_out,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn config(tokens: u64, cost: f64) -> SafetyBudgetConfig {
        SafetyBudgetConfig {
            tokens_per_team: tokens,
            cost_per_team: cost,
            ..SafetyBudgetConfig::default()
        }
    }

    #[test]
    fn totals_are_exact_under_concurrent_recording() {
        let team = Arc::new(TeamBudget::new(&config(0, 0.0)));
        let threads: Vec<_> = (0..4)
            .map(|i| {
                let team = team.clone();
                std::thread::spawn(move || {
                    let key = AgentKey::new(format!("a{i}"));
                    team.register(&key);
                    for _ in 0..1000 {
                        team.record(&key, 3, 0.001);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(team.tokens(), 12_000);
        assert!((team.cost() - 4.0).abs() < 1e-9);
        let view = team.fleet_view();
        assert_eq!(view.agents_total, 4);
    }

    /// Grants slices of `slice` out of `left` (a stand-in for the cluster's compare-and-swap).
    struct Pool {
        left: Mutex<u64>,
        slice: u64,
    }

    impl BudgetSlices for Pool {
        fn claim(&self, _of: SliceOf) -> BoxFuture<'static, u64> {
            let mut left = self.left.lock();
            let grant = self.slice.min(*left);
            *left -= grant;
            Box::pin(async move { grant })
        }
    }

    #[tokio::test]
    async fn with_slices_a_team_spends_only_what_it_claimed() {
        let team = TeamBudget::new(&config(1000, 0.0));
        assert_eq!(team.held(), None, "no slices: no holding");
        let pool = Arc::new(Pool {
            left: Mutex::new(250), // the other nodes claimed the rest
            slice: 100,
        });
        assert!(team.set_slices(pool.clone(), 0, 0.0));
        assert_eq!(team.held(), Some(0));
        assert!(team.cover(150, 0.0).await, "two slices claimed for it");
        assert_eq!(team.held(), Some(200));
        assert_eq!(team.check(150, 0.0), TeamCheck::Ok);
        team.record(&"a".into(), 180, 0.0);
        assert!(team.cover(60, 0.0).await, "the last, smaller slice");
        assert_eq!(team.held(), Some(250));
        assert!(!team.cover(100, 0.0).await, "nothing left to claim");
        let TeamCheck::Exceeded(why) = team.check(100, 0.0) else {
            panic!("not stopped past what it holds");
        };
        assert!(why.contains("250 held by this node"), "{why}");
        assert!(
            !TeamBudget::new(&config(0, 0.0)).set_slices(pool, 0, 0.0),
            "no team budget: no slices"
        );
    }

    /// Grants slices of tokens and of cost from separate pools, counting the claims of each.
    struct TwoPools {
        tokens: Pool,
        cost_nanos: Pool,
        claims: Mutex<Vec<SliceOf>>,
    }

    impl BudgetSlices for TwoPools {
        fn claim(&self, of: SliceOf) -> BoxFuture<'static, u64> {
            self.claims.lock().push(of);
            match of {
                SliceOf::Tokens => self.tokens.claim(of),
                SliceOf::Cost => self.cost_nanos.claim(of),
            }
        }
    }

    #[tokio::test]
    async fn with_slices_a_team_spends_only_the_cost_it_claimed() {
        let nanos = |c: f64| (c * NANOS) as u64;
        // Only a cost budget: 10.0, of which 2.5 is left to this node in slices of 1.0.
        let team = TeamBudget::new(&config(0, 10.0));
        let pools = Arc::new(TwoPools {
            tokens: Pool {
                left: Mutex::new(1_000_000),
                slice: 1_000,
            },
            cost_nanos: Pool {
                left: Mutex::new(nanos(2.5)),
                slice: nanos(1.0),
            },
            claims: Mutex::default(),
        });
        assert!(team.set_slices(pools.clone(), 0, 0.0));
        assert_eq!(team.held(), None, "no token budget: no token holding");
        assert_eq!(team.held_cost(), Some(0.0));
        assert!(team.cover(500, 1.5).await, "two cost slices claimed for it");
        assert_eq!(team.held_cost(), Some(2.0));
        assert_eq!(
            *pools.claims.lock(),
            vec![SliceOf::Cost, SliceOf::Cost],
            "no token slice claimed without a token budget"
        );
        assert_eq!(team.check(500, 1.5), TeamCheck::Ok);
        team.record(&"a".into(), 500, 1.8);
        assert!(team.cover(500, 0.5).await, "the last, smaller slice");
        assert_eq!(team.held_cost(), Some(2.5));
        assert!(!team.cover(500, 1.0).await, "nothing left to claim");
        let TeamCheck::Exceeded(why) = team.check(500, 1.0) else {
            panic!("not stopped past the cost it holds");
        };
        assert!(why.contains("2.5000 held by this node"), "{why}");
        assert!(why.contains("cost_per_team = 10"), "{why}");
    }

    #[tokio::test]
    async fn with_both_budgets_shared_a_call_claims_what_it_lacks_of_each() {
        let team = TeamBudget::new(&config(1_000, 10.0));
        let pools = Arc::new(TwoPools {
            tokens: Pool {
                left: Mutex::new(1_000),
                slice: 100,
            },
            cost_nanos: Pool {
                left: Mutex::new(0),
                slice: 1,
            },
            claims: Mutex::default(),
        });
        // Held from before a restart: 300 tokens, 0.5 of cost.
        assert!(team.set_slices(pools.clone(), 300, 0.5));
        assert!(team.cover(250, 0.4).await, "both fit what is held");
        assert!(pools.claims.lock().is_empty());
        assert!(team.cover(350, 0.4).await, "one token slice");
        assert_eq!(team.held(), Some(400));
        assert!(!team.cover(350, 0.6).await, "no cost slice left");
        assert!(matches!(team.check(350, 0.6), TeamCheck::Exceeded(_)));
    }

    #[test]
    fn the_fleet_view_counts_locked_out_agents() {
        let team = TeamBudget::new(&config(0, 0.0));
        for k in ["b", "a", "c"] {
            team.register(&k.into());
        }
        team.set_locked_out(&"c".into(), true);
        team.set_locked_out(&"a".into(), true);
        team.set_locked_out(&"c".into(), false);
        let view = team.fleet_view();
        assert_eq!((view.agents_total, view.agents_locked_out), (3, 1));
        assert_eq!(view.locked_out, vec![AgentKey::new("a")]);
    }

    #[test]
    fn the_team_check_warns_once_then_refuses_over_the_limit() {
        let team = TeamBudget::new(&config(2000, 0.0));
        assert_eq!(team.check(1000, 0.0), TeamCheck::Ok);
        team.record(&"a".into(), 1400, 0.0);
        assert!(matches!(team.check(100, 0.0), TeamCheck::Warn(_)));
        assert_eq!(team.check(100, 0.0), TeamCheck::Ok, "warned once only");
        assert_eq!(
            team.check(600, 0.0),
            TeamCheck::Ok,
            "exactly at the limit fits"
        );
        assert!(matches!(team.check(601, 0.0), TeamCheck::Exceeded(_)));
    }
}
