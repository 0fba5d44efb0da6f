use crate::{npc::Perception, AgentKey, AgentRole, AgentState, Lockout};
use serde::{Deserialize, Serialize};

/// Messages waiting in each lane.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct QueueDepths {
    /// The halt lane (priority 0).
    pub system_halt: usize,
    /// The control lane (pause, resume, unlock, reset).
    pub control: usize,
    /// The supervision lane (delegation results, lockout notices).
    pub supervision: usize,
    /// The ordinary lane (user events, ticks, delegated tasks).
    pub ordinary: usize,
}

/// One agent's status, as `warden status` and `GET /api/agents/{key}` show it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentStatus {
    /// The agent's key.
    pub key: AgentKey,
    /// Assistant or sub-agent.
    pub role: AgentRole,
    /// The lifecycle state.
    pub state: AgentState,
    /// `true` while a breaker has it locked out (`lockout` is set); only an authenticated unlock ends it.
    pub emergency_stop: bool,
    /// Why it is locked out, while it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lockout: Option<Lockout>,
    /// Why a breaker stopped the agent (budget), if one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped_by: Option<Lockout>,
    /// Failed calls in a row.
    pub consecutive_errors: u32,
    /// The consecutive-errors breaker's threshold.
    pub max_consecutive_errors: u32,
    /// Delegations this agent is running now.
    pub active_sub_agents: u32,
    /// How many delegations it may run at once (`delegation.sub_agent_budget`).
    pub sub_agent_budget: u32,
    /// The delegator a sub-agent reports to.
    pub parent: Option<AgentKey>,
    /// Messages waiting in each lane now.
    pub queued: QueueDepths,
    /// The ordinary lane's capacity (`mailbox.ordinary_capacity`).
    pub ordinary_capacity: usize,
    /// Ordinary messages cleared by halts, in total.
    pub discarded_by_halt: u64,
    /// `true` while paused.
    pub paused: bool,
    /// Halts so far.
    pub halts: u64,
    /// Turns finished.
    pub turns: u64,
    /// Restarts after crashes.
    pub restarts: u32,
    /// Messages in its conversation history.
    pub history_len: usize,
    /// The running token estimate of the history (what memory compaction keeps bounded).
    #[serde(default)]
    pub history_tokens: u64,
    /// Its goals, carried in its system message (team file, `set_goals` tool, operator).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub goals: Vec<String>,
    /// Set while the agent waits for its rolling budget (`safety.budget.tokens_per_hour`): until
    /// when, in ms since the Unix epoch (an estimate: the wait runs on the runtime's clock).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_wait_until_ms: Option<u64>,
    /// Tokens used (prompt + completion) and their cost, per the price table.
    pub tokens_used: u64,
    /// Cost of its model calls so far, in the price currency.
    pub cost_used: f64,
    /// How it perceives world events, once it has perceived one (an NPC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub npc: Option<NpcStatus>,
    /// The cluster node it runs on, as a cluster node's API tells it (`warden serve --cluster`);
    /// `None` outside a cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

/// An NPC's perception and ticks, in its status.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NpcStatus {
    /// World events perceived since the agent started (this process).
    pub perceived: u64,
    /// The last decision: verdict, rule, trust (`None` before the first world event).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last: Option<Perception>,
    /// Events in the context buffer now (folded into the next turn).
    pub context_buffered: usize,
    /// Events the context buffer dropped to keep its bounds.
    pub context_dropped: u64,
    /// TRIGGERs from other NPCs that a conversation limit (`npc.conversation`) kept as CONTEXT.
    #[serde(default)]
    pub conversation_limited: u64,
    /// IGNORE verdicts counted but not journaled (`npc.journal_ignored = false`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub ignored_unjournaled: u64,
    /// Its autonomous ticks, while the tick arbiter schedules it (`npc.tick.enabled`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tick: Option<TickStatus>,
}

/// An NPC's autonomous ticks, in its status (counted since the agent started, this process).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TickStatus {
    /// Awake, asleep (its sleep hours) or idle (no player in its room).
    pub mode: crate::npc::NpcMode,
    /// Ticks queued as work.
    pub ticks: u64,
    /// Ticks that came due while a turn ran or a tick was still queued: skipped, never queued twice.
    pub skipped: u64,
    /// `true` while a tick is queued and not yet taken.
    pub queued: bool,
    /// Milliseconds (real time) until its next tick; `None` when its mode has no ticks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_tick_ms: Option<u64>,
    /// Its room as the no-player rule reads it (`npc.tick.room`, else its last world event's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub room: Option<String>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}
