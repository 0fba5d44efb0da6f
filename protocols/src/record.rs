//! [`AgentRecord`]: an agent's durable state, rebuilt by folding its events.

use crate::{AgentKey, AgentRole, AgentState, Breaker, ChatMessage, Event, EventKind};
use serde::{Deserialize, Serialize};

/// Why an agent is locked out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lockout {
    pub breaker: Breaker,
    pub reason: String,
}

/// The durable state of one agent.
///
/// Invariant: the live agent mutates its record only through [`AgentRecord::apply`] on the events it
/// journals, so `AgentRecord::replay(journal)` equals the live record (tests hold it to that).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentRecord {
    pub key: AgentKey,
    pub role: AgentRole,
    pub parent: Option<AgentKey>,
    pub state: AgentState,
    /// `true` while locked out (any breaker). Delegation to such an agent is refused.
    pub emergency_stop: bool,
    pub lockout: Option<Lockout>,
    /// Why a breaker (not an operator) stopped the agent; cleared when it is resumed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped_by: Option<Lockout>,
    pub consecutive_errors: u32,
    pub max_consecutive_errors: u32,
    pub paused: bool,
    pub halts: u64,
    pub discarded_by_halt: u64,
    pub turns: u64,
    pub restarts: u32,
    pub history: Vec<ChatMessage>,
}

impl AgentRecord {
    /// A record before its `Spawned` event.
    pub fn new(key: AgentKey) -> Self {
        AgentRecord {
            key,
            role: AgentRole::Assistant,
            parent: None,
            state: AgentState::WaitingForEvent,
            emergency_stop: false,
            lockout: None,
            stopped_by: None,
            consecutive_errors: 0,
            max_consecutive_errors: 5,
            paused: false,
            halts: 0,
            discarded_by_halt: 0,
            turns: 0,
            restarts: 0,
            history: Vec::new(),
        }
    }

    /// Folds one event into the record.
    pub fn apply(&mut self, kind: &EventKind) {
        match kind {
            EventKind::Spawned {
                role,
                parent,
                max_consecutive_errors,
            } => {
                self.role = *role;
                self.parent = parent.clone();
                self.max_consecutive_errors = *max_consecutive_errors;
            }
            EventKind::StateChanged { to, .. } => {
                self.state = *to;
                if *to == AgentState::WaitingForEvent {
                    self.stopped_by = None;
                }
            }
            EventKind::BreakerStopped { breaker, reason } => {
                self.stopped_by = Some(Lockout {
                    breaker: *breaker,
                    reason: reason.clone(),
                });
            }
            EventKind::ErrorCounted {
                consecutive_errors, ..
            } => self.consecutive_errors = *consecutive_errors,
            EventKind::ErrorsReset => self.consecutive_errors = 0,
            EventKind::LockedOut {
                breaker, reason, ..
            } => {
                self.emergency_stop = true;
                self.lockout = Some(Lockout {
                    breaker: *breaker,
                    reason: reason.clone(),
                });
            }
            EventKind::Unlocked { .. } => {
                self.emergency_stop = false;
                self.lockout = None;
                self.consecutive_errors = 0;
            }
            EventKind::HistoryReset { .. } => self.history.clear(),
            EventKind::Paused { .. } => self.paused = true,
            EventKind::Unpaused { .. } => self.paused = false,
            EventKind::Halted { discarded, .. } => {
                self.halts += 1;
                self.discarded_by_halt += discarded;
            }
            EventKind::HistoryAppended { message } => self.history.push(message.clone()),
            EventKind::TurnFinished { .. } => self.turns += 1,
            EventKind::Restarted { restarts } => self.restarts = *restarts,
            EventKind::TransitionRefused { .. }
            | EventKind::MessagesDiscarded { .. }
            | EventKind::WorkRefused { .. }
            | EventKind::ToolStarted { .. }
            | EventKind::ToolFinished { .. }
            | EventKind::ToolRefused { .. }
            | EventKind::DelegationRequested { .. }
            | EventKind::DelegationRefused { .. }
            | EventKind::DelegationEnded { .. }
            | EventKind::DelegateLockedOut { .. }
            | EventKind::SafetyAlert { .. }
            | EventKind::BudgetWarning { .. }
            | EventKind::LimitDecided { .. }
            | EventKind::LimitDenied { .. }
            | EventKind::ToolCircuitChanged { .. }
            | EventKind::Crashed { .. } => {}
        }
    }

    /// Rebuilds the record of `key` from a journal (events of other agents are skipped).
    pub fn replay<'a>(key: AgentKey, events: impl IntoIterator<Item = &'a Event>) -> Self {
        let mut record = AgentRecord::new(key);
        for event in events {
            if event.agent == record.key {
                record.apply(&event.kind);
            }
        }
        record
    }
}
