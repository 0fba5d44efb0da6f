//! The SafetyMonitor actor: one per team (supervisor).
//!
//! **One monitor per team, breakers per agent.** The breaker state machines ([`AgentBreakers`]) live
//! in each agent's cell and gate the agent *synchronously* — `before_llm_call`, `after_tool_execution`,
//! `on_loop_start` are plain function calls, never a message round trip — so a check can never be late
//! or lost and costs nanoseconds. What needs a team-wide view lives here: the team token/cost budget
//! ([`TeamBudget`], shared), the share of agents locked out, trips counted by breaker, and the recent
//! trips. Agents tell the monitor about every trip, stop and unlock with a fire-and-forget message.
//!
//! [`AgentBreakers`]: super::AgentBreakers

use super::{LimitCheckpoint, TeamBudget};
use actix::{Actor, Context, Handler, Message, MessageResult};
use serde::Serialize;
use std::{collections::BTreeMap, collections::VecDeque, sync::Arc};
use warden_protocols::{AgentKey, Breaker, FleetView, SafetyConfig};

/// How many recent trips the monitor keeps.
const RECENT: usize = 64;

/// A breaker tripped (lockout) or stopped (budget) an agent.
#[derive(Debug, Clone, Serialize)]
pub struct TripNotice {
    /// The agent tripped or stopped.
    pub agent: AgentKey,
    /// The breaker that did it.
    pub breaker: Breaker,
    /// Why, as journaled.
    pub reason: String,
    /// `true`: SAFETY_LOCKOUT; `false`: STOPPED.
    pub lockout: bool,
    /// When, in milliseconds since the Unix epoch.
    pub at_ms: u64,
}

impl Message for TripNotice {
    type Result = ();
}

/// An operator unlocked (or resumed) an agent.
#[derive(Debug)]
pub struct Cleared {
    /// The agent no longer locked out.
    pub agent: AgentKey,
}

impl Message for Cleared {
    type Result = ();
}

/// Ask for the team's safety report.
#[derive(Debug)]
pub struct GetSafetyReport;

impl Message for GetSafetyReport {
    type Result = SafetyReport;
}

/// The team-wide view.
#[derive(Debug, Clone, Serialize)]
pub struct SafetyReport {
    /// The team's token and cost totals and its locked-out share.
    pub fleet: FleetView,
    /// Trips per breaker since start (snake_case breaker names).
    pub trips: BTreeMap<String, u64>,
    /// The most recent trips and stops (at most 64), oldest first.
    pub recent: Vec<TripNotice>,
}

/// The team's safety actor: counts trips by breaker, keeps the recent ones, and marks agents
/// locked out or cleared in the [`TeamBudget`]'s fleet view. It gates nothing: the breakers in
/// each agent's cell do, synchronously. Read it with [`GetSafetyReport`] (or
/// [`crate::Supervisor::safety_report`]).
pub struct SafetyMonitor {
    team: Arc<TeamBudget>,
    trips: BTreeMap<String, u64>,
    recent: VecDeque<TripNotice>,
}

impl std::fmt::Debug for SafetyMonitor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SafetyMonitor").finish_non_exhaustive()
    }
}

impl SafetyMonitor {
    /// A monitor over the team budget `team` (start it with [`Actor::start`]).
    pub fn new(team: Arc<TeamBudget>) -> Self {
        SafetyMonitor {
            team,
            trips: BTreeMap::new(),
            recent: VecDeque::with_capacity(RECENT),
        }
    }
}

impl Actor for SafetyMonitor {
    type Context = Context<Self>;
}

fn breaker_name(b: Breaker) -> String {
    b.as_str().to_owned()
}

impl Handler<TripNotice> for SafetyMonitor {
    type Result = ();
    fn handle(&mut self, notice: TripNotice, _: &mut Context<Self>) {
        if notice.lockout {
            self.team.set_locked_out(&notice.agent, true);
        }
        *self.trips.entry(breaker_name(notice.breaker)).or_insert(0) += 1;
        if self.recent.len() == RECENT {
            self.recent.pop_front();
        }
        self.recent.push_back(notice);
    }
}

impl Handler<Cleared> for SafetyMonitor {
    type Result = ();
    fn handle(&mut self, cleared: Cleared, _: &mut Context<Self>) {
        self.team.set_locked_out(&cleared.agent, false);
    }
}

impl Handler<GetSafetyReport> for SafetyMonitor {
    type Result = MessageResult<GetSafetyReport>;
    fn handle(&mut self, _: GetSafetyReport, _: &mut Context<Self>) -> Self::Result {
        MessageResult(SafetyReport {
            fleet: self.team.fleet_view(),
            trips: self.trips.clone(),
            recent: self.recent.iter().cloned().collect(),
        })
    }
}

/// What every agent of a team shares: the safety config, the checkpoint, the team budget and the
/// monitor's address.
pub(crate) struct TeamSafety {
    pub config: Arc<SafetyConfig>,
    pub checkpoint: Arc<LimitCheckpoint>,
    /// The permission gate: asks through the checkpoint's bus, with its ids.
    pub permissions: Arc<super::PermissionGate>,
    pub team: Arc<TeamBudget>,
    pub monitor: Option<actix::Addr<SafetyMonitor>>,
    /// `false` runs the SafetyMonitor's checks off (load-test overhead comparisons). The
    /// consecutive-error emergency stop and halts stay on.
    pub checks: bool,
    /// The team's NPC↔NPC conversations (their limits and the pair-loop breaker).
    pub conversations: crate::npc::conversation::Conversations,
    /// Closed by an outside layer (the cluster's fail safe): no model call starts meanwhile.
    pub model_gate: super::ModelGate,
    /// The team's long-term memory runtime (the FTS5 index, rate windows, memory clocks).
    pub memory: crate::memory::TeamMemory,
}

impl TeamSafety {
    pub(crate) fn notify(&self, notice: TripNotice) {
        if let Some(monitor) = &self.monitor {
            monitor.do_send(notice);
        }
    }

    pub(crate) fn cleared(&self, agent: &AgentKey) {
        if let Some(monitor) = &self.monitor {
            monitor.do_send(Cleared {
                agent: agent.clone(),
            });
        }
    }
}
