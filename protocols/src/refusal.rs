//! Typed reasons for refusing work and delegations.

use crate::{AgentKey, AgentState};
use serde::{Deserialize, Serialize};

/// Why an agent refused a piece of work (an event, a tick, a delegated task).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum WorkRefusal {
    /// A breaker tripped; the agent waits for an authenticated unlock.
    #[error("agent is in SAFETY_LOCKOUT: {cause}")]
    LockedOut { cause: String },
    /// The agent was halted or hard-stopped.
    #[error("agent is STOPPED")]
    Stopped,
    /// The ordinary lane is at capacity.
    #[error("ordinary mailbox is full ({capacity} messages)")]
    MailboxFull { capacity: usize },
    /// The agent's actor is gone (shut down).
    #[error("agent is shut down")]
    Closed,
    /// The journal cannot write (a failing disk): nothing accepted now would survive a crash, so
    /// nothing is accepted until it can (see `Journal::degraded`).
    #[error("journal cannot write: {cause}")]
    JournalUnavailable { cause: String },
}

/// Why the supervisor refused a delegation. Every refusal is journaled on the delegator.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum DelegationRefusal {
    /// The delegate is emergency-stopped: a breaker locked it out (`SAFETY_LOCKOUT`, or halted
    /// while locked out); only an authenticated unlock ends it.
    #[error("delegate {delegate} is emergency-stopped (state {state})")]
    EmergencyStop {
        delegate: AgentKey,
        state: AgentState,
    },
    /// The delegate is `STOPPED` (halted, or stopped by its budget) without being locked out; a
    /// resume brings it back.
    #[error("delegate {delegate} is stopped (state {state})")]
    Stopped {
        delegate: AgentKey,
        state: AgentState,
    },
    /// The delegator already runs `budget` delegations.
    #[error("sub-agent budget exhausted: {active} of {budget} delegations running")]
    SubAgentBudget { active: u32, budget: u32 },
    /// The delegation would take the chain past `safety.loop.max_agent_hops`.
    #[error("hop limit: the delegation would be hop {hops}, the limit is {max}")]
    HopLimit { hops: u32, max: u32 },
    /// The delegate is already in the delegation chain.
    #[error("delegation cycle: {}", chain.iter().map(AgentKey::as_str).collect::<Vec<_>>().join(" -> "))]
    Cycle { chain: Vec<AgentKey> },
    /// No agent has that key.
    #[error("unknown delegate {delegate}")]
    UnknownDelegate { delegate: AgentKey },
    /// The delegate refused the task when it was offered (full mailbox, shut down).
    #[error("delegate {delegate} refused the task: {refusal}")]
    DelegateRefused {
        delegate: AgentKey,
        refusal: WorkRefusal,
    },
    /// The delegator itself is halted or locked out.
    #[error("delegator {delegator} is not running")]
    DelegatorNotRunning { delegator: AgentKey },
}
