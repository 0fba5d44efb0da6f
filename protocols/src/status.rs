use crate::{AgentKey, AgentRole, AgentState, Lockout};
use serde::{Deserialize, Serialize};

/// Messages waiting in each lane.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct QueueDepths {
    pub system_halt: usize,
    pub control: usize,
    pub supervision: usize,
    pub ordinary: usize,
}

/// One agent's status, as `warden status` and `GET /api/agents/{key}` show it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentStatus {
    pub key: AgentKey,
    pub role: AgentRole,
    pub state: AgentState,
    pub emergency_stop: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lockout: Option<Lockout>,
    /// Why a breaker stopped the agent (budget), if one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped_by: Option<Lockout>,
    pub consecutive_errors: u32,
    pub max_consecutive_errors: u32,
    /// Delegations this agent is running now.
    pub active_sub_agents: u32,
    pub sub_agent_budget: u32,
    pub parent: Option<AgentKey>,
    pub queued: QueueDepths,
    pub ordinary_capacity: usize,
    /// Ordinary messages cleared by halts, in total.
    pub discarded_by_halt: u64,
    pub paused: bool,
    pub halts: u64,
    pub turns: u64,
    pub restarts: u32,
    pub history_len: usize,
    /// Tokens used (prompt + completion) and their cost, per the price table.
    pub tokens_used: u64,
    pub cost_used: f64,
}
