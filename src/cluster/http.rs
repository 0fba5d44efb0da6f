//! The routes a cluster node answers differently (registered before the API's own, which they
//! shadow): `POST /api/halt` halts every node, `POST /api/resume` lifts that halt (a write to the
//! halt key first), `GET /api/agents` lists the whole fleet, and
//! `GET /api/cluster` tells this node's view of the cluster. Every route that lifts a lockout
//! (`unlock`, `emergency/clear`, `history/reset` of a locked-out agent) writes the lockout key
//! first, and every route that brings back an agent (those and `resume`) is refused for an agent
//! this node gave up. Plus the `/metrics` lines.

use super::Cluster;
use crate::server::api::{Admin, ApiState, Host, Reader};
use actix_web::{web, HttpResponse};
use std::{collections::BTreeSet, fmt::Write as _, sync::atomic::Ordering, time::Duration};
use warden_protocols::AgentStatus;

/// Registers the cluster's routes (only when the state has a cluster).
pub(crate) fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/api/halt", web::post().to(halt))
        .route("/api/resume", web::post().to(lift))
        .route("/api/agents", web::get().to(agents))
        .route("/api/cluster", web::get().to(status))
        .route("/api/agents/{key}/unlock", web::post().to(unlock))
        .route("/api/agents/{key}", web::get().to(agent))
        .route("/api/agents/{key}/halt", web::post().to(halt_agent))
        .route("/api/agents/{key}/resume", web::post().to(resume))
        .route("/api/agents/{key}/pause", web::post().to(pause))
        .route("/api/agents/{key}/emergency/clear", web::post().to(clear))
        .route(
            "/api/agents/{key}/history/reset",
            web::post().to(reset_history),
        );
}

