//! The fleet at a glance: `GET /api/fleet`, `GET /api/breakers/recent`.

use crate::server::api::*;
use actix_web::{http::StatusCode, web, HttpResponse};

/// `GET /api/fleet`: the console's header in one read — the team's tokens and cost against its
/// budgets, agents per state, model calls in flight, pending asks and the journal's health.
pub(crate) async fn fleet(_: Reader, state: web::Data<ApiState>) -> Handled {
    let statuses = state.supervisor.statuses();
    let mut states: std::collections::BTreeMap<String, usize> = Default::default();
    let mut turns_running = 0;
    for status in &statuses {
        let name = serde_json::to_value(status.state)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        *states.entry(name).or_default() += 1;
        if status.state == warden_protocols::AgentState::Executing {
            turns_running += 1;
        }
    }
    let llm_calls_in_flight: u64 = warden_actors::provider_limit_stats()
        .iter()
        .map(|l| l.in_flight)
        .sum();
    let degraded = state.supervisor.journal_degraded();
    Ok(HttpResponse::Ok().json(serde_json::json!({
        "fleet": state.supervisor.fleet_view(),
        "agents": statuses.len(),
        "states": states,
        "turns_running": turns_running,
        "llm_calls_in_flight": llm_calls_in_flight,
        "interventions_pending": state.bus.as_ref().map_or(0, |b| b.pending().len()),
        "journal": { "ok": degraded.is_none(), "degraded": degraded },
    })))
}

/// `GET /api/breakers/recent`: trips per breaker since start and the most recent trips and stops
/// (at most 64, newest first) with their messages; 503 when the team has no safety monitor.
pub(crate) async fn recent_trips(_: Reader, state: web::Data<ApiState>) -> Handled {
    let report = state.supervisor.safety_report().await.ok_or_else(|| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "this team's safety monitor is not running",
        )
    })?;
    let mut recent = report.recent;
    recent.reverse();
    Ok(HttpResponse::Ok().json(serde_json::json!({
        "trips": report.trips,
        "recent": recent,
    })))
}
