//! Wire types of the cluster (`warden serve --cluster`, docs/cluster.md): what nodes write to the
//! JetStream key-value buckets and send each other on NATS subjects. Serde only.
//!
//! Every type here is JSON on the wire and tolerant of fields it does not know (no
//! `deny_unknown_fields`), so that nodes of neighbouring versions can share a cluster.

use crate::{AgentKey, AgentState, AgentStatus, DelegationRefusal};
use serde::{Deserialize, Serialize};

/// The cluster's halt, the value of the key `halt` in the bucket `warden_halt`. A halt is state,
/// not a message: the epoch only grows (each halt writes `epoch + 1` by compare-and-swap), and a
/// node applies any epoch at or above its own.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct HaltState {
    /// How many cluster halts there were; 0: never halted.
    pub epoch: u64,
    /// Whether the cluster is halted (a node that starts now comes up halted).
    pub halted: bool,
    /// Why (free text).
    #[serde(default)]
    pub reason: String,
    /// Who asked (the operator's name).
    #[serde(default)]
    pub by: String,
    /// The node that received the halt and wrote it.
    #[serde(default)]
    pub node: String,
    /// When it was written, ms since the Unix epoch.
    #[serde(default)]
    pub at_ms: u64,
}

/// One agent's acknowledgement of a cluster halt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentHaltAck {
    /// The agent.
    pub agent: AgentKey,
    /// Its state after the halt (`STOPPED`, or `SAFETY_LOCKOUT`).
    pub state: AgentState,
    /// How many ordinary messages the halt cleared.
    pub discarded: u64,
}

/// A node's answer to a halt broadcast (the reply on the request's inbox).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeHaltAck {
    /// The node answering.
    pub node: String,
    /// The halt epoch it is at after applying (or not applying) the broadcast.
    pub epoch: u64,
    /// `true` when the broadcast's epoch was below the node's own: not applied.
    #[serde(default)]
    pub stale: bool,
    /// Its agents, once halted.
    #[serde(default)]
    pub halted: Vec<AgentHaltAck>,
}

/// A halt of one agent of another node: the request on `warden.cluster.agent_halt.NODE` (NODE:
/// the agent's owner), sent by the node an operator asked (`POST /api/agents/KEY/halt`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteAgentHalt {
    /// The agent.
    pub agent: AgentKey,
    /// Who asked, and through which node (journaled as the halt's operator).
    pub by: String,
}

/// The owner's answer to a [`RemoteAgentHalt`], once the halt is applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteAgentHaltReply {
    /// The node answering.
    pub node: String,
    /// `false` when it does not run the agent (its lease moved): nothing was halted.
    pub found: bool,
    /// The agent and the delegates it halted with it, once halted.
    #[serde(default)]
    pub halted: Vec<AgentHaltAck>,
    /// Set when the halt is applied but the owner's journal did not make it durable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_durable: Option<String>,
}

/// The lease on one agent, the value of `agent.KEY` in the bucket `warden_leases` (whose `max_age`
/// is the lease TTL: a lease not renewed within it disappears). Renewed by revision-checked update.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentLease {
    /// The node that owns the agent.
    pub node: String,
    /// The owning process (random per start): a restarted node takes its own leases back.
    #[serde(default)]
    pub instance: String,
    /// When it was last renewed, ms since the Unix epoch.
    pub renewed_ms: u64,
    /// The agent's status at that renewal (for the fleet listing on every node).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<AgentStatus>,
    /// `true` when it is `STOPPED` as part of the standing fleet halt (a lift resumes it), not by a
    /// halt of its own: a node that adopts it then brings it up running once the halt is lifted.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fleet_halted: bool,
}

/// A node's heartbeat, the value of `node.NAME` in the bucket `warden_leases`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeBeat {
    /// The node's name (`--node`).
    pub node: String,
    /// The process (random per start).
    #[serde(default)]
    pub instance: String,
    /// When it last wrote this, ms since the Unix epoch.
    pub renewed_ms: u64,
    /// The halt epoch it has applied.
    #[serde(default)]
    pub halt_epoch: u64,
    /// Its fail-safe reason, while it starts no model call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fail_safe: Option<String>,
    /// The agents it owns.
    #[serde(default)]
    pub agents: Vec<AgentKey>,
}

