//! Operator controls of one agent: unlock, pause, resume, emergency clear, history reset.

use crate::server::api::*;
use crate::server::routes::cluster::{lift_lockout, Lifting};
use actix_web::{http::StatusCode, web, HttpResponse};
use serde::{Deserialize, Serialize};
use std::future::Future;
use warden_actors::ControlError;

/// Runs an operator control on an agent and answers with its new status.
pub(crate) async fn control<F, Fut>(state: &ApiState, key: &str, op: F) -> Handled
where
    F: FnOnce(warden_actors::AgentHandle) -> Fut,
    Fut: Future<Output = Result<(), ControlError>>,
{
    let agent = state.agent(key)?;
    op(agent.clone()).await?;
    Ok(HttpResponse::Ok().json(agent.status()))
}

/// `POST /api/agents/{key}/unlock` body (optional): `{"reason": "…"}`, journaled as the
/// `unlocked` event's `note`. Other fields are ignored (the route took no body before it had this
/// one, and ignored whatever was sent).
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct UnlockBody {
    /// Why the operator unlocks (free text; blank counts as none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl UnlockBody {
    /// The note a request's body gives (`None`: no body, no reason, or a blank one).
    ///
    /// # Errors
    /// `400` when the body is not such JSON.
    pub(crate) fn note(body: &[u8]) -> Result<Option<String>, ApiError> {
        if body.iter().all(u8::is_ascii_whitespace) {
            return Ok(None);
        }
        let body: UnlockBody = serde_json::from_slice(body)
            .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("malformed JSON: {e}")))?;
        Ok(body
            .reason
            .map(|r| r.trim().to_owned())
            .filter(|r| !r.is_empty()))
    }
}

pub(crate) async fn unlock(
    _: Admin,
    state: web::Data<ApiState>,
    key: web::Path<String>,
    body: web::Bytes,
) -> Handled {
    if let Some(cluster) = &state.cluster {
        let note = UnlockBody::note(&body)?;
        return Ok(lift_lockout(&state, cluster.as_ref(), &key, Lifting::Unlock(note)).await);
    }
    if state.supervisor.get(&key).is_none() {
        return Err(state.unknown_agent(&key));
    }
    let note = UnlockBody::note(&body)?;
    control(&state, &key, |a| async move {
        a.unlock_with_note(API_OPERATOR, note).await
    })
    .await
}

/// `POST /api/agents/{key}/pause`; on a cluster node the lease is rewritten at once (an adopter
/// brings the agent up paused if this node dies).
pub(crate) async fn pause(_: Admin, state: web::Data<ApiState>, key: web::Path<String>) -> Handled {
    let paused = control(&state, &key, |a| async move { a.pause(API_OPERATOR).await }).await;
    if let Some(cluster) = state.cluster.clone() {
        cluster.write_lease_now(&key).await;
    }
    paused
}

/// `POST /api/agents/{key}/resume`; on a cluster node refused (`409`) for an agent this node gave
/// up, and the lease is rewritten at once (an adopter brings it up running if this node dies).
pub(crate) async fn resume(
    _: Admin,
    state: web::Data<ApiState>,
    key: web::Path<String>,
) -> Handled {
    if let Some(cluster) = &state.cluster {
        if let Some(refused) =
            crate::server::routes::cluster::refuse_resume(&state, cluster.as_ref(), &key)
        {
            return Ok(refused);
        }
    }
    let resumed = control(
        &state,
        &key,
        |a| async move { a.resume(API_OPERATOR).await },
    )
    .await;
    if let Some(cluster) = state.cluster.clone() {
        cluster.write_lease_now(&key).await;
    }
    resumed
}

/// `POST /api/agents/{key}/emergency/clear` (on a cluster node, an unlock through the cluster).
pub(crate) async fn clear(_: Admin, state: web::Data<ApiState>, key: web::Path<String>) -> Handled {
    if let Some(cluster) = &state.cluster {
        return Ok(lift_lockout(&state, cluster.as_ref(), &key, Lifting::Clear).await);
    }
    control(&state, &key, |a| async move {
        a.clear_emergency(API_OPERATOR).await
    })
    .await
}

/// `POST /api/agents/{key}/history/reset` (on a cluster node, of a locked-out agent, an unlock
/// through the cluster).
pub(crate) async fn reset_history(
    _: Admin,
    state: web::Data<ApiState>,
    key: web::Path<String>,
) -> Handled {
    if let Some(cluster) = &state.cluster {
        return Ok(lift_lockout(&state, cluster.as_ref(), &key, Lifting::ResetHistory).await);
    }
    control(&state, &key, |a| async move {
        a.reset_history(API_OPERATOR).await
    })
    .await
}
