//! The server's side of a cluster (`warden serve` with `[cluster]`, docs/cluster.md): what the
//! API, the console and `/mcp` need from this node's cluster ([`ClusterNode`], a trait object in
//! [`ApiState::cluster`]: the server compiles without NATS; `crate::cluster::Cluster` implements it),
//! the types its halts and lifts answer with, and how the routes answer on a cluster node.
//!
//! No route is registered here: each route of the API's one route table ([`super::api::ROUTES`])
//! asks the cluster when there is one (`routes/cluster.rs`: how the routes answer on a cluster
//! node). On a cluster node
//! `POST /api/halt` halts every node, `POST /api/resume` lifts that halt (a write to the halt key
//! first), `GET /api/agents` lists the whole fleet, and `GET /api/cluster` tells this node's view
//! of the cluster. Every route that lifts a lockout (`unlock`, `emergency/clear`, `history/reset`
//! of a locked-out agent) writes the lockout key first, and every route that brings back an agent
//! (those and `resume`) is refused for an agent this node gave up. Plus the `/metrics` lines.

use futures::future::BoxFuture;
use std::{collections::BTreeMap, sync::Arc, time::Duration};
use warden_actors::{AgentHandle, ControlError, HaltAck, LiftOutcome};
use warden_protocols::cluster::{AgentHaltAck, AgentLease, NodeHaltAck};
use warden_protocols::{AgentKey, AgentStatus};

/// What the server needs from this node's cluster: where an agent runs, the cluster's halt and
/// lift, remote halts, shared lockouts, the fleet listing and its status. Implemented by
/// `crate::cluster::Cluster` (feature `server` today; NATS stays behind it).
///
/// The methods that start work on the cluster's tasks take `self: Arc<Self>`.
pub trait ClusterNode: Send + Sync + std::fmt::Debug {
    /// This node's name (`--node`).
    fn node(&self) -> &str;
    /// Whether this node holds `agent`'s lease.
    fn owns(&self, agent: &str) -> bool;
    /// The node this node's team file says runs `agent` (no network): `None` when it runs here, or
    /// the team file does not list it.
    fn runs_on(&self, agent: &str) -> Option<String>;
    /// Why this node starts no model call, while its fail safe is on.
    fn fail_safe(&self) -> Option<String>;
    /// How long a halt or a lockout write waits for JetStream (`cluster.halt_ack_timeout_ms`).
    fn halt_ack_timeout(&self) -> Duration;
    /// The node that runs `agent` when it is not this one ([`ClusterNode::runs_on`], else its
    /// lease's node). `None`: nobody (or no answer).
    fn owner<'a>(&'a self, agent: &'a str) -> BoxFuture<'a, Option<String>>;
    /// `agent`'s status as its owner's last lease renewal wrote it, with that node.
    fn remote_status<'a>(&'a self, agent: &'a str) -> BoxFuture<'a, Option<(AgentStatus, String)>>;
    /// Rewrites `agent`'s lease now (its status changed: an adopter brings it up as it is now).
    fn write_lease_now<'a>(self: Arc<Self>, agent: &'a str) -> BoxFuture<'a, ()>;
    /// Halts the whole cluster: this node's agents first (before any network), then the others.
    fn halt<'a>(self: Arc<Self>, reason: &'a str, by: &'a str) -> BoxFuture<'a, ClusterHalt>;
    /// Halts `agent`, which runs on `node`, journaled there with `by`: its acks once applied.
    fn halt_remote<'a>(
        &'a self,
        node: &'a str,
        agent: &'a AgentKey,
        by: &'a str,
    ) -> BoxFuture<'a, Result<Vec<AgentHaltAck>, RemoteHaltError>>;
    /// Lifts the cluster halt (a compare-and-swap of the halt key first).
    fn lift<'a>(
        self: Arc<Self>,
        reason: &'a str,
        by: &'a str,
    ) -> BoxFuture<'a, Result<ClusterLift, LiftError>>;
    /// Lifts `agent`'s lockout with `local` after `locked: false` is written to the cluster within
    /// `bound`. `Err(None)`: the write failed (`local` is not run); `Err(Some)`: `local` failed.
    fn unlock<'a>(
        &'a self,
        agent: &'a AgentHandle,
        by: &'a str,
        bound: Duration,
        local: BoxFuture<'a, Result<(), ControlError>>,
    ) -> BoxFuture<'a, Result<(), Option<ControlError>>>;
    /// Every agent lease that lives (the whole fleet, with each agent's node).
    fn leases(&self) -> BoxFuture<'_, Result<Vec<AgentLease>, String>>;
    /// The body of `GET /api/cluster`: this node, its fail safe, the halt key, the live nodes.
    fn status(&self) -> BoxFuture<'_, serde_json::Value>;
    /// The cluster's `/metrics` families.
    fn metrics(&self) -> String;
}

