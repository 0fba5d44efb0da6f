//! How the routes answer on a cluster node (`warden serve` with `[cluster]`): the branches the
//! route table's handlers take when [`ApiState::cluster`] is set. `POST /api/halt` halts every
//! node, `POST /api/resume` lifts that halt (a write to the halt key first), `GET /api/agents` lists
//! the whole fleet; every route that lifts a lockout (`unlock`, `emergency/clear`, `history/reset`
//! of a locked-out agent) writes the lockout key first, and every route that brings back an agent
//! (those and `resume`) is refused for an agent this node gave up.

use crate::server::api::{ApiError, ApiState, Host, API_OPERATOR};
use crate::server::cluster::{halt_body, ClusterNode, LiftError, RemoteHaltError};
use actix_web::HttpResponse;
use futures::future::BoxFuture;
use std::{collections::BTreeSet, sync::Arc, time::Duration};
use warden_actors::ControlError;
use warden_protocols::{AgentKey, AgentStatus};

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
