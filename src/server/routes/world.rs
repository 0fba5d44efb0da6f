//! A game server's world: `POST /api/agents/{key}/world`, `POST /api/world/batch`,
//! `POST /api/world/presence`, `POST /api/world/clock`.

use crate::server::api::*;
use actix_web::{http::StatusCode, web, HttpResponse};
use serde::Deserialize;

/// `POST /api/agents/{key}/world`: an NPC perceives a world event (`AgentHandle::perceive`): 200
/// with the perception (verdict, rule, trust) and, for a TRIGGER, the id of the user event it was
/// queued as; a TRIGGER the agent refuses is answered like a refused event. The 200 comes once the
/// queued TRIGGER, or an observation admitted for long-term memory, is on disk.
pub(crate) async fn post_world(
    _: Host,
    state: web::Data<ApiState>,
    key: web::Path<String>,
    event: web::Json<warden_protocols::npc::WorldEvent>,
) -> Handled {
    let agent = state.agent(&key)?;
    match agent.perceive(event.into_inner()) {
        Ok(seen) => {
            // A TRIGGER is queued as a user event: its id is acknowledged once that is on disk,
            // as `POST …/events` acknowledges one.
            if let Some(id) = seen.queued {
                if let Err(cause) = agent.durable_so_far().await {
                    return Ok(not_durable_event(&key, id, "queued", &cause));
                }
            } else if seen.observed {
                // A perception kept for long-term memory is acknowledged once on disk too.
                if let Err(cause) = agent.durable_so_far().await {
                    let error =
                        format!("the perception was kept for memory but is not durable: {cause}");
                    tracing::error!(agent = %key.as_str(), "{error}");
                    return Ok(HttpResponse::InternalServerError()
                        .json(serde_json::json!({ "error": error })));
                }
            }
            Ok(HttpResponse::Ok().json(serde_json::json!({
                "perception": seen.perception,
                "id": seen.queued,
            })))
        }
        Err(err) => Ok(refused(&err.refusal)),
    }
}

/// One item of `POST /api/world/batch`: the NPC's key and the body of
/// `POST /api/agents/{key}/world`.
#[derive(Debug, Deserialize)]
pub(crate) struct BatchItem {
    /// The NPC that perceives the event.
    npc: String,
    #[serde(flatten)]
    event: warden_protocols::npc::WorldEvent,
}

/// The body of `POST /api/world/batch`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct BatchBody {
    events: Vec<BatchItem>,
}

/// `POST /api/world/batch`: many world events, for many NPCs, in one request — a game server's
/// tick. The whole batch is checked first (at most [`ApiConfig::max_batch_events`] events, `413`
/// beyond; every NPC known here, `404`/`409` naming the first that is not): a refused batch
/// delivers nothing. Then each event is perceived in order, as `POST /api/agents/{key}/world`
/// perceives one, and the answer waits for one durable commit covering every queued TRIGGER and
/// every observation admitted for long-term memory.
/// `200 {"results": [...]}`, one per event in order: `{"npc", "perception", "id"}` (the id of the
/// user event a TRIGGER was queued as, else null) or `{"npc", "error", "refusal"}` for a TRIGGER
/// the agent refused (locked out, stopped, mailbox full, …). `500` with the results when the
/// queued events could not be made durable.
pub(crate) async fn post_world_batch(
    _: Host,
    state: web::Data<ApiState>,
    body: web::Json<BatchBody>,
) -> Handled {
    let events = body.into_inner().events;
    let limit = state.config.batch_limit();
    if events.len() > limit {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "{} events in one batch: at most {limit} (api.max_batch_events); send the rest \
                 in another batch",
                events.len()
            ),
        ));
    }
    // Every NPC first: an invalid batch queues nothing.
    let mut agents = Vec::with_capacity(events.len());
    for (i, item) in events.iter().enumerate() {
        let agent = state
            .agent(&item.npc)
            .map_err(|err| ApiError::new(err.status, format!("events[{i}]: {}", err.message)))?;
        agents.push(agent);
    }
    let mut results = Vec::with_capacity(events.len());
    // One agent per key whose TRIGGER was queued or whose perception was kept for memory: they are
    // acknowledged once on disk.
    let mut queued: Vec<(String, Option<u64>, warden_actors::AgentHandle)> = Vec::new();
    for (item, agent) in events.into_iter().zip(agents) {
        let npc = item.npc;
        match agent.perceive(item.event) {
            Ok(seen) => {
                if (seen.queued.is_some() || seen.observed)
                    && !queued.iter().any(|(key, _, _)| *key == npc)
                {
                    queued.push((npc.clone(), seen.queued, agent));
                }
                results.push(serde_json::json!({
                    "npc": npc,
                    "perception": seen.perception,
                    "id": seen.queued,
                }));
            }
            Err(err) => results.push(serde_json::json!({
                "npc": npc,
                "error": err.refusal.to_string(),
                "refusal": err.refusal,
            })),
        }
    }
    // The journal commits in groups: the first wait covers every row appended before it, the
    // others find their rows on disk already.
    for (key, id, agent) in &queued {
        if let Err(cause) = agent.durable_so_far().await {
            let error = format!("events of the batch were queued but are not durable: {cause}");
            tracing::error!(agent = %key, ?id, "{error}");
            return Ok(HttpResponse::InternalServerError()
                .json(serde_json::json!({ "error": error, "results": results })));
        }
    }
    Ok(HttpResponse::Ok().json(serde_json::json!({ "results": results })))
}

/// The body of `POST /api/world/presence`: players per room, as the game server counts them.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PresenceBody {
    rooms: std::collections::BTreeMap<String, usize>,
}

/// `POST /api/world/presence`: the host reports how many players are in each room
/// (`Supervisor::set_presence`); an NPC whose room is reported empty goes idle. 200 with the
/// number of rooms reported and the game hour.
pub(crate) async fn post_presence(
    _: Host,
    state: web::Data<ApiState>,
    body: web::Json<PresenceBody>,
) -> Handled {
    let body = body.into_inner();
    for (room, players) in &body.rooms {
        state.supervisor.set_presence(room, *players);
    }
    Ok(HttpResponse::Ok().json(serde_json::json!({
        "rooms": body.rooms.len(),
        "game_hour": state.supervisor.game_hour(),
    })))
}

/// The body of `POST /api/world/clock`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ClockBody {
    hour: f64,
}

/// `POST /api/world/clock`: the host sets the game hour (`Supervisor::set_game_hour`); every
/// ticking NPC's sleep schedule is read again. 200 with the game hour; 400 outside 0 to 24.
pub(crate) async fn post_clock(
    _: Host,
    state: web::Data<ApiState>,
    body: web::Json<ClockBody>,
) -> Handled {
    let hour = body.hour;
    if !(0.0..24.0).contains(&hour) {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("hour {hour} is not a game hour from 0 to 24 (24 excluded)"),
        ));
    }
    state.supervisor.set_game_hour(hour);
    Ok(HttpResponse::Ok().json(serde_json::json!({
        "game_hour": state.supervisor.game_hour(),
    })))
}