/// `409` for an agent another node runs (this node's team file lists it there), naming the node
/// to ask: one this node gave up (its lease is another node's, and the copy here is halted) says
/// so; one this node never ran (no copy here) says only where it runs. `None` for one it owns, or
/// one its team file does not list.
fn given_up(cluster: &Cluster, key: &str, what: &str) -> Option<HttpResponse> {
    if cluster.owns(key) {
        return None;
    }
    let node = cluster.elsewhere.lock().get(key).cloned()?;
    let message = if cluster.supervisor.get(key).is_some() {
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
/// shown only while no other node's lease lists the agent.
async fn agent(
    reader: Reader,
    state: web::Data<ApiState>,
    key: web::Path<String>,
) -> Result<HttpResponse, crate::server::api::ApiError> {
    let cluster = cluster(&state);
    let here = state.supervisor.get(&key);
    if !cluster.owns(&key) {
        if let Some((status, node)) = cluster.remote_status(&key).await {
            if node != cluster.node() {
                return Ok(HttpResponse::Ok().json(with_node(status, &node)));
            }
        }
    }
    match here {
        Some(agent) => Ok(HttpResponse::Ok().json(with_node(agent.status(), cluster.node()))),
        None => crate::server::api::get_agent(reader, state, key).await,
    }
}

/// A halt of an agent of another node is sent to that node and answered with its acks once
/// applied, with `"node"` (`504` when it did not answer in time, `409` when it does not run the
/// agent: see [`super::RemoteHaltError`]).
async fn halt_agent(
    who: Host,
    state: web::Data<ApiState>,
    key: web::Path<String>,
) -> Result<HttpResponse, crate::server::api::ApiError> {
    use super::RemoteHaltError;
    use actix_web::http::StatusCode;
    let cluster = cluster(&state).clone();
    if cluster.owns(&key) {
        let name = key.as_str().to_owned();
        let halted = crate::server::api::halt_agent(who, state, key).await;
        // Its lease shows it halted now: an adopter keeps it halted if this node dies.
        cluster.write_lease_now(&name).await;
        return halted;
    }
    let Some(node) = cluster.owner(&key).await else {
        // Nobody else runs it: a copy given up here (halting it again is harmless), or the 404.
        return crate::server::api::halt_agent(who, state, key).await;
    };
    let agent = warden_protocols::AgentKey::from(key.as_str());
    let started = tokio::time::Instant::now();
    let operator = who.operator();
    let halted = cluster.halt_remote(&node, &agent, operator).await;
    Ok(match halted {
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

/// A resume of an agent this node gave up is refused (`409`): it runs on another node. Done, the
/// lease is rewritten at once (an adopter brings it up running if this node dies).
async fn resume(
    admin: Admin,
    state: web::Data<ApiState>,
    key: web::Path<String>,
) -> Result<HttpResponse, crate::server::api::ApiError> {
    let cluster = cluster(&state).clone();
    if let Some(refused) = given_up(&cluster, &key, "resume") {
        return Ok(refused);
    }
    let name = key.as_str().to_owned();
    let resumed = crate::server::api::resume(admin, state, key).await;
    cluster.write_lease_now(&name).await;
    resumed
}

/// A pause rewrites the lease at once: an adopter brings the agent up paused if this node dies.
async fn pause(
    admin: Admin,
    state: web::Data<ApiState>,
    key: web::Path<String>,
) -> Result<HttpResponse, crate::server::api::ApiError> {
    let cluster = cluster(&state).clone();
    let name = key.as_str().to_owned();
    let paused = crate::server::api::pause(admin, state, key).await;
    cluster.write_lease_now(&name).await;
    paused
}

fn cluster(state: &ApiState) -> &std::sync::Arc<Cluster> {
    // Registered only with a cluster (see `configure`'s caller).
    state
        .cluster
        .as_ref()
        .expect("cluster routes without a cluster")
}

async fn halt(_: Host, state: web::Data<ApiState>) -> HttpResponse {
    let cluster = cluster(&state);
    let started = tokio::time::Instant::now();
    let halt = cluster
        .halt(
            "operator halt via the API",
            crate::server::api::API_OPERATOR,
        )
        .await;
    state.metrics.halt_all.observe(started.elapsed());
    HttpResponse::Ok().json(super::halt::halt_body(cluster.node(), &halt))
}

/// A lift needs a successful compare-and-swap of the halt key first: `409` when the cluster is not
/// halted or a halt came since the read, `503` when JetStream did not confirm the write.
async fn lift(_: Admin, state: web::Data<ApiState>, body: web::Bytes) -> HttpResponse {
    use super::LiftError;
    use actix_web::http::StatusCode;
    let cluster = cluster(&state);
    let body = match crate::server::api::LiftBody::read(&body) {
        Ok(body) => body,
        Err(e) => return error(e.status, e.message),
    };
    let reason = body.reason.as_deref().map(str::trim).unwrap_or_default();
    match cluster.lift(reason, crate::server::api::API_OPERATOR).await {
        Ok(lift) => {
            let (resumed, kept) = crate::server::api::lift_lists(&lift.local, Some(cluster.node()));
            HttpResponse::Ok().json(serde_json::json!({
                "epoch": lift.epoch,
                "node": cluster.node(),
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
enum Lifting {
    /// `POST /api/agents/{key}/unlock`, with the body's note.
    Unlock(Option<String>),
    /// `POST /api/agents/{key}/emergency/clear`.
    Clear,
    /// `POST /api/agents/{key}/history/reset` (it unlocks a locked-out agent too).
    ResetHistory,
}

/// An unlock needs a successful write to the cluster first: `503` when it failed (the agent stays
/// locked out), `409` for an agent of another node (given up here included).
async fn unlock(
    _: Admin,
    state: web::Data<ApiState>,
    key: web::Path<String>,
    body: web::Bytes,
) -> HttpResponse {
    match crate::server::api::UnlockBody::note(&body) {
        Ok(note) => lift_lockout(&state, &key, Lifting::Unlock(note)).await,
        Err(e) => error(e.status, e.message),
    }
}

/// The emergency clear is an unlock (the same rules).
async fn clear(_: Admin, state: web::Data<ApiState>, key: web::Path<String>) -> HttpResponse {
    lift_lockout(&state, &key, Lifting::Clear).await
}

/// A history reset unlocks a locked-out agent: the same rules then; a plain reset otherwise.
async fn reset_history(
    _: Admin,
    state: web::Data<ApiState>,
    key: web::Path<String>,
) -> HttpResponse {
    lift_lockout(&state, &key, Lifting::ResetHistory).await
}

async fn lift_lockout(state: &ApiState, key: &str, lifting: Lifting) -> HttpResponse {
    let cluster = cluster(state);
    let what = match lifting {
        Lifting::Unlock(_) => "unlock",
        Lifting::Clear => "clear",
        Lifting::ResetHistory => "reset",
    };
    if let Some(refused) = given_up(cluster, key, what) {
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
    let operator = crate::server::api::API_OPERATOR;
    let resetting = matches!(lifting, Lifting::ResetHistory);
    let local = {
        let agent = agent.clone();
        async move {
            match lifting {
                Lifting::Unlock(note) => agent.unlock_with_note(operator, note).await,
                Lifting::Clear => agent.clear_emergency(operator).await,
                Lifting::ResetHistory => agent.reset_history(operator).await,
            }
        }
    };
    if resetting && !agent.status().emergency_stop {
        // Nothing to unlock: no cluster write.
        return match local.await {
            Ok(()) => HttpResponse::Ok().json(agent.status()),
            Err(control) => {
                let err = crate::server::api::ApiError::from(control);
                error(err.status, err.message)
            }
        };
    }
    let bound = cluster.config.halt_ack_timeout;
    match cluster.unlock(&agent, operator, bound, local).await {
        Ok(()) => HttpResponse::Ok().json(agent.status()),
        Err(Some(control)) => {
            let err = crate::server::api::ApiError::from(control);
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

/// Every local agent's live status with `"node"`, then every agent another node's lease names, with
/// the status of its last renewal.
async fn agents(_: Reader, state: web::Data<ApiState>) -> HttpResponse {
    let cluster = cluster(&state);
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
    let fleet = tokio::time::timeout(Duration::from_secs(2), cluster.fleet()).await;
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

/// `GET /api/cluster`: this node, its fail safe, the halt key as last read, the live nodes.
async fn status(_: Reader, state: web::Data<ApiState>) -> HttpResponse {
    let cluster = cluster(&state);
    // Not while cut off (it would only wait for its timeout): `null` then.
    let nodes = match cluster.fail.reason() {
        Some(_) => None,
        None => tokio::time::timeout(Duration::from_millis(500), cluster.nodes())
            .await
            .ok()
            .and_then(Result::ok),
    };
    let budget = cluster.budget_status(cluster.fail.reason().is_none()).await;
    HttpResponse::Ok().json(serde_json::json!({
        "node": cluster.node(),
        "url": cluster.config.shown_url(),
        "connected": cluster.connected(),
        "halt_epoch": cluster.epoch(),
        "halt": cluster.halt_state(),
        "fail_safe": cluster.fail.reason(),
        "fail_safe_since_ms": cluster.fail.since_ms(),
        "heartbeat_age_ms": u64::try_from(cluster.fail.silence().as_millis()).unwrap_or(u64::MAX),
        "owned": cluster.owned.lock().keys().collect::<Vec<_>>(),
        "elsewhere": *cluster.elsewhere.lock(),
        "lockouts": cluster.lockouts(),
        "peers": *cluster.peers.lock(),
        "nodes": nodes,
        "budget": budget,
        "delegations": {
            "received": cluster.delegation_counts().0,
            "ran": cluster.delegation_counts().1,
            "recovered": cluster.delegation_counts().2,
        },
    }))
}

/// The cluster's `/metrics` families.
pub(crate) fn metrics(cluster: &Cluster) -> String {
    let node = cluster.node();
    let mut out = String::new();
    let mut family = |name: &str, kind: &str, help: &str, value: String| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        let _ = writeln!(out, "{name}{{node=\"{node}\"}} {value}");
    };
    family(
        "warden_cluster_fail_safe",
        "gauge",
        "1 while this node starts no model call (cut off from JetStream).",
        u8::from(cluster.fail.reason().is_some()).to_string(),
    );
    family(
        "warden_cluster_fail_safe_entered_total",
        "counter",
        "How many times the fail safe came on.",
        cluster.fail.entered.load(Ordering::Relaxed).to_string(),
    );
    family(
        "warden_cluster_heartbeat_age_seconds",
        "gauge",
        "Seconds since the last successful heartbeat to JetStream.",
        format!("{:.3}", cluster.fail.silence().as_secs_f64()),
    );
    family(
        "warden_cluster_halt_epoch",
        "gauge",
        "The cluster halt epoch this node has applied.",
        cluster.epoch().to_string(),
    );
    family(
        "warden_cluster_connected",
        "gauge",
        "1 while the NATS connection is up.",
        u8::from(cluster.connected()).to_string(),
    );
    family(
        "warden_cluster_agents_owned",
        "gauge",
        "Agents whose lease this node holds.",
        cluster.owned.lock().len().to_string(),
    );
    out
}

impl Cluster {
    /// Whether the NATS connection is up now.
    pub fn connected(&self) -> bool {
        self.client.connection_state() == async_nats::connection::State::Connected
    }
}
