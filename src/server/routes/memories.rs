//! Long-term memory: `GET /api/agents/{key}/memories`, `DELETE /api/agents/{key}/memories/{id}`,
//! `DELETE /api/memories?about=…`.

use crate::server::api::*;
use actix_web::{http::StatusCode, web, HttpResponse};
use serde::{Deserialize, Serialize};

/// `GET /api/agents/{key}/memories` query: `q` (BM25 over the memories' text), `about` (a speaker
/// id: what was said by, is about or was asserted by it), `limit` (default 50, at most
/// [`warden_actors::memory::MAX_LISTED`]).
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoriesQuery {
    /// Words to rank by relevance (BM25); without it the newest come first.
    #[serde(default)]
    pub q: Option<String>,
    /// A speaker id: only memories about it, and its profile.
    #[serde(default)]
    pub about: Option<String>,
    /// The most memories answered.
    #[serde(default)]
    pub limit: Option<usize>,
}

/// `GET /api/agents/{key}/memories` answers `{"memories": [...], "profile": {...} | null}`.
#[derive(Debug, Serialize, Deserialize)]
pub struct MemoriesAnswer {
    /// The memories, most relevant (or newest) first.
    pub memories: Vec<warden_actors::memory::Memory>,
    /// The profile of `about`, when asked and known.
    pub profile: Option<warden_actors::memory::EntityProfile>,
}

pub(crate) async fn get_memories(
    _: Reader,
    state: web::Data<ApiState>,
    key: web::Path<String>,
    query: web::Query<MemoriesQuery>,
) -> Handled {
    let agent = state.agent(&key)?;
    let query = query.into_inner();
    let limit = query.limit.unwrap_or(50);
    let about = query.about.as_deref();
    Ok(HttpResponse::Ok().json(MemoriesAnswer {
        memories: agent.memories(query.q.as_deref(), about, limit),
        profile: about.and_then(|a| agent.profile(a)),
    }))
}

/// What a forget answers: the memories removed, by agent (`200` once journaled on disk).
#[derive(Debug, Serialize, Deserialize)]
pub struct Forgotten {
    /// Agent key → the ids removed from its memory.
    pub forgotten: std::collections::BTreeMap<String, Vec<u64>>,
}

pub(crate) fn not_durable(err: warden_actors::NotDurable) -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        format!("applied but not durable: {err}"),
    )
}

pub(crate) async fn delete_memory(
    _: Admin,
    state: web::Data<ApiState>,
    path: web::Path<(String, String)>,
) -> Handled {
    let (key, id) = path.into_inner();
    let agent = state.agent(&key)?;
    let id: u64 = id.parse().map_err(|_| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("invalid memory id `{id}`: a memory id is a number"),
        )
    })?;
    // Answered once the `memory_forgotten` is on disk (a 200 is never lost).
    let gone = agent
        .forget_durable(&[id], None, API_OPERATOR)
        .await
        .map_err(not_durable)?;
    if gone.is_empty() {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("agent {key} has no memory {id}"),
        ));
    }
    let forgotten = std::iter::once((key, gone)).collect();
    Ok(HttpResponse::Ok().json(Forgotten { forgotten }))
}

/// `DELETE /api/memories?about=PLAYER_ID` query.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AboutQuery {
    /// The speaker id to forget everywhere.
    pub about: String,
}

/// A player's right to be forgotten: every agent of this node forgets what it remembers about
/// `about` (said by it, about it, asserted by it) and its profile, each journaled as
/// `memory_forgotten` by the operator; answered once all of it is on disk.
pub(crate) async fn forget_about(
    _: Admin,
    state: web::Data<ApiState>,
    query: web::Query<AboutQuery>,
) -> Handled {
    let about = query.into_inner().about;
    if about.trim().is_empty() {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "`about` must name a speaker id",
        ));
    }
    let mut forgotten = std::collections::BTreeMap::new();
    for agent in state.supervisor.agents() {
        let gone = agent
            .forget_durable(&[], Some(&about), API_OPERATOR)
            .await
            .map_err(not_durable)?;
        if !gone.is_empty() {
            forgotten.insert(agent.key().to_string(), gone);
        }
    }
    Ok(HttpResponse::Ok().json(Forgotten { forgotten }))
}
