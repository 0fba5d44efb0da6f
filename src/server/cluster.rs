//! The server's side of a cluster (`warden serve` with `[cluster]`, docs/cluster.md): what the
//! API, the console and `/mcp` need from this node's cluster ([`ClusterNode`], a trait object in
//! [`ApiState::cluster`]: the server compiles without NATS; `crate::cluster::Cluster` implements it),
//! the types its halts and lifts answer with, and how the routes answer on a cluster node.
//!
//! No route is registered here: each route of the API's one route table ([`super::api::ROUTES`])
//! asks the cluster when there is one, through the functions below. On a cluster node
//! `POST /api/halt` halts every node, `POST /api/resume` lifts that halt (a write to the halt key
//! first), `GET /api/agents` lists the whole fleet, and `GET /api/cluster` tells this node's view
//! of the cluster. Every route that lifts a lockout (`unlock`, `emergency/clear`, `history/reset`
//! of a locked-out agent) writes the lockout key first, and every route that brings back an agent
//! (those and `resume`) is refused for an agent this node gave up. Plus the `/metrics` lines.

use crate::server::api::{ApiError, ApiState, Host, API_OPERATOR};
use actix_web::HttpResponse;
use futures::future::BoxFuture;
use std::{collections::BTreeMap, collections::BTreeSet, sync::Arc, time::Duration};
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

/// `409` for an agent another node runs (this node's team file lists it there), naming the node
/// to ask: one this node gave up (its lease is another node's, and the copy here is halted) says
/// so; one this node never ran (no copy here) says only where it runs. `None` for one it owns, or
/// one its team file does not list.
fn given_up(
    state: &ApiState,
    cluster: &dyn ClusterNode,
    key: &str,
    what: &str,
) -> Option<HttpResponse> {
    if cluster.owns(key) {
        return None;
    }
    let node = cluster.runs_on(key)?;
    let message = if state.supervisor.get(key).is_some() {
        format!(
            "agent {key} runs on node {node} now (this node's copy was halted when node {node} \
             took its lease): {what} it there"
        )
    } else {
        format!(
            "agent {key} runs on node {node}, not on node {} (it never ran here): {what} it there",
            cluster.node()
        )
    };
    Some(error(actix_web::http::StatusCode::CONFLICT, message))
}

/// `GET /api/agents/{key}` with `"node"`: an agent of this node, its live status; of another
/// node, the status its last lease renewal wrote (at most a beat old). A copy this node gave up is
/// shown only while no other node's lease lists the agent. `None`: no such agent here nor in a
/// lease (the single-node answer).
pub(crate) async fn agent(
    state: &ApiState,
    cluster: &dyn ClusterNode,
    key: &str,
) -> Option<HttpResponse> {
    let here = state.supervisor.get(key);
    if !cluster.owns(key) {
        if let Some((status, node)) = cluster.remote_status(key).await {
            if node != cluster.node() {
                return Some(HttpResponse::Ok().json(with_node(status, &node)));
            }
        }
    }
    here.map(|agent| HttpResponse::Ok().json(with_node(agent.status(), cluster.node())))
}

/// Where a halt of `key` goes on a cluster node: `Ok(None)` to halt it here (this node runs it,
/// or nobody else does: a copy given up here, halting it again is harmless, or the 404). Another
/// node's agent is halted there and answered with its acks once applied, with `"node"` (`504`
/// when it did not answer in time, `409` when it does not run the agent: see
/// [`RemoteHaltError`]).
pub(crate) async fn halt_elsewhere(
    who: &Host,
    state: &ApiState,
    cluster: &dyn ClusterNode,
    key: &str,
) -> Option<HttpResponse> {
    use actix_web::http::StatusCode;
    if cluster.owns(key) {
        return None;
    }
    let node = cluster.owner(key).await?;
    let agent = AgentKey::from(key);
    let started = tokio::time::Instant::now();
    let halted = cluster.halt_remote(&node, &agent, who.operator()).await;
    Some(match halted {
        Ok(halted) => {
            state.metrics.halt_agent.observe(started.elapsed());
            HttpResponse::Ok().json(serde_json::json!({ "node": node, "halted": halted }))
        }
        Err(e @ RemoteHaltError::Moved { .. }) => error(StatusCode::CONFLICT, e.to_string()),
        Err(e @ (RemoteHaltError::Unanswered { .. } | RemoteHaltError::NoResponder { .. })) => {
            error(StatusCode::GATEWAY_TIMEOUT, e.to_string())
        }
    })
}

/// A resume of an agent this node gave up is refused (`409`): it runs on another node.
pub(crate) fn refuse_resume(
    state: &ApiState,
    cluster: &dyn ClusterNode,
    key: &str,
) -> Option<HttpResponse> {
    given_up(state, cluster, key, "resume")
}

/// `POST /api/halt` on a cluster node: every node's agents (this node's first, before any
/// network), journaled with who asked (`api:admin`, or `api:host` for a host token).
pub(crate) async fn halt(
    who: &Host,
    state: &ApiState,
    cluster: Arc<dyn ClusterNode>,
) -> HttpResponse {
    let started = tokio::time::Instant::now();
    let node = cluster.node().to_owned();
    let halt = cluster
        .halt("operator halt via the API", who.operator())
        .await;
    state.metrics.halt_all.observe(started.elapsed());
    HttpResponse::Ok().json(halt_body(&node, &halt))
}