/// What a cluster halt gathered: this node's acks, each other node's, and the nodes that did not
/// answer in time.
#[derive(Debug)]
pub struct ClusterHalt {
    /// The epoch written.
    pub epoch: u64,
    /// This node's agents.
    pub local: Vec<HaltAck>,
    /// The other nodes' answers, by node.
    pub remote: BTreeMap<String, NodeHaltAck>,
    /// Nodes with a live heartbeat that did not answer within the timeout.
    pub unanswered: Vec<String>,
}

/// What a lift of the cluster halt did on this node (the other nodes apply it from the broadcast
/// or the key).
#[derive(Debug)]
pub struct ClusterLift {
    /// The epoch written (`halted: false`).
    pub epoch: u64,
    /// This node's agents the halt had stopped, and what the lift did with each.
    pub local: Vec<LiftOutcome>,
}

/// Why a lift of the cluster halt was refused (the cluster stays as it was).
#[derive(Debug, thiserror::Error)]
pub enum LiftError {
    /// The halt key says the cluster is not halted.
    #[error("the cluster is not halted (halt epoch {epoch}): nothing to lift")]
    NotHalted {
        /// The key's epoch.
        epoch: u64,
    },
    /// A halt came that the lift had not seen: the key moved since it was read, or this node
    /// applied a halt whose write has not landed yet.
    #[error(
        "lift refused: a halt came since the halt key was read (epoch {read}, now {now}): a lift \
         never overrides a halt it has not seen; the cluster stays halted (lift again if still meant)"
    )]
    Moved {
        /// The epoch the lift read.
        read: u64,
        /// The epoch there is now.
        now: u64,
    },
    /// JetStream did not confirm the read or the write within the bound.
    #[error(
        "lift refused: it needs a write to the cluster's halt key confirmed by JetStream, and none \
         came within {ms} ms (this node may be cut off: {cause}); the cluster stays halted unless \
         the write landed unconfirmed, in which case every node applies it from the key"
    )]
    CutOff {
        /// The bound (`cluster.halt_ack_timeout_ms`).
        ms: u128,
        /// What failed.
        cause: String,
    },
}

/// Why a halt of another node's agent did not come back acknowledged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RemoteHaltError {
    /// The node asked does not run it (its lease moved since it was read).
    #[error("node {node} does not run agent {agent} (its lease moved): ask again")]
    Moved {
        /// The agent.
        agent: AgentKey,
        /// The node asked.
        node: String,
    },
    /// Nothing listens for the owner's halts on NATS (it is down, or not connected): not applied.
    #[error(
        "node {node} is not reachable on NATS (no subscriber: it may be down); the halt of {agent} \
         was not applied there. If it is down its agents do nothing; POST /api/halt halts the \
         whole cluster, and is state every node applies when it is back"
    )]
    NoResponder {
        /// The agent.
        agent: AgentKey,
        /// Its owner, as its lease says.
        node: String,
    },
    /// No answer within the bound: the halt may not have been applied.
    #[error(
        "node {node} did not acknowledge the halt of {agent} within {} ms: it may not have been \
         applied (the node may be cut off); POST /api/halt halts the whole cluster, and is state \
         every node applies when it is back",
        waited.as_millis()
    )]
    Unanswered {
        /// The agent.
        agent: AgentKey,
        /// Its owner.
        node: String,
        /// How long this node waited.
        waited: Duration,
    },
}

/// The acks of a cluster halt as JSON: `halted` lists every agent's ack with its node (this node's
/// first), `nodes` each node's answer, `unanswered` the nodes that did not answer in time.
pub fn halt_body(node: &str, halt: &ClusterHalt) -> serde_json::Value {
    let mut halted = Vec::new();
    let mut nodes = Vec::new();
    let mut add = |node: &str, acks: &[AgentHaltAck], stale: bool| {
        for a in acks {
            halted.push(serde_json::json!({
                "agent": a.agent, "state": a.state, "discarded": a.discarded, "node": node,
            }));
        }
        nodes.push(serde_json::json!({
            "node": node, "answered": true, "stale": stale, "agents": acks.len(),
        }));
    };
    add(node, &agent_acks(&halt.local), false);
    for (name, ack) in &halt.remote {
        add(name, &ack.halted, ack.stale);
    }
    for name in &halt.unanswered {
        nodes.push(serde_json::json!({ "node": name, "answered": false }));
    }
    serde_json::json!({
        "epoch": halt.epoch,
        "halted": halted,
        "nodes": nodes,
        "unanswered": halt.unanswered,
    })
}

/// A halt's acks as the cluster's wire type.
pub(crate) fn agent_acks(acks: &[HaltAck]) -> Vec<AgentHaltAck> {
    acks.iter()
        .map(|a| AgentHaltAck {
            agent: a.agent.clone(),
            state: a.state,
            discarded: a.discarded,
        })
        .collect()
}