/// An agent's shared lockout, the value of `agent.KEY` in the bucket `warden_lockouts`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockoutEntry {
    /// Locked out (`true`) or unlocked.
    pub locked: bool,
    /// Why (the breaker's message), or who unlocked it.
    #[serde(default)]
    pub reason: String,
    /// The node that wrote it.
    pub node: String,
    /// When, ms since the Unix epoch.
    pub at_ms: u64,
}

/// A delegation to an agent of another node: the request on `warden.cluster.delegate.NODE`
/// (NODE: the delegate's owner). At-least-once: the delegator sends it again while no answer came;
/// the owning node runs it once per `key` and answers every copy with the first result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteTask {
    /// The idempotency key: the delegator's process (random per start), the delegator, its run id
    /// and the tool call id (`instance/agent/run/call`).
    pub key: String,
    /// The delegator (on the sending node).
    pub from: AgentKey,
    /// The delegate (on the owning node).
    pub to: AgentKey,
    /// What the delegate should do.
    pub task: String,
    /// The delegation chain, root first, ending with `to`.
    pub lineage: Vec<AgentKey>,
}

/// The owning node's answer to a [`RemoteTask`] (the same for every copy of one key).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum RemoteReply {
    /// The delegate's answer.
    Answer {
        /// Its text.
        answer: String,
    },
    /// Refused on the owning node before anything was queued (unknown, locked out, stopped).
    Refused {
        /// Why.
        refusal: DelegationRefusal,
    },
    /// The delegate took the task but produced no answer.
    Failed {
        /// Why (the delegate's task error).
        error: String,
    },
    /// The delegate dropped the task unanswered (halted, crashed, shut down).
    Abandoned,
}

/// What the owning node keeps of a delegated task in the bucket `warden_tasks`, by idempotency
/// key, so that a copy of its request that arrives after the owner restarted is answered from the
/// first run rather than run again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskRecord {
    /// The node that runs (ran) it.
    pub node: String,
    /// That node's process (random per process): a record of a run of another process with no
    /// `reply` is a run a crash cut short.
    pub instance: String,
    /// The answer, once the task ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply: Option<RemoteReply>,
}

/// Sent on `warden.cluster.delegate.NODE.cancel` when the delegator stopped waiting because it was
/// halted: the owning node halts the delegate if the task `key` is still running (best effort).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteCancel {
    /// The task's idempotency key.
    pub key: String,
    /// The halted delegator.
    pub from: AgentKey,
    /// The epoch of the cluster halt that stopped the delegator, when that is what stopped it.
    /// The owner applies that halt (if it has not yet) before it halts the delegate, so that the
    /// delegate counts among the agents the cluster halt stopped, and its lift resumes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub halt_epoch: Option<u64>,
}

/// A team budget shared by the nodes, the value of `tokens` (tokens) or `cost` (nano-units: 1e-9
/// of the price currency) in the bucket `warden_budget`. Grown only by compare-and-swap: a node
/// adds a slice to `claimed` (and to its own entry in `nodes`) before spending it; `claimed` never
/// passes `budget`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct BudgetClaims {
    /// `safety.budget.tokens_per_team` (or `cost_per_team`) of the node that created the key (the
    /// one that counts).
    pub budget: u64,
    /// Claimed by every node together.
    pub claimed: u64,
    /// Claimed by each node.
    #[serde(default)]
    pub nodes: std::collections::BTreeMap<String, u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_halt_state_reads_back_and_tolerates_unknown_fields() {
        let state = HaltState {
            epoch: 3,
            halted: true,
            reason: "fire".into(),
            by: "api".into(),
            node: "a".into(),
            at_ms: 7,
        };
        let text = serde_json::to_string(&state).unwrap();
        assert_eq!(serde_json::from_str::<HaltState>(&text).unwrap(), state);
        let newer = r#"{"epoch":4,"halted":false,"extra":1}"#;
        let read: HaltState = serde_json::from_str(newer).unwrap();
        assert_eq!((read.epoch, read.halted), (4, false));
    }
}