/// `POST /api/resume` on a cluster node: a lift needs a successful compare-and-swap of the halt
/// key first: `409` when the cluster is not halted or a halt came since the read, `503` when
/// JetStream did not confirm the write.
pub(crate) async fn lift(cluster: Arc<dyn ClusterNode>, reason: &str) -> HttpResponse {
    use actix_web::http::StatusCode;
    let node = cluster.node().to_owned();
    match cluster.lift(reason, API_OPERATOR).await {
        Ok(lift) => {
            let (resumed, kept) = crate::server::api::lift_lists(&lift.local, Some(&node));
            HttpResponse::Ok().json(serde_json::json!({
                "epoch": lift.epoch,
                "node": node,
                "resumed": resumed,
                "kept": kept,
            }))
        }
        Err(e @ (LiftError::NotHalted { .. } | LiftError::Moved { .. })) => {
            error(StatusCode::CONFLICT, e.to_string())
        }
        Err(e @ LiftError::CutOff { .. }) => error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

/// What lifts a lockout, by route (each needs a successful write to the cluster first when the
/// agent is locked out).
#[derive(Debug)]
pub(crate) enum Lifting {
    /// `POST /api/agents/{key}/unlock`, with the body's note.
    Unlock(Option<String>),
    /// `POST /api/agents/{key}/emergency/clear`.
    Clear,
    /// `POST /api/agents/{key}/history/reset` (it unlocks a locked-out agent too).
    ResetHistory,
}

/// An unlock, an emergency clear or a history reset on a cluster node: a lockout is lifted only
/// after a successful write to the cluster (`503` when it failed: the agent stays locked out),
/// `409` for an agent of another node (given up here included). A history reset of an agent that
/// is not locked out is a plain reset (no cluster write).
pub(crate) async fn lift_lockout(
    state: &ApiState,
    cluster: &dyn ClusterNode,
    key: &str,
    lifting: Lifting,
) -> HttpResponse {
    let what = match lifting {
        Lifting::Unlock(_) => "unlock",
        Lifting::Clear => "clear",
        Lifting::ResetHistory => "reset",
    };
    if let Some(refused) = given_up(state, cluster, key, what) {
        return refused;
    }
    let Some(agent) = state.supervisor.get(key) else {
        return match cluster.owner(key).await {
            Some(node) => error(
                actix_web::http::StatusCode::CONFLICT,
                format!("agent {key} runs on node {node}: {what} it there"),
            ),
            None => error(
                actix_web::http::StatusCode::NOT_FOUND,
                format!("unknown agent {key}"),
            ),
        };
    };
    let operator = API_OPERATOR;
    let resetting = matches!(lifting, Lifting::ResetHistory);
    let local: BoxFuture<'_, Result<(), ControlError>> = {
        let agent = agent.clone();
        Box::pin(async move {
            match lifting {
                Lifting::Unlock(note) => agent.unlock_with_note(operator, note).await,
                Lifting::Clear => agent.clear_emergency(operator).await,
                Lifting::ResetHistory => agent.reset_history(operator).await,
            }
        })
    };
    if resetting && !agent.status().emergency_stop {
        // Nothing to unlock: no cluster write.
        return match local.await {
            Ok(()) => HttpResponse::Ok().json(agent.status()),
            Err(control) => {
                let err = ApiError::from(control);
                error(err.status, err.message)
            }
        };
    }
    let bound = cluster.halt_ack_timeout();
    match cluster.unlock(&agent, operator, bound, local).await {
        Ok(()) => HttpResponse::Ok().json(agent.status()),
        Err(Some(control)) => {
            let err = ApiError::from(control);
            error(err.status, err.message)
        }
        Err(None) => error(
            actix_web::http::StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "{what} refused: lifting a lockout needs a successful write to the cluster's \
                 lockout key, and JetStream did not take it within {} ms (this node may be cut \
                 off); {key} stays locked out",
                bound.as_millis()
            ),
        ),
    }
}

fn error(status: actix_web::http::StatusCode, message: String) -> HttpResponse {
    HttpResponse::build(status).json(serde_json::json!({ "error": message }))
}

/// `GET /api/agents` on a cluster node: every local agent's live status with `"node"`, then every
/// agent another node's lease names, with the status of its last renewal.
pub(crate) async fn agents(state: &ApiState, cluster: &dyn ClusterNode) -> HttpResponse {
    let mut listed = Vec::new();
    let mut seen = BTreeSet::new();
    // Copies this node gave up are listed only if no other node's lease lists the agent.
    let mut given_up = Vec::new();
    for status in state.supervisor.statuses() {
        if !cluster.owns(status.key.as_str()) && cluster.runs_on(status.key.as_str()).is_some() {
            given_up.push(status);
            continue;
        }
        seen.insert(status.key.to_string());
        listed.push(with_node(status, cluster.node()));
    }
    let fleet = tokio::time::timeout(Duration::from_secs(2), cluster.leases()).await;
    let remote_error = match fleet {
        Ok(Ok(leases)) => {
            for lease in leases {
                let Some(status) = lease.status else { continue };
                if lease.node == cluster.node() || !seen.insert(status.key.to_string()) {
                    continue;
                }
                listed.push(with_node(status, &lease.node));
            }
            None
        }
        Ok(Err(e)) => Some(e),
        Err(_) => Some("no answer from JetStream within 2 s".to_owned()),
    };
    for status in given_up {
        if seen.insert(status.key.to_string()) {
            listed.push(with_node(status, cluster.node()));
        }
    }
    let mut response = HttpResponse::Ok();
    if let Some(e) = remote_error {
        // The local agents are still listed; the header says the rest is missing.
        response.insert_header(("Warden-Fleet-Partial", e));
    }
    response.json(listed)
}

fn with_node(mut status: AgentStatus, node: &str) -> AgentStatus {
    status.node = Some(node.to_owned());
    status
}
