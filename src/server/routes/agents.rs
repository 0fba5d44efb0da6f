//! Agents: `GET /api/agents`, `GET /api/agents/{key}`, `PUT /api/agents/{key}/goals`, and
//! `GET /api/cluster` (this node's view of its cluster).

use crate::server::api::*;
use actix_web::{http::StatusCode, web, HttpResponse};
use serde::{Deserialize, Serialize};

/// `GET /api/cluster`: this node's view of its cluster; `404` on a server that is not a cluster
/// node.
pub(crate) async fn cluster_status(_: Reader, state: web::Data<ApiState>) -> Handled {
    let cluster = state.cluster.as_ref().ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "this server is not a cluster node (no [cluster] in its team file, no --cluster)",
        )
    })?;
    Ok(HttpResponse::Ok().json(cluster.status().await))
}

/// `GET /api/agents`: every agent's status (on a cluster node, the whole fleet's, each with its
/// node).
pub(crate) async fn list_agents(_: Reader, state: web::Data<ApiState>) -> Handled {
    if let Some(cluster) = &state.cluster {
        return Ok(crate::server::routes::cluster::agents(&state, cluster.as_ref()).await);
    }
    Ok(HttpResponse::Ok().json(state.supervisor.statuses()))
}

/// `GET /api/agents/{key}`: its status (on a cluster node with `"node"`; another node's agent
/// as its last lease renewal wrote it).
pub(crate) async fn get_agent(
    _: Reader,
    state: web::Data<ApiState>,
    key: web::Path<String>,
) -> Handled {
    if let Some(cluster) = &state.cluster {
        if let Some(answer) =
            crate::server::routes::cluster::agent(&state, cluster.as_ref(), &key).await
        {
            return Ok(answer);
        }
    }
    let agent = state.agent(&key)?;
    Ok(HttpResponse::Ok().json(agent.status()))
}

/// `PUT /api/agents/{key}/goals` body: `{"goals": ["…", …]}`, the whole new list (empty clears it).
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GoalsBody {
    /// The new goals, most important first: at most [`warden_protocols::MAX_GOALS`], each not
    /// blank and at most [`warden_protocols::MAX_GOAL_CHARS`] characters.
    pub goals: Vec<String>,
}

pub(crate) async fn set_goals(
    _: Admin,
    state: web::Data<ApiState>,
    key: web::Path<String>,
    body: web::Json<GoalsBody>,
) -> Handled {
    let agent = state.agent(&key)?;
    // Answered once the change is on disk, like the other controls (a 200 is never lost).
    agent
        .set_goals_durable(body.into_inner().goals, API_OPERATOR)
        .await
        .map_err(|err| {
            let status = match err {
                warden_actors::GoalsError::Invalid(_) => StatusCode::BAD_REQUEST,
                warden_actors::GoalsError::NotDurable(_) => StatusCode::SERVICE_UNAVAILABLE,
            };
            ApiError::new(status, err.to_string())
        })?;
    Ok(HttpResponse::Ok().json(agent.status()))
}
