//! Typed reasons for refusing work and delegations.

use crate::{AgentKey, AgentState};
use serde::{Deserialize, Serialize};

/// Why an agent refused a piece of work (an event, a tick, a delegated task).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum WorkRefusal {
    /// A breaker tripped; the agent waits for an authenticated unlock.
    #[error("agent is in SAFETY_LOCKOUT: {cause}")]
    LockedOut {
        /// The lockout's message (breaker and values).
        cause: String,
    },
    /// The agent was halted or hard-stopped.
    #[error("agent is STOPPED")]
    Stopped,
    /// The ordinary lane is at capacity.
    #[error("ordinary mailbox is full ({capacity} messages)")]
    MailboxFull {
        /// The lane's capacity (`mailbox.ordinary_capacity`).
        capacity: usize,
    },
    /// The agent's actor is gone (shut down).
    #[error("agent is shut down")]
    Closed,
    /// The journal cannot write (a failing disk): nothing accepted now would survive a crash, so
    /// nothing is accepted until it can (see `Journal::degraded`).
    #[error("journal cannot write: {cause}")]
    JournalUnavailable {
        /// The journal's last write error.
        cause: String,
    },
}

/// Why the supervisor refused a delegation. Every refusal is journaled on the delegator.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum DelegationRefusal {
    /// The delegate is emergency-stopped: a breaker locked it out (`SAFETY_LOCKOUT`, or halted
    /// while locked out); only an authenticated unlock ends it.
    #[error("delegate {delegate} is emergency-stopped (state {state})")]
    EmergencyStop {
        /// The delegate.
        delegate: AgentKey,
        /// Its state (`SAFETY_LOCKOUT`, or `STOPPED` while locked out).
        state: AgentState,
    },
    /// The delegate is `STOPPED` (halted, or stopped by its budget) without being locked out; a
    /// resume brings it back.
    #[error("delegate {delegate} is stopped (state {state})")]
    Stopped {
        /// The delegate.
        delegate: AgentKey,
        /// Its state.
        state: AgentState,
    },
    /// The delegator already runs `budget` delegations.
    #[error("sub-agent budget exhausted: {active} of {budget} delegations running")]
    SubAgentBudget {
        /// Delegations running now.
        active: u32,
        /// `delegation.sub_agent_budget`.
        budget: u32,
    },
    /// The delegation would take the chain past `safety.loop.max_agent_hops`.
    #[error("hop limit: the delegation would be hop {hops}, the limit is {max}")]
    HopLimit {
        /// The hop the delegation would be.
        hops: u32,
        /// `safety.loop.max_agent_hops`.
        max: u32,
    },
    /// The delegate is already in the delegation chain.
    #[error("delegation cycle: {}", chain.iter().map(AgentKey::as_str).collect::<Vec<_>>().join(" -> "))]
    Cycle {
        /// The chain, root first, ending with the delegate that closes the cycle.
        chain: Vec<AgentKey>,
    },
    /// No agent has that key.
    #[error("unknown delegate {delegate}")]
    UnknownDelegate {
        /// The key that was asked for.
        delegate: AgentKey,
    },
    /// The delegate refused the task when it was offered (full mailbox, shut down).
    #[error("delegate {delegate} refused the task: {refusal}")]
    DelegateRefused {
        /// The delegate.
        delegate: AgentKey,
        /// Why it refused.
        refusal: WorkRefusal,
    },
    /// The delegator itself is halted or locked out.
    #[error("delegator {delegator} is not running")]
    DelegatorNotRunning {
        /// The delegator.
        delegator: AgentKey,
    },
}
