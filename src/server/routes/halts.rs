//! Halts: `POST /api/halt`, `POST /api/resume` (the lift of the fleet halt),
//! `POST /api/agents/{key}/halt`.

use crate::server::api::*;
use actix_web::{http::StatusCode, web, HttpResponse};
use serde::{Deserialize, Serialize};
use warden_actors::HaltAck;
use warden_protocols::HaltCause;

/// One halt acknowledgement, as JSON.
#[derive(Serialize, Deserialize, Debug, PartialEq)]
pub struct HaltAckBody {
    /// The halted agent's key.
    pub agent: String,
    /// Its state after the halt: `STOPPED`, or `SAFETY_LOCKOUT` for a locked-out agent (a halt
    /// never lifts a lockout).
    pub state: warden_protocols::AgentState,
    /// How many ordinary messages the halt cleared from its mailbox (each journaled).
    pub discarded: u64,
}

/// `200 {"halted": […]}`; `503 {"error": "halt applied but not durable: …", "halted": […]}` when
/// the journal could not make a halt durable (it is applied all the same: fail safe).
pub(crate) fn acks(acks: Vec<HaltAck>) -> HttpResponse {
    let not_durable = acks.iter().find_map(|a| {
        a.not_durable
            .as_ref()
            .map(|cause| (a.agent.clone(), cause.clone()))
    });
    let halted: Vec<HaltAckBody> = acks
        .into_iter()
        .map(|a| HaltAckBody {
            agent: a.agent.to_string(),
            state: a.state,
            discarded: a.discarded,
        })
        .collect();
    match not_durable {
        None => HttpResponse::Ok().json(serde_json::json!({ "halted": halted })),
        Some((agent, cause)) => {
            tracing::error!(%agent, "halt applied but not durable: {cause}");
            HttpResponse::ServiceUnavailable().json(serde_json::json!({
                "error": format!("halt applied but not durable: {cause}"),
                "halted": halted,
            }))
        }
    }
}

/// `POST /api/halt`: every agent (on a cluster node, every node's: [`crate::server::cluster`]).
pub(crate) async fn halt_all(who: Host, state: web::Data<ApiState>) -> Handled {
    if let Some(cluster) = state.cluster.clone() {
        return Ok(crate::server::routes::cluster::halt(&who, &state, cluster).await);
    }
    let started = tokio::time::Instant::now();
    let result = state.supervisor.halt_all().await;
    state.metrics.halt_all.observe(started.elapsed());
    Ok(acks(result))
}

/// `POST /api/resume` body (optional): `{"reason": "…"}`, journaled with every resume the lift
/// makes. Other fields are ignored.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct LiftBody {
    /// Why the operator lifts the fleet halt (free text; blank counts as none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl LiftBody {
    /// Reads an optional body (empty or whitespace: none).
    pub(crate) fn read(body: &[u8]) -> Result<LiftBody, ApiError> {
        if body.iter().all(u8::is_ascii_whitespace) {
            return Ok(LiftBody::default());
        }
        serde_json::from_slice(body)
            .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("malformed JSON: {e}")))
    }

    /// The operator journaled with each resume: `api:admin (lift of the fleet halt: REASON)`.
    pub(crate) fn operator(&self, what: &str) -> String {
        match self
            .reason
            .as_deref()
            .map(str::trim)
            .filter(|r| !r.is_empty())
        {
            Some(reason) => format!("{API_OPERATOR} ({what}: {reason})"),
            None => format!("{API_OPERATOR} ({what})"),
        }
    }
}

/// The outcomes of a lift as JSON lists: `resumed` (keys), `kept` (`{agent, why}`).
pub(crate) fn lift_lists(
    outcomes: &[warden_actors::LiftOutcome],
    node: Option<&str>,
) -> (Vec<serde_json::Value>, Vec<serde_json::Value>) {
    let mut resumed = Vec::new();
    let mut kept = Vec::new();
    for o in outcomes {
        let mut item = serde_json::json!({ "agent": o.agent });
        if let (Some(node), Some(map)) = (node, item.as_object_mut()) {
            map.insert("node".into(), node.into());
        }
        if o.resumed {
            if !o.kept.is_empty() {
                item["warning"] = o.kept.clone().into();
            }
            resumed.push(item);
        } else {
            item["why"] = o.kept.clone().into();
            kept.push(item);
        }
    }
    (resumed, kept)
}

/// `POST /api/resume`: lifts the standing fleet halt (`POST /api/halt`'s): resumes the agents it
/// stopped, except those locked out, stopped by a breaker, paused, or halted again since. `409`
/// when no fleet halt stands.
pub(crate) async fn lift_halt(_: Admin, state: web::Data<ApiState>, body: web::Bytes) -> Handled {
    let body = LiftBody::read(&body)?;
    if let Some(cluster) = state.cluster.clone() {
        let reason = body.reason.as_deref().map(str::trim).unwrap_or_default();
        return Ok(crate::server::routes::cluster::lift(cluster, reason).await);
    }
    let operator = body.operator("lift of the fleet halt");
    let Some(outcomes) = state.supervisor.resume_fleet_halt(&operator).await else {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "no fleet halt stands (POST /api/halt makes one): nothing to lift",
        ));
    };
    let (resumed, kept) = lift_lists(&outcomes, None);
    Ok(HttpResponse::Ok().json(serde_json::json!({ "resumed": resumed, "kept": kept })))
}

/// `POST /api/agents/{key}/halt`. On a cluster node, an agent of another node is halted there
/// ([`crate::server::routes::cluster::halt_elsewhere`]); one of this node has its lease rewritten at once
/// (an adopter keeps it halted if this node dies).
pub(crate) async fn halt_agent(
    who: Host,
    state: web::Data<ApiState>,
    key: web::Path<String>,
) -> Handled {
    let Some(cluster) = state.cluster.clone() else {
        return halt_here(&who, &state, &key).await;
    };
    if let Some(answer) =
        crate::server::routes::cluster::halt_elsewhere(&who, &state, cluster.as_ref(), &key).await
    {
        return Ok(answer);
    }
    let halted = halt_here(&who, &state, &key).await;
    cluster.write_lease_now(&key).await;
    halted
}

/// Halts this node's agent `key`.
pub(crate) async fn halt_here(who: &Host, state: &ApiState, key: &str) -> Handled {
    let cause = HaltCause::Operator {
        operator: who.operator().into(),
    };
    let started = tokio::time::Instant::now();
    let result = state
        .supervisor
        .halt(key, cause)
        .await
        .map_err(|_| state.unknown_agent(key))?;
    state.metrics.halt_agent.observe(started.elapsed());
    Ok(acks(result))
}
